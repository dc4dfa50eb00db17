"""Trace replay maps rows onto regions by row (dealt), by session key or by the first
distinct prefix block; the shared-context workloads spread each long context over several regions,
reproducibly; compare_policies runs the new scenario and the network-hard / conversation ones over 4 seeds."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from ray_geolb.sim.scenarios import run_one, scenario_runs
from ray_geolb.sim.workloads import by_name, shared_context, shared_context_trace, trace
from ray_geolb.sim.workloads.shared_context import context_of, trace_rows
from repo import load_script

REGIONS = ["us", "eu", "asia"]


def _write(tmp_path, rows, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _rows(n=60):
    # block 0 is a system prompt every row shares; then one of 6 contexts (2 blocks); then a unique block
    return [{"timestamp": 100 * i, "input_length": 4 * 64, "output_length": 4,
             "hash_ids": [0, 10 + 2 * (i % 6), 11 + 2 * (i % 6), 1000 + i], "session_id": f"user{i % 7}"}
            for i in range(n)]


def test_trace_rows_dealt_round_robin_by_row(tmp_path):
    w = trace(_write(tmp_path, _rows()), region_of=REGIONS, region_by="row", block_tokens=64)
    assert [p.region for _, p in w.open.arrivals] == [REGIONS[i % 3] for i in range(60)]
    assert w.meta["region_by"] == "row"
    # the default is the dealt mapping, and a function of the row index still works
    assert [p.region for _, p in trace(_write(tmp_path, _rows()), region_of=REGIONS).open.arrivals] == \
        [REGIONS[i % 3] for i in range(60)]
    w = trace(_write(tmp_path, _rows()), region_of=lambda i: "eu" if i < 5 else "us")
    assert [p.region for _, p in w.open.arrivals][4:6] == ["eu", "us"]


def test_trace_rows_by_session_key_keep_a_session_in_one_region(tmp_path):
    w = trace(_write(tmp_path, _rows()), region_of=REGIONS, region_by="session", block_tokens=64)
    by_session = defaultdict(set)
    for _, p in w.open.arrivals:
        by_session[p.calls[0].session_key].add(p.region)
    assert len(by_session) == 7 and all(len(r) == 1 for r in by_session.values())
    assert len(set().union(*by_session.values())) >= 2  # sessions land in more than one region
    again = trace(_write(tmp_path, _rows()), region_of=REGIONS, region_by="session", block_tokens=64)
    assert again.open.arrivals == w.open.arrivals


def test_trace_rows_by_first_distinct_prefix_block_keep_a_prefix_in_one_region(tmp_path):
    w = trace(_write(tmp_path, _rows()), region_of=REGIONS, region_by="prefix", block_tokens=64)
    by_ctx = defaultdict(set)
    for i, (_, p) in enumerate(w.open.arrivals):
        by_ctx[i % 6].add(p.region)
    assert all(len(r) == 1 for r in by_ctx.values())
    # the block every row shares (block 0) is skipped: the contexts are spread, not all in one region
    assert len(set().union(*by_ctx.values())) >= 2


def test_trace_region_mapping_rejects_bad_options(tmp_path):
    p = _write(tmp_path, _rows(3))
    with pytest.raises(ValueError, match="region_by must be one of row, session, prefix"):
        trace(p, region_of=REGIONS, region_by="tenant")
    with pytest.raises(ValueError, match="region_of must be a region or a list"):
        trace(p, region_of=lambda i: "us", region_by="session")
    bad = _write(tmp_path, [{"timestamp": 1, "input_length": 2, "output_length": 3, "session_id": [1]}], "b.jsonl")
    with pytest.raises(ValueError, match=r"b.jsonl:1: session_id"):
        trace(bad)


def _contexts_by_region(w, per_region):
    seen = defaultdict(set)
    for r, stream in w.closed.programs.items():
        for p in stream.take(per_region):
            seen[p.calls[0].session_key].add(r)
    return seen


def test_shared_context_is_reproducible_and_spreads_each_context_over_regions():
    a, b = shared_context(seed=3), shared_context(seed=3)
    for r in REGIONS:
        assert [p.calls[0].prompt for p in a.closed.programs[r].take(20)] == \
               [p.calls[0].prompt for p in b.closed.programs[r].take(20)]
    assert shared_context(seed=4).closed.programs["us"][0].calls[0].prompt != a.closed.programs["us"][0].calls[0].prompt
    first = a.closed.programs["us"][0].calls[0]
    assert 4000 <= first.input_tokens <= 8000 + 400  # a long context plus the system prompt and a question
    seen = _contexts_by_region(a, 400)
    # contexts of the middle of the stream (fully live, not at the edges) are asked about from every region
    mid = [seen[f"ctx-{d}"] for d in range(64, 100)]
    assert sum(len(r) == 3 for r in mid) >= 0.8 * len(mid)
    # the text of a context is the same whichever region asks; questions differ
    us = {p.calls[0].session_key: p.calls[0].prompt for p in a.closed.programs["us"].take(200)}
    eu = {p.calls[0].session_key: p.calls[0].prompt for p in a.closed.programs["eu"].take(200)}
    key = next(k for k in us if k in eu)
    u, e = us[key], eu[key]
    common = next(i for i, (x, y) in enumerate(zip(u, e)) if x != y)
    assert common >= 4000 * 4 - 50 and u != e


def test_context_pool_turns_over_with_the_expected_reuse():
    counts = defaultdict(int)
    for i in range(64 * 4 * 10):
        counts[context_of(i, live=64, reuse=4, seed=0)] += 1
    interior = [counts[d] for d in range(100, 500)]
    assert 3.5 <= sum(interior) / len(interior) <= 4.5


def test_shared_context_trace_is_reproducible_dealt_and_spread(tmp_path):
    kw = dict(requests=300, rate_rps=5.0, seed=1)
    w1 = shared_context_trace(path=tmp_path / "a.jsonl", **kw)
    w2 = shared_context_trace(path=tmp_path / "b.jsonl", **kw)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert [(t, p.region, p.calls[0].prompt) for t, p in w1.open.arrivals] == \
           [(t, p.region, p.calls[0].prompt) for t, p in w2.open.arrivals]
    assert [p.region for _, p in w1.open.arrivals] == [REGIONS[i % 3] for i in range(300)]
    rows = trace_rows(300, 5.0, 64, 12, (4000, 8000), (64, 256), (32, 256), 300, 1)
    regions_of_ctx = defaultdict(set)
    for row, (_, p) in zip(rows, w1.open.arrivals):
        regions_of_ctx[row["hash_ids"][1]].add(p.region)
    reused = [r for c, r in regions_of_ctx.items() if sum(1 for row in rows if row["hash_ids"][1] == c) >= 3]
    assert reused and sum(len(r) >= 2 for r in reused) >= 0.8 * len(reused)
    # by the first distinct prefix block (the context's first block), a context stays in one region
    wp = shared_context_trace(path=tmp_path / "a.jsonl", region_by="prefix", **kw)
    by_ctx = defaultdict(set)
    for row, (_, p) in zip(rows, wp.open.arrivals):
        by_ctx[row["hash_ids"][1]].add(p.region)
    assert all(len(r) == 1 for r in by_ctx.values()) and len(set().union(*by_ctx.values())) == 3
    assert by_name("shared-context-trace", path=tmp_path / "a.jsonl", **kw).open.arrivals == w1.open.arrivals


def test_shared_context_scenario_runs_reproducibly():
    runs = scenario_runs("shared-context", scale=0.25, duration_s=15.0, seed=0, systems=["geoprefix", "oracle"])
    assert {r["group"] for r in runs} == {"rag", "trace-dealt"}
    assert all(r["deploy"]["profile"] == "mistral-7b-a100" for r in runs)
    geo = [r for r in runs if r["system"] == "geoprefix" and r["group"] == "rag"][0]
    m1, m2 = run_one(geo), run_one(json.loads(json.dumps(geo)))
    m1.pop("elapsed_s", None), m2.pop("elapsed_s", None)
    assert m1["counters"]["requests_completed"] > 0
    assert json.dumps(m1, sort_keys=True, default=str) == json.dumps(m2, sort_keys=True, default=str)


def _compare_policies():
    return load_script("benchmarks/compare_policies.py")


def test_compare_policies_runs_the_new_scenario_and_four_seeds():
    cp = _compare_policies()
    assert {"shared-context", "network-hard", "skylb-fig8"} <= set(cp.SCENARIOS)
    runs = cp.build_runs(["shared-context", "network-hard", "skylb-fig8"], ["geoprefix"], [0, 1, 2, 3], False,
                         None, None)
    seeds = defaultdict(set)
    for r in runs:
        seeds[(r["key"][0], r["key"][1])].add(r["key"][3])
    for group in [("network-hard", "network-hard"), ("skylb-fig8", "conv-sharegpt"), ("skylb-fig8", "conv-wildchat"),
                  ("shared-context", "rag"), ("shared-context", "trace-dealt")]:
        assert seeds[group] == {0, 1, 2, 3}, group
    assert len({int(s) for s in cp.DEFAULT_SEEDS.split(",")}) >= 4  # what --seeds defaults to


def test_compare_policies_judges_the_central_lb_bar_against_the_best_central_lb_per_criterion():
    cp = _compare_policies()
    central = cp._central_systems()
    assert {"sgl", "ll", "ch", "ray-prefix", "gorgo-proxy"} <= set(central)
    assert not {"oracle", "geoprefix", "skylb", "gorgo"} & set(central)  # per-region LBs and the oracle are not

    def a(rps, p99, p50, replicas):
        return {"replicas": replicas, "throughput_rps": {"mean": rps}, "ttft_p99_s": {"mean": p99},
                "ttft_p50_s": {"mean": p50}}

    reps = {"us": 2, "eu": 2}
    agg = {("s", "g", "geoprefix"): a(10.0, 2.0, 0.30, reps), ("s", "g", "skylb"): a(9.0, 3.0, 0.30, reps),
           ("s", "g", "sgl"): a(10.5, 3.0, 0.5, reps),  # the best central throughput
           ("s", "g", "ll"): a(9.5, 1.95, 0.5, reps),  # the best central P99: the bar is 1.95 x 1.05
           ("s", "g", "oracle"): a(20.0, 0.1, 0.1, reps),  # not a deployable LB: never the bar
           ("s", "one", "geoprefix"): a(1.0, 1.0, 1.0, {"us": 1, "eu": 1}), ("s", "one", "sgl"): a(2.0, 0.5, 0.5,
                                                                                                  {"us": 1, "eu": 1})}
    text, data = cp.central_bar(agg, ["s"])
    g = data["s/g"]
    assert g["best_central_throughput"] == ["sgl", 10.5] and g["p99_bar"][0] == "ll"
    assert g["p99_bar"][1] == 1.95 * 1.05 and g["p50_bar"] == 0.30 * 1.05
    assert g["met"] == {"throughput": False, "p99": True, "p50": True}
    assert data["s/one"]["degenerate"] == "one replica per region"
    assert "throughput met on 0, P99 on 1, p50 on 1, all three on 0" in text and "1 degenerate not counted" in text


def test_simulate_cli_passes_the_region_mapping(tmp_path):
    import argparse

    from ray_geolb.sim.cli import _build_runs, add_simulate_parser

    ap = argparse.ArgumentParser(prog="test")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = add_simulate_parser(sub)
    path = _write(tmp_path, _rows(6))
    args = ap.parse_args(["simulate", "--workload", f"trace:{path}", "--regions", "us=1,eu=1", "--region-by",
                          "prefix", "--policy", "skylb"])
    runs = _build_runs(args, sp)
    assert runs and all(r["workload"]["kw"]["region_by"] == "prefix" for r in runs)
    assert runs[0]["workload"]["kw"]["region_of"] == ["us", "eu"]
    args = ap.parse_args(["simulate", "--workload", "tot", "--region-by", "row"])
    with pytest.raises(SystemExit):
        _build_runs(args, sp)


def test_simulator_relays_geoprefix_summaries_through_the_registry():
    from ray_geolb.policy.region.config import REGION_LAYER
    from ray_geolb.sim.deploy import deployment_for
    from ray_geolb.sim.scenarios import build_workload
    from ray_geolb.sim.simulator import SimConfig, Simulator

    run = [r for r in scenario_runs("shared-context", scale=0.25, duration_s=10.0, seed=1, systems=["geoprefix"])
           if r["group"] == "rag"][0]
    sim = Simulator(build_workload(run["workload"]), deployment_for(run["system"], run["replicas"], **run["deploy"]),
                    SimConfig(**run["sim"]))
    c = sim.run().counters
    # sent as the Serve ingress sends it (SummarySendRule): when it changed, so not with every heartbeat
    assert 0 < c["prefix_summaries"] < c["heartbeats"]
    assert 0 < c["prefix_summary_bytes"] / c["prefix_summaries"] <= c["prefix_summary_bytes_max"] <= 3600
    # the registry holds every region's last one, and each peer has one from a table: parsed off the wire
    table = sim.registry.table()
    assert sorted(table["prefix_summaries"]) == sorted(lb.region for lb in sim.lbs.values())
    for lb in sim.lbs.values():
        for peer in lb.peers:
            got = lb.router.peers[peer.region].prefix_summary
            assert got is not None and got.n > 0 and got is not peer.router.prefix_summary()
    off = REGION_LAYER.model_dump()["peer_selectors"]
    off["geoprefix"]["cost"]["peer_summary"] = False
    run["deploy"]["region_layer"] = {"peer_selectors": off}
    assert "prefix_summaries" not in run_one(run)["counters"]
    run = [r for r in scenario_runs("shared-context", scale=0.25, duration_s=10.0, seed=1, systems=["skylb"])][0]
    assert "prefix_summaries" not in run_one(run)["counters"]  # other systems publish none
