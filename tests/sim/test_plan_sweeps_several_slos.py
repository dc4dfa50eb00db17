"""``plan --ttft-slo 0.5,1``: one plan per SLO and a table of GPUs per system per SLO, with a system that
meets an SLO at no count marked as such; a bad SLO in the list is an error naming ``--ttft-slo``."""

import json

import pytest

from ray_geolb.__main__ import main


def test_an_slo_sweep_writes_one_plan_per_slo_and_the_table(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["plan", "--mean-rps", "8", "--day-s", "24", "--capacity", "20", "--systems", "geoprefix,region-local",
               "--no-bounds", "--no-progress", "--ttft-slo", "0.5,1", "--max-replicas", "6", "--out", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "GPUs per system per SLO" in printed
    assert "wall seconds per system per SLO" in captured.err  # what each cell cost, printed
    table = (out / "sweep.txt").read_text().splitlines()
    assert "P99 TTFT <= 0.5 s" in table[0] and "P99 TTFT <= 1 s" in table[0]
    sweep = json.loads((out / "sweep.json").read_text())
    assert [p["slo"]["ttft_s"] for p in sweep["plans"]] == [0.5, 1.0]
    for p, slo in zip(sweep["plans"], ("0.5", "1")):
        assert (out / f"plan_slo{slo}.json").exists()
        # each system's wall time at this SLO and demand is kept beside the plan (its value is not checked)
        assert p["demand"]["source"] and set(p["timing"]["per_system"]) == {"geoprefix", "region-local"}
        assert all(part["runs"] > 0 and "run_s" in part for part in p["timing"]["per_system"]["geoprefix"].values())
        for row in p["systems"]:
            line = next(x for x in table if x.startswith(row["system"]))
            # every cell is the plan's GPU count, or says no count up to --max-replicas met the SLO
            assert (str(row["gpus"]) in line) if row.get("gpus") else ("none <= 6" in line)


@pytest.mark.parametrize("spec, says", [("1,0", "> 0"), ("0.5,fast", "not a number"), ("1,1", "twice"),
                                        ("1,inf", "> 0")])
def test_a_bad_slo_in_the_list_is_an_error_naming_the_flag(spec, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--capacity", "20", "--day-s", "12", "--no-progress", "--ttft-slo", spec])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--ttft-slo" in err and says in err


def test_a_tpot_slo_no_count_meets_is_marked_and_shown(tmp_path, capsys):
    out = tmp_path / "tpot"
    rc = main(["plan", "--mean-rps", "8", "--day-s", "12", "--capacity", "20", "--systems", "region-local",
               "--no-references", "--no-progress", "--ttft-slo", "1", "--tpot-slo", "0.0001", "--max-replicas", "4",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "P99 TPOT <= 0.0001 s" in printed and "P99 TPOT s" in printed
    (row,) = json.loads((out / "plan.json").read_text())["systems"]
    assert not row["met"] and "--max-replicas" in row["note"]
    assert all(h["p99_tpot_s"] is None or h["p99_tpot_s"] > 0.0001 for h in row["history"]) and row["history"]


@pytest.mark.parametrize("flag, value, says", [("--tpot-slo", "0", "> 0"), ("--tpot-slo", "fast", "invalid float"),
                                               ("--tpot-slo", "nan", "> 0"), ("--ttft-slo", "", "not a number")])
def test_a_bad_tpot_slo_is_an_error_naming_the_flag(flag, value, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--capacity", "20", "--day-s", "12", "--no-progress", flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and says in err
