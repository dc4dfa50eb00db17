"""The open-loop diurnal demand, SLO goodput and the capacity planner: small cases,
determinism across parallelism, monotonicity in replicas, and clear errors on bad input."""

from __future__ import annotations

import json

import pytest

from ray_geolb.sim.goodput import SLO, goodput_many, slo_run, tail_s
from ray_geolb.sim.metrics import dumps
from ray_geolb.sim.plan import format_plan, plan
from ray_geolb.sim.workloads import by_name
from ray_geolb.sim.workloads.geo_diurnal import (
    DEFAULT_MIX,
    Demand,
    DemandCSVError,
    builtin_demand,
    load_demand_csv,
    servegen_day_shape,
)

SLO1 = SLO(1.0)
PROFILE = "llama3.1-8b-h100"


def _flat_run(replicas, day_s=12.0, system="region-local"):
    return {"label": f"flat-{sum(replicas.values())}", "system": system, "replicas": replicas,
            "workload": {"name": "geo-diurnal", "kw": {"curves": {"us": [1.0] * 24}, "day_s": day_s}},
            "sim": {"duration_s": day_s + tail_s(SLO1), "seed": 0}, "deploy": {"profile": PROFILE}}


# ------------------------------------------------------------------------------------------------ demand
def test_builtin_demand_peaks_at_each_regions_local_time():
    d = builtin_demand(48.0)
    shape = servegen_day_shape()
    local_peak = max(range(24), key=lambda h: shape[h])
    peaks = {r: max(range(24), key=lambda h: d.rates[r][h]) for r in d.regions}
    tz = d.meta["tz_offsets_h"]
    for r in d.regions:  # the UTC peak hour is the local peak hour shifted by the region's time zone
        assert (peaks[r] + int(tz[r])) % 24 == local_peak
    assert len(set(peaks.values())) == 3
    assert sum(sum(xs) for xs in d.rates.values()) / 24 == pytest.approx(48.0)
    assert d.peak() < sum(d.peak(r) for r in d.regions)  # pooling has something to gain


def test_workload_follows_the_curve_is_deterministic_and_states_the_compression():
    curves = {"us": [0.0] * 12 + [20.0] * 12, "eu": [10.0] * 24}
    a = by_name("geo-diurnal", curves=curves, day_s=24.0, seed=3)
    b = by_name("geo-diurnal", curves=curves, day_s=24.0, seed=3)
    assert [(t, p.program_id, p.calls[0].text) for t, p in a.open.arrivals] == \
        [(t, p.program_id, p.calls[0].text) for t, p in b.open.arrivals]
    us = [t for t, p in a.open.arrivals if p.region == "us"]
    eu = [t for t, p in a.open.arrivals if p.region == "eu"]
    assert us and min(us) >= 12.0  # no US demand in the first half of the day
    assert 240 * 0.6 < len(us) < 240 * 1.4 and 240 * 0.6 < len(eu) < 240 * 1.4  # 20 req/s x 12 s, 10 x 24 s
    assert "x3600" in a.description and a.meta["compression"] == 3600.0
    assert set(a.meta["counts"]) == set(DEFAULT_MIX) and all(v > 0 for v in a.meta["counts"].values())
    doubled = by_name("geo-diurnal", curves=curves, day_s=24.0, seed=3, multiplier=2.0)
    assert 1.6 < len(doubled.open.arrivals) / len(a.open.arrivals) < 2.4
    # conversation turns of a user extend each other: some request's text is a prefix of a later one's
    texts = [p.calls[0].text for _, p in a.open.arrivals if p.calls[0].tenant and p.calls[0].tenant.startswith("chat")]
    assert any(texts[j].startswith(texts[i][:200]) for i in range(40) for j in range(i + 1, len(texts)))


def test_keeping_one_region_keeps_its_requests_exactly_as_in_the_whole_day():
    whole = by_name("geo-diurnal", day_s=12.0, mean_rps=6.0, seed=1)
    eu = by_name("geo-diurnal", day_s=12.0, mean_rps=6.0, seed=1, keep_regions=["eu"])
    same = [(t, p.program_id, p.calls[0].text) for t, p in whole.open.arrivals if p.region == "eu"]
    assert same and same == [(t, p.program_id, p.calls[0].text) for t, p in eu.open.arrivals]
    with pytest.raises(ValueError, match="keep_regions"):
        by_name("geo-diurnal", day_s=12.0, keep_regions=["mars"])


