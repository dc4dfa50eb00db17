"""``plan --survive-region-loss`` (``sim/survive.py``): from each system's planned placement, every region
in turn goes down through its peak hour, and replicas are added until the SLO holds for the requests sent
after the outage was noticed, whichever region is lost; bad outage flags are errors naming them."""

import json

import pytest

from ray_geolb.__main__ import main
from ray_geolb.sim.goodput import SLO
from ray_geolb.sim.survive import survive_region_loss

REGIONS = ("us", "eu", "asia")


def test_a_planned_placement_grows_until_it_survives_the_loss_of_any_one_region(tmp_path, capsys):
    out = tmp_path / "plan"
    rc = main(["plan", "--mean-rps", "30", "--day-s", "24", "--systems", "geoprefix", "--no-references",
               "--no-progress", "--survive-region-loss", "--outage-hour-s", "10", "--detect-s", "2",
               "--out", str(out)])
    assert rc == 0
    assert "surviving the loss of any one region" in capsys.readouterr().out
    p = json.loads((out / "plan.json").read_text())
    row = next(r for r in p["systems"] if r["system"] == "geoprefix")
    s = p["survive_region_loss"]["geoprefix"]
    assert row["met"] and s["survives"] and s["gpus"] == sum(s["replicas"].values())
    # it only adds to the plan's placement, and the plan alone did not survive: it had to add
    assert all(s["replicas"][r] >= row["replicas"][r] for r in REGIONS) and s["added"] > 0
    assert s["steps"][0]["replicas"] == row["replicas"]
    assert any(s["steps"][0]["losses"][r]["p99_after_s"] > 1.0 for r in REGIONS)
    for r in REGIONS:  # every loss survived, and what came before the failover was counted, not judged
        loss = s["losses"][r]
        assert loss["p99_after_s"] <= 1.0 and loss["attainment_after"] > 0.9 and loss["sent_detecting"] > 0


def test_a_placement_that_survives_is_kept_as_it_is():
    from ray_geolb.sim.plan import _base_run
    from ray_geolb.sim.workloads.geo_diurnal import load_demand

    demand, slo = load_demand("geo-diurnal-3", 4.0), SLO(1.0)
    placement = {"us": 2, "eu": 2, "asia": 2}

    def base(reps):
        return _base_run("keep", "region-local", reps, demand, 24.0, 1.0, "llama3.1-8b-h100", slo)

    s = survive_region_loss(base, placement, slo, [0], hour_s=10.0, detect_s=2.0)
    assert s["survives"] and s["replicas"] == placement and s["added"] == 0 and len(s["steps"]) == 1


@pytest.mark.parametrize("args, says", [
    (["--detect-s", "0"], "--detect-s"), (["--outage-hour-s", "-1"], "--outage-hour-s"),
    (["--detect-s", "30", "--outage-hour-s", "20"], "shorter than an outage hour"),
    (["--detect-s", "nan"], "--detect-s")])
def test_bad_outage_flags_are_errors_naming_them(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--day-s", "12", "--no-progress", "--survive-region-loss", *args])
    assert e.value.code == 2 and says in capsys.readouterr().err
