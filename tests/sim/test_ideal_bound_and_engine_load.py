"""The ideal prefix-hit bound, the engine-load record of a run, and the workloads' max_tokens."""

from __future__ import annotations

import pytest

from ray_geolb.engine.tokens import blocks_from_hash_ids
from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.metrics import summarize
from ray_geolb.sim.observe import IdealPrefixCache
from ray_geolb.sim.simulator import SimConfig, simulate
from ray_geolb.sim.workloads import conversation, tot, tot_size


def test_ideal_cache_counts_hits_like_the_engine():
    ideal = IdealPrefixCache(16)
    a = blocks_from_hash_ids([1, 2, 3])
    trace = [(48, a, 0),  # nothing sent before: no hit
             (40, a[:2], 32),  # shares blocks 1-2; (40 - 1) // 16 = 2 blocks may hit
             (48, a, 32),  # all 3 blocks were sent, but the last prompt token is computed: 2 blocks
             (64, blocks_from_hash_ids([9, 2, 3, 4]), 0)]  # chained hashes: block 2 after 9 is new
    for p, hashes, hit in trace:
        assert ideal.observe(p, hashes) == hit
        ideal.count(p, hit)
    s = ideal.summary()
    assert s["hit_tokens"] == 32 + 32 and s["query_tokens"] == 48 + 40 + 48 + 64
    assert s["hit_rate"] == pytest.approx(64 / 200)


@pytest.mark.parametrize("system", ["skylb", "oracle", "ll", "rr"])
def test_no_system_beats_the_ideal_bound(system):
    wl = tot(2, clients={"us": 10, "eu": 4}, seed=0)
    res = simulate(wl, deployment_for(system, {"us": 2, "eu": 2}), SimConfig(duration_s=30.0))
    m = summarize(res)
    assert m["counters"]["requests_completed"] > 50
    assert 0.3 < m["ideal_prefix_hit_rate"] < 1.0  # ToT: children share their parents' prompts
    assert m["prefix_hit_rate"] <= m["ideal_prefix_hit_rate"]


def test_run_records_engine_load_and_waiting_reports():
    wl = tot(2, clients={"us": 40}, seed=0)
    res = simulate(wl, deployment_for("bp", {"us": 1}), SimConfig(duration_s=20.0))
    load = summarize(res)["load"]
    assert load["reports"] == res.counters["stats_reports"] > 0
    out, run, wait = (load[k] for k in ("outstanding_per_replica", "running_per_replica", "waiting_per_replica"))
    assert out["max"] >= run["max"] > 0 and out["mean"] >= run["mean"] + wait["mean"] - 1e-9
    assert 0.0 < load["kv_usage"]["mean"] <= load["kv_usage"]["max"] <= 1.0


def test_tot_max_tokens_and_root_fork():
    w = tot(2, clients={"us": 1}, max_tokens=256, thought_tokens=300, fork_root=True)
    calls = w.closed.programs["us"][0].calls
    assert len(calls) == tot_size(2, fork_root=True) == 30 and tot_size(2) == 15
    assert [c.depends_on for c in calls[:2]] == [(), ()]
    assert all(c.max_tokens == 256 and c.output_tokens == 256 for c in calls)  # clipped to max_tokens
    plain = tot(2, clients={"us": 1}).closed.programs["us"][0].calls
    assert len(plain) == 15 and all(c.max_tokens is None for c in plain)


def test_conversation_max_tokens_cuts_replies_and_the_replayed_history():
    def first_multi_turn(w):
        return next(p.calls for p in w.closed.programs["us"].take(50) if len(p.calls) > 2)

    full = first_multi_turn(conversation("sharegpt", clients={"us": 1}))
    cut = first_multi_turn(conversation("sharegpt", clients={"us": 1}, max_tokens=64))
    assert len(full) == len(cut) > 2
    assert [min(c.output_tokens, 64) for c in full] == [c.output_tokens for c in cut]
    assert all(c.max_tokens == 64 for c in cut) and all(c.max_tokens is None for c in full)
    replies = [m["content"] for m in cut[-1].messages if m["role"] == "assistant"]
    assert replies and all(len(r) <= 4 * 64 for r in replies)
