"""Scenarios at a tiny scale, the simulate CLI, plots, and the Ray sweep == the sequential sweep."""

from __future__ import annotations

import json

import pytest

from ray_geolb.sim.cli import add_simulate_parser, run_simulate
from ray_geolb.sim.deploy import SYSTEMS, register_system
from ray_geolb.sim.metrics import dumps
from ray_geolb.sim.scenarios import run_one, scenario_names, scenario_runs
from ray_geolb.sim.sweep import grid, run_many
from repo import REPO


def _parse(argv):
    import argparse

    ap = argparse.ArgumentParser(prog="test")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_simulate_parser(sub)
    return ap.parse_args(["simulate", *argv])


@pytest.mark.parametrize("name", ["skylb-fig8", "skylb-fig9", "skylb-fig10", "ray-blog-prefix"])
def test_every_scenario_runs_at_tiny_scale(name):
    scale = {"skylb-fig8": 0.1, "skylb-fig9": 0.3, "skylb-fig10": 0.1, "ray-blog-prefix": 0.02}[name]
    # SkyLB's ToT nodes write 256 tokens (~14 s of decode on an L4): Fig. 8 / 9 need 20 s to finish any
    duration = {"skylb-fig8": 20.0, "skylb-fig9": 20.0}.get(name, 8.0)
    runs = scenario_runs(name, scale=scale, duration_s=duration)
    systems = {r["system"] for r in runs}
    expected = {"skylb-fig8": {"skylb", "skylb-ch", "rr", "ll", "ch", "sgl"}, "skylb-fig9": {"bp", "sp-o", "sp-p"},
                "skylb-fig10": {"region-local", "skylb"}, "ray-blog-prefix": {"p2c", "ray-prefix", "skylb"}}[name]
    assert expected <= systems
    if name == "skylb-fig8":  # one run per panel is enough here: keep the test fast
        runs = [r for r in runs if r["system"] in ("skylb", "sgl")]
    assert runs
    for r in runs:
        m = run_one(r)
        c = m["counters"]
        assert c["requests_completed"] > 0, r["label"]
        assert c["requests_sent"] == c["requests_completed"] + c["requests_rejected"] + c["in_flight_at_end"]
        assert len(m["ttft_cdf"]) == 101 and m["ttft_cdf"] == sorted(m["ttft_cdf"])
        if r["system"] == "region-local":
            assert m["cross_region_share"] == 0.0
        if name == "ray-blog-prefix":  # drained: every prompt answered
            assert c["in_flight_at_end"] == 0 and c["programs_completed"] == c["programs_started"]


def test_scenario_sizes_follow_the_papers():
    fig9 = scenario_runs("skylb-fig9")
    assert {json.dumps(r["replicas"]) for r in fig9} == {'{"us": 4}'}
    assert fig9[0]["workload"]["kw"]["clients"] == {"us": 30}
    fig10 = scenario_runs("skylb-fig10")
    assert sorted({sum(r["replicas"].values()) for r in fig10}) == [6, 9, 12]
    assert fig10[0]["workload"]["kw"]["clients"] == {"us": 120, "eu": 40, "asia": 40}
    fig8 = scenario_runs("skylb-fig8")
    wild = [r for r in fig8 if r["group"] == "conv-wildchat"][0]
    assert wild["replicas"] == {"us": 3, "eu": 2, "asia": 3}  # §5.1: 3 in the US, 3 in Asia, 2 in Europe
    blog = scenario_runs("ray-blog-prefix")
    assert sorted({r["replicas"]["us"] for r in blog}) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="unknown scenario"):
        scenario_runs("fig99")
    assert set(scenario_names()) == {"skylb-fig8", "skylb-fig9", "skylb-fig10", "ray-blog-prefix", "gorgo",
                                     "network-hard", "shared-context"}
    gorgo = scenario_runs("gorgo")
    assert gorgo[0]["replicas"] == {"us-west": 1, "germany": 1, "israel": 1}
    assert sum(gorgo[0]["workload"]["kw"]["clients"].values()) == 10  # GORGO: 10 requests in flight
    assert gorgo[0]["sim"]["duration_s"] == 60.0 and gorgo[0]["deploy"]["profile"] == "mistral-7b-a100"
    assert gorgo[0]["deploy"]["network"] == "gorgo"


def test_register_system_is_one_line():
    register_system("test-ll-local", "per-region", "least_load", "test only")
    try:
        runs = grid(["test-ll-local"], [0], [{"us": 1, "eu": 1}],
                    {"name": "tot", "kw": {"clients": {"us": 3, "eu": 1}}}, {"duration_s": 5.0})
        m = run_one(runs[0])
        assert m["system"] == "test-ll-local" and m["counters"]["requests_completed"] > 0
    finally:
        SYSTEMS.pop("test-ll-local")


def test_cli_writes_json_table_and_png(tmp_path, capsys):
    out = tmp_path / "o"
    args = _parse(["--workload", "tot", "--policy", "skylb,ll", "--regions", "us=2,eu=1", "--clients", "us=6,eu=2",
                   "--duration", "6", "--out", str(out), "--no-progress"])
    assert run_simulate(args) == 0
    text = capsys.readouterr().out
    assert "skylb" in text and "ll" in text and "req/s" in text
    data = json.loads((out / "results.json").read_text())
    assert [r["system"] for r in data["runs"]] == ["skylb", "ll"]
    assert (out / "simulate.png").stat().st_size > 10_000
    first = (out / "results.json").read_bytes()
    assert run_simulate(args) == 0  # same seed -> same bytes
    assert (out / "results.json").read_bytes() == first