def test_demand_csv_holds_a_rate_until_the_next_listed_hour(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("# my demand\nhour,region,rate\n0,us,2\n6,us,10\n18,us,4\n3,eu,5\n")
    d = load_demand_csv(p, ["us", "eu", "asia"])
    assert d.rates["us"][:6] == [2.0] * 6 and d.rates["us"][6:18] == [10.0] * 12 and d.rates["us"][18:] == [4.0] * 6
    assert d.rates["eu"] == [5.0] * 24  # one listed hour: all day
    assert d.regions == ["us", "eu"]


@pytest.mark.parametrize("body, field", [
    ("hour,region,rate\n25,us,1\n", "hour"),
    ("hour,region,rate\nnoon,us,1\n", "hour"),
    ("hour,region,rate\n1,us,-3\n", "rate"),
    ("hour,region,rate\n1,us,lots\n", "rate"),
    ("hour,region,rate\n1,mars,1\n", "region"),
    ("hour,region,rate\n1,us,1\n1,us,2\n", "hour"),
    ("hour,region,demand\n1,us,1\n", "header"),
    ("hour,region,rate\n1,us\n", "3 fields"),
    ("hour,region,rate\n1,us,0\n", "rate"),
])
def test_a_bad_demand_csv_names_the_line_and_field(tmp_path, body, field):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(DemandCSVError, match=field):
        load_demand_csv(p, ["us", "eu", "asia"])


# ------------------------------------------------------------------------------------------------ goodput
def test_slo_run_counts_every_sent_request_and_an_overload_misses():
    ok = slo_run({**_flat_run({"us": 1}), "slo": SLO1.to_dict()})
    assert ok["meets"] and ok["missed"] == 0 and ok["attainment"] == 1.0 and ok["sent"] > 0
    over = _flat_run({"us": 1})
    over["workload"]["kw"]["multiplier"] = 80.0
    bad = slo_run({**over, "slo": SLO1.to_dict()})
    assert not bad["meets"] and bad["attainment"] < 0.5


def test_goodput_search_brackets_its_answer_and_more_replicas_never_lower_it():
    res = goodput_many({"one": _flat_run({"us": 1}), "two": _flat_run({"us": 2})}, SLO1, seeds=[0, 1], start=8.0,
                       bisect_steps=2, progress=False)
    for name, g in res.items():
        assert g["min"] <= g["mean"] <= g["max"]
        for s, ps in g["per_seed"].items():
            gp = ps["goodput_multiplier"]
            assert gp > 0, name
            for m, t in ps["tried"].items():  # every tried load below the answer passed, above it failed
                assert t["meets"] == (float(m) <= gp), (name, s, m)
    for s in (0, 1):
        assert res["two"]["per_seed"][s]["goodput_multiplier"] >= res["one"]["per_seed"][s]["goodput_multiplier"]


# ------------------------------------------------------------------------------------------------ plan
def _small_plan(**kw):
    d = Demand({"us": [2.0] * 12 + [30.0] * 12, "eu": [30.0] * 12 + [2.0] * 12}, "test")
    return plan(d, SLO1, systems=["geoprefix", "region-local"], day_s=24.0, capacity=20.0, progress=False,
                max_replicas=8, **kw)


def test_plan_small_case_reports_gpus_savings_references_and_the_compression():
    p = _small_plan(prices={"us": 2.0, "eu": 3.0})
    rows = {r["system"]: r for r in p["systems"]}
    assert all(r["met"] for r in rows.values())
    rl = rows["region-local"]
    assert rl["gpus"] == sum(rl["replicas"].values()) and rl["gpu_hours_per_day"] == rl["gpus"] * 24
    assert rl["cost_per_day"] == pytest.approx(24 * (2.0 * rl["replicas"]["us"] + 3.0 * rl["replicas"]["eu"]))
    assert rl["gpu_savings_vs_region_local"] == 0.0
    refs = p["references"]
    assert "bounds" not in p and "not a bound" in refs["pooled_note"]
    assert set(refs["pooled"]) == set(rows)  # every system on the pool under its own policy
    for r in rows.values():  # a reference, not a proven bound: nothing here holds a plan to it
        assert r["pooled_reference_gpus"] == refs["pooled"][r["system"]] >= 1
        assert all(n >= 1 for n in r["replicas"].values())
    assert refs["sum_of_regional_peaks"] == sum(refs["sum_of_regional_peaks_per_region"].values())
    assert set(refs["sum_of_regional_peaks_lb"].values()) <= {"ray-prefix", "sgl"}
    assert p["compression"]["factor"] == 3600.0
    text = format_plan(p)
    assert "x3600" in text and "pooled ref" in text and "sum of regional peaks" in text
    assert "not bounds" in text and "bound (" not in text
    json.loads(dumps(p))


def test_the_pooled_reference_runs_each_systems_own_policy_on_one_zero_rtt_pool():
    from ray_geolb.sim.plan import _base_run, _reference_searches

    d = Demand({"us": [2.0] * 24, "eu": [4.0] * 24, "asia": [3.0] * 24}, "test")

    def run_of(label, system, reps, deploy, keep):
        return _base_run(label, system, reps, d, 12.0, 1.0, PROFILE, SLO1, deploy, keep)

    searches = _reference_searches(d, 20.0, ["geoprefix", "region-local", "ray-prefix"], ["sgl"], [0], 8, run_of)
    for s in ("geoprefix", "region-local", "ray-prefix"):
        (run,) = next(searches[f"ref:pooled:{s}"])
        assert run["system"] == s and list(run["replicas"]) == ["us"]
        assert "keep_regions" not in run["workload"]["kw"]  # the whole day's demand, every region's clients
        assert {ms for _, _, ms in run["deploy"]["network"]["rtt_ms"]} == {0.0}
    (run,) = next(searches["ref:peak:eu:sgl"])
    assert run["system"] == "sgl" and run["replicas"] == {"eu": 1} and run["workload"]["kw"]["keep_regions"] == ["eu"]


def test_plan_cli_writes_table_json_and_png(tmp_path, capsys):
    from ray_geolb.__main__ import main

    out = tmp_path / "plan"
    rc = main(["plan", "--mean-rps", "8", "--day-s", "24", "--capacity", "20", "--systems", "geoprefix,region-local",
               "--price", "us=2,eu=3,asia=4", "--no-bounds", "--no-progress", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "region-local" in printed and "x3600" in printed
    data = json.loads((out / "plan.json").read_text())
    assert [r["system"] for r in data["systems"]] == ["geoprefix", "region-local"]
    assert (out / "plan.png").stat().st_size > 0


@pytest.mark.parametrize("argv, flag", [
    (["--ttft-slo", "-1"], "--ttft-slo"),
    (["--tpot-slo", "0"], "--tpot-slo"),
    (["--price", "us=cheap"], "--price"),
    (["--price", "mars=2"], "--price"),
    (["--systems", "geoprefix,nope"], "--systems"),
    (["--systems", "bp"], "--systems"),
    (["--profile", "nope"], "--profile"),
    (["--seeds", "a,b"], "--seeds"),
    (["--demand", "no-such-demand"], "--demand"),
    (["--demand", "BAD_CSV"], "field 'rate'"),
    (["--demand", "GOOD_CSV", "--mean-rps", "3"], "--mean-rps"),
    (["--day-s", "0"], "--day-s"),
    (["--max-replicas", "1"], "--max-replicas"),
    (["--pool-lbs", "geoprefix"], "--pool-lbs"),
])
def test_plan_cli_bad_input_is_an_error_naming_the_field(tmp_path, capsys, argv, flag):
    from ray_geolb.__main__ import main

    bad, good = tmp_path / "bad.csv", tmp_path / "good.csv"
    bad.write_text("hour,region,rate\n0,us,1\n5,us,x\n")
    good.write_text("hour,region,rate\n0,us,1\n")
    argv = [str(bad) if a == "BAD_CSV" else str(good) if a == "GOOD_CSV" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        main(["plan", "--capacity", "20", "--day-s", "12", "--no-progress", *argv])
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ Ray
@pytest.fixture(scope="module")
def local_ray():
    import ray

    from ray_geolb.serve.local import start_local_ray
    from repo import REPO

    start_local_ray(num_cpus=2, prefix="rplan", runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    ray.shutdown()


@pytest.mark.ray
def test_plan_on_ray_is_byte_identical_to_the_local_run(local_ray):
    local = _small_plan(seeds=[0, 1])
    on_ray = _small_plan(seeds=[0, 1], ray=True)  # the running local cluster
    for p in (local, on_ray):
        p.pop("_wall_s")
        p.pop("_timing")  # wall seconds: what the plan cost, not its result
    assert dumps(on_ray) == dumps(local)


def test_goodput_cli_prints_the_spread_and_writes_json(tmp_path, capsys):
    from ray_geolb.__main__ import main

    out = tmp_path / "gp"
    rc = main(["goodput", "--mean-rps", "8", "--day-s", "12", "--regions", "us=1,eu=1,asia=1", "--systems",
               "region-local", "--seeds", "0", "--bisect-steps", "1", "--no-progress", "--out", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    assert "x3600" not in captured.out  # 12 s day: x7200
    data = json.loads((out / "goodput.json").read_text())
    g = data["systems"]["region-local"]["goodput"]
    assert g["min"] == g["max"] > 0 and data["compression"]["factor"] == 7200.0
    # what the search cost per system is printed and kept (its value varies with the machine)
    cost = data["timing"]["per_system"]["region-local"]["search"]
    assert cost["runs"] > 0 and "run_s" in cost and set(data["timing"]["estimate_wall_s"]) == {"2", "16"}
    assert "wall per system" in captured.err


@pytest.mark.parametrize("argv, flag", [
    (["--regions", "us=x"], "--regions"),
    (["--regions", "mars=1"], "--regions"),
    (["--systems", "nope"], "--systems"),
    (["--ttft-slo", "0"], "--ttft-slo"),
    (["--at", "-2"], "--at"),
])
def test_goodput_cli_bad_input_is_an_error_naming_the_field(capsys, argv, flag):
    from ray_geolb.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["goodput", "--no-progress", *argv])
    assert e.value.code == 2
    assert flag in capsys.readouterr().err
