"""``goodput`` as curves: several SLOs in one run share their simulations and give the answers each SLO's own
search gives; six bisections narrow a x2 bracket to about 1 %; every point a search ran is on the seed's
curve; a difference inside the search's resolution or the seeds' spread is a tie; P99 TPOT is an SLO too;
bad SLOs are errors naming their flag."""

from __future__ import annotations

import json

import pytest

from ray_geolb.sim.goodput import SLO, _Bracket, _goodput_search, run_lockstep, slo_run, tail_s
from ray_geolb.sim.goodput_report import compare

PROFILE = "llama3.1-8b-h100"


def _flat_run(day_s=6.0, replicas=None):
    return {"label": "flat", "system": "region-local", "replicas": replicas or {"us": 1},
            "workload": {"name": "geo-diurnal", "kw": {"curves": {"us": [1.0] * 24}, "day_s": day_s}},
            "sim": {"duration_s": day_s + tail_s(SLO(1.0)), "seed": 0}, "deploy": {"profile": PROFILE}}


def _search(slos, seeds=(0,), bisect_steps=2, at=None):
    g = _goodput_search({**_flat_run(), "slo": slos[0].to_dict()}, list(seeds), 8.0, 6, bisect_steps, slos, at=at)
    return run_lockstep({"s": g}, progress=False)["s"]


def test_six_bisections_narrow_a_doubling_bracket_to_about_one_percent():
    b = _Bracket(1.0, 10, 6)
    true = 2.9  # a system that meets the SLO up to x2.9
    while (m := b.next_m()) is not None:
        b.feed(m, {"meets": m <= true, "p99_ttft_s": 0.5, "p99_tpot_s": None, "attainment": 1.0})
    a = b.answer()
    assert a["goodput_multiplier"] <= true < a["first_fail"]
    assert a["resolution"] == pytest.approx(a["first_fail"] / a["goodput_multiplier"] - 1)
    assert a["resolution"] < 0.015  # 2 ** (1 / 64) - 1 = 1.09 %, plus the 3-digit grid
    assert len(a["tried"]) == 3 + 6  # x1, x2 pass; x4 fails; then six bisections


def test_an_slo_sweep_shares_its_runs_and_each_slo_gets_its_own_answer():
    slos = [SLO(0.4), SLO(1.0)]
    both = _search(slos, at=1.0)
    alone = [_search([s])["by_slo"][0] for s in slos]
    for got, want in zip(both["by_slo"], alone):
        assert got["per_seed"] == want["per_seed"]  # sharing runs changes no answer
    points = both["curve"][0]
    tried = {float(m) for g in alone for m in g["per_seed"][0]["tried"]}
    assert len(points) < sum(len(g["per_seed"][0]["tried"]) for g in alone) + 1  # shared, not rerun
    assert {p["multiplier"] for p in points} == tried | {1.0}
    for p in points:  # each point is judged at every SLO; a tighter SLO never passes where a looser fails
        assert len(p["attainment"]) == len(p["meets"]) == 2
        assert p["meets"][1] or not p["meets"][0]
        assert p["attainment"][0] <= p["attainment"][1]
    for k, g in enumerate(both["by_slo"]):  # the curve holds every tried point's figures
        for m, t in g["per_seed"][0]["tried"].items():
            p = next(p for p in points if p["multiplier"] == float(m))
            assert (p["meets"][k], p["p99_ttft_s"]) == (t["meets"], t["p99_ttft_s"])
    assert both["at"][0]["multiplier"] == 1.0


def _per_seed(values, width=0.011):
    return {s: {"goodput_multiplier": g, "first_fail": round(g * (1 + width), 3), "resolution": width}
            for s, g in enumerate(values)}


@pytest.mark.parametrize("ours, theirs, width, verdict", [
    ([2.90, 2.91, 2.89, 2.90], [2.83, 2.84, 2.83, 2.82], 0.011, "win"),    # 2.5 % apart, brackets apart
    ([2.83, 2.84, 2.83, 2.82], [2.90, 2.91, 2.89, 2.90], 0.011, "loss"),
    ([2.90, 2.91, 2.89, 2.90], [2.83, 2.84, 2.83, 2.82], 0.09, "tie"),     # the same inside a x1.09 bracket
    ([3.20, 2.50, 3.30, 2.70], [2.83, 2.84, 2.83, 2.82], 0.011, "tie"),    # inside the seeds' spread
])
def test_a_difference_inside_the_resolution_or_the_seed_spread_is_a_tie(ours, theirs, width, verdict):
    c = compare(_per_seed(ours, width), _per_seed(theirs, width), [0, 1, 2, 3])
    assert c["verdict"] == verdict, c
    assert c["margin"] >= width and c["resolution"] == width