@pytest.mark.parametrize("argv,msg", [
    (["--regions", "us=4,eu"], "--regions"),
    (["--regions", "mars=2"], "unknown region"),
    (["--policy", "skylb,nope"], "unknown system or policy 'nope'"),
    (["--workload", "nope"], "unknown workload"),
    (["--workload", "trace:/no/such/file.csv"], "not found"),
    (["--duration", "0"], "--duration must be > 0"),
    (["--profile", "h200"], "unknown engine profile"),
    (["--data-dir", "/no/such/dir"], "is not a directory"),
    (["--seeds", "1,x"], "--seeds"),
    (["--region-layer", "bogus=1"], "--region-layer"),
    (["--region-layer", "max_queue"], "is not FIELD=VALUE"),
    (["--region-layer", "max_queue=-1"], "max_queue"),
    (["--region-layer", "max_queue.x=1"], "is not a dict field"),
    (["--region-layer", "peer_selectors.geoprefix.cost.bogus=1"], "bogus"),
    (["--warmup", "-1"], "--warmup must be"),
])
def test_cli_bad_arguments_are_argparse_errors(argv, msg, capsys):
    args = _parse(argv + ["--no-progress"])
    with pytest.raises(SystemExit) as e:
        run_simulate(args)
    assert e.value.code == 2
    assert msg in capsys.readouterr().err


def test_cli_changes_the_region_layer_of_every_run():
    from ray_geolb.sim.cli import _build_runs
    from ray_geolb.sim.scenarios import run_one

    args = _parse(["--scenario", "network-hard", "--systems", "geoprefix", "--duration", "5", "--no-progress",
                   "--region-layer", "note_forwards=false,max_queue=64", "--heartbeat", "0.5"])
    runs = _build_runs(args, args._simulate_parser)
    assert runs and all(r["deploy"]["region_layer"] == {"note_forwards": False, "max_queue": 64,
                                                        "heartbeat_period_s": 0.5} for r in runs)
    layer = run_one(runs[0])["deployment"]["region_layer"]
    assert (layer["note_forwards"], layer["max_queue"], layer["heartbeat_period_s"]) == (False, 64, 0.5)


@pytest.mark.parametrize("extra", [["--scenario", "network-hard", "--systems", "geoprefix"], ["--policy", "skylb"]])
def test_cli_warmup_reaches_every_run(extra):
    from ray_geolb.sim.cli import _build_runs
    from ray_geolb.sim.scenarios import run_one

    args = _parse(extra + ["--duration", "5", "--no-progress", "--warmup", "0"])
    runs = _build_runs(args, args._simulate_parser)
    assert runs and all(r["sim"]["warmup_s"] == 0 for r in runs)
    # cold: no heartbeat before time 0, so fewer than with the default 5 s of warm-up
    cold = run_one(runs[0])["counters"]["heartbeats"]
    del runs[0]["sim"]["warmup_s"]
    assert run_one(runs[0])["counters"]["heartbeats"] > cold


def test_cli_region_layer_takes_a_dotted_path_into_a_selector():
    from ray_geolb.policy.region import REGION_LAYER
    from ray_geolb.sim.cli import _build_runs
    from ray_geolb.sim.scenarios import run_one

    args = _parse(["--scenario", "network-hard", "--systems", "geoprefix", "--duration", "5", "--no-progress",
                   "--region-layer", "peer_selectors.geoprefix.cost.forwards_cap_peers=true,max_queue=64"])
    runs = _build_runs(args, args._simulate_parser)
    sel = runs[0]["deploy"]["region_layer"]["peer_selectors"]
    assert sel["geoprefix"]["cost"]["forwards_cap_peers"] is True
    assert runs[0]["deploy"]["region_layer"]["max_queue"] == 64
    assert sel["gorgo"] == REGION_LAYER.peer_selectors["gorgo"]  # the other selectors as shipped
    assert REGION_LAYER.peer_selectors["geoprefix"]["cost"]["forwards_cap_peers"] is False  # REGION_LAYER untouched
    layer = run_one(runs[0])["deployment"]["region_layer"]
    assert layer["peer_selectors"]["geoprefix"]["cost"]["forwards_cap_peers"] is True


def test_cli_trace_replay(tmp_path):
    from ray_geolb.sim.workloads.datasets import fixture_path

    args = _parse(["--workload", f"trace:{fixture_path('azure_conv')}", "--policy", "skylb", "--regions", "us=2,eu=2",
                   "--duration", "20", "--out", str(tmp_path), "--no-progress"])
    assert run_simulate(args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["runs"][0]["counters"]["requests_completed"] > 0
    assert data["runs"][0]["workload"]["kind"] == "open"


@pytest.mark.ray
def test_sweep_on_ray_equals_sequential(tmp_path):
    runs = grid(["skylb", "ll"], [0], [{"us": 1, "eu": 1}], {"name": "tot", "kw": {"clients": {"us": 4, "eu": 2}}},
                {"duration_s": 6.0})
    seq = run_many(runs, progress=False)
    import ray

    from ray_geolb.serve.local import start_local_ray

    start_local_ray(num_cpus=2, prefix="rsw",
                    runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        par = run_many(runs, ray=True, progress=False)  # uses the running local cluster
    finally:
        ray.shutdown()
    assert [dumps(m) for m in par] == [dumps(m) for m in seq]
    assert seq[0]["counters"]["requests_completed"] > 0