def test_on_two_held_out_seeds_a_win_needs_every_seed():
    a, b = _per_seed([2.90, 2.83]), _per_seed([2.83, 2.83])
    c = compare(a, b, [0, 1])
    assert c["tally"] == {"win": 1, "tie": 1, "loss": 0} and c["verdict"] == "tie" and "per seed" in c["basis"]
    assert compare(_per_seed([2.9, 2.9]), b, [0, 1])["verdict"] == "win"


def test_tpot_is_after_the_first_token_and_a_tight_tpot_slo_fails_the_run():
    run = _flat_run()
    loose = slo_run({**run, "slos": [SLO(1.0).to_dict(), SLO(1.0, 1e-4).to_dict()]})
    ok, tight = loose["by_slo"]
    assert ok["meets"] and ok["p99_tpot_s"] == tight["p99_tpot_s"] > 1e-4
    assert not tight["meets"] and tight["attainment"] < ok["attainment"]
    assert ok["p99_ttft_s"] == tight["p99_ttft_s"]


def test_goodput_cli_sweeps_slos_and_writes_curves_verdicts_and_a_plot(tmp_path, capsys):
    from ray_geolb.__main__ import main

    out = tmp_path / "gp"
    rc = main(["goodput", "--mean-rps", "8", "--day-s", "6", "--regions", "us=1,eu=1,asia=1", "--systems",
               "region-local,geoprefix", "--seeds", "0", "--held-out-seeds", "1", "--ttft-slo", "0.5,1",
               "--tpot-slo", "0.2", "--start", "4", "--bisect-steps", "1", "--no-progress", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "goodput x per system per SLO" in printed and "curves at P99 TTFT <= 0.5 s, P99 TPOT <= 0.2 s" in printed
    data = json.loads((out / "goodput.json").read_text())
    assert [s["ttft_s"] for s in data["slos"]] == [0.5, 1.0] and data["held_out_seeds"] == [1]
    sysd = data["systems"]["geoprefix"]
    assert [e["slo"]["tpot_s"] for e in sysd["by_slo"]] == [0.2, 0.2]
    assert set(sysd["curve"]) == {"0", "1"} and all(len(p["meets"]) == 2 for p in sysd["curve"]["0"])
    v = data["verdicts"][1]["vs"]["geoprefix"]
    assert v["seeds"]["verdict"] in ("win", "tie", "loss") and v["held_out"]["seeds"] == [1]
    assert (out / "goodput.png").stat().st_size > 0


@pytest.mark.parametrize("argv, says", [
    (["--ttft-slo", "0"], "--ttft-slo must be a finite number > 0"),
    (["--ttft-slo", "0.5,-1"], "--ttft-slo must be a finite number > 0"),
    (["--ttft-slo", "1,fast"], "--ttft-slo: 'fast' is not a number"),
    (["--ttft-slo", "1,1"], "--ttft-slo: 1 is listed twice"),
    (["--tpot-slo", "0"], "--tpot-slo must be a finite number > 0"),
    (["--tpot-slo", "fast"], "--tpot-slo"),
    (["--held-out-seeds", "0"], "--held-out-seeds"),
    (["--held-out-seeds", "four"], "--held-out-seeds"),
])
def test_goodput_bad_slos_and_seeds_are_errors_naming_the_flag(capsys, argv, says):
    from ray_geolb.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["goodput", "--no-progress", "--seeds", "0", *argv])
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_a_demand_with_its_own_arrivals_and_mix_keeps_them_in_plan_and_goodput(tmp_path):
    from ray_geolb.__main__ import main
    from ray_geolb.sim.plan import _base_run
    from ray_geolb.sim.workloads.geo_diurnal import load_demand

    d = load_demand("azure-bursty-3", 8.0)
    assert d.workload  # arrivals replayed from a trace, its request mix
    kw = _base_run("x", "geoprefix", {"us": 1}, d, 12.0, 1.0, PROFILE, SLO(1.0))["workload"]["kw"]
    assert {k: kw[k] for k in d.workload} == d.workload and kw["curves"] == d.to_kw()
    out = tmp_path / "gp"
    assert main(["goodput", "--demand", "azure-bursty-3", "--mean-rps", "8", "--day-s", "6", "--regions",
                 "us=1,eu=1,asia=1", "--systems", "region-local", "--start", "4", "--bisect-steps", "0",
                 "--no-progress", "--out", str(out)]) == 0
    assert json.loads((out / "goodput.json").read_text())["demand"]["workload"] == d.workload


def test_the_wall_estimate_waits_for_each_rounds_longest_run():
    from ray_geolb.sim.goodput_report import estimate_wall_s

    rounds = [{"runs": 4, "run_s": 8.0, "longest_run_s": 2.0}, {"runs": 1, "run_s": 5.0, "longest_run_s": 5.0}]
    assert estimate_wall_s(rounds, 1) == 13.0  # one core: every run in turn
    assert estimate_wall_s(rounds, 2) == 4.0 + 5.0  # the second round is one run: more cores do not help it
    assert estimate_wall_s(rounds, 16) == 2.0 + 5.0
