"""GORGO, GORGO-proxy and GeoPrefix price each replica by an estimated TTFT: each formula on small
hand-computed cases (and the memoised sum the cost loop reads)."""

import pytest

from policy_cases import TP, P, cost_policy, rq
from ray_geolb.policy import RegionRouter, ReplicaStats, TwoLayerConfig
from ray_geolb.policy.region import GEOPREFIX_COST


def test_gorgo_cost_is_residual_prefill_plus_queue_wait():
    pol = cost_policy()
    first = rq(0, P + "a" * 1952)  # 4000 chars = 1000 tokens
    pol.on_dispatch(first, "a", 0.0)
    req = rq(1, P + "b" * 1952)
    costs = pol.costs(req, ["a", "b"], 1.0)
    # a: residual (1000 - 2048/4) tokens + 1000 queued (unseen, uncached) tokens; b: 1000 tokens, no queue
    assert costs["a"] == pytest.approx(TP * (1000 - 512) + TP * 1000)
    assert costs["b"] == pytest.approx(TP * 1000)
    assert pol.choose(req, 1.0).target == "b"
    light_q = cost_policy(q_hat=0.3)
    light_q.on_dispatch(first, "a", 0.0)
    d = light_q.choose(rq(2, P + "b" * 1952), 1.0)
    assert d.target == "a" and d.matched == 2048 and d.reason == "gorgo_cost"  # 0.488 + 0.3 < 1.0


def test_gorgo_queue_uses_reported_waiting_and_only_unseen_dispatches():
    pol = cost_policy()
    pol.on_dispatch(rq(0, "x" * 4000), "a", 0.0)
    assert pol.queued_tokens("a") == pytest.approx(1000)
    pol.on_stats("a", ReplicaStats(num_waiting=2, timestamp=0.5))  # the report has seen the dispatch
    assert pol.queued_tokens("a") == pytest.approx(2 * 1000)  # 2 waiting × mean prompt (1000)


def test_gorgo_proxy_adds_each_replicas_rtt_from_the_hook():
    pol = cost_policy("gorgo_proxy", targets=("us-0", "eu-0"))
    pol.rtt_of_target = {"us-0": 0.0, "eu-0": 1.2}.get
    pol.on_dispatch(rq(0, "y" * 4000), "us-0", 0.0)
    req = rq(1, "z" * 4000)
    costs = pol.costs(req, ["us-0", "eu-0"], 1.0)
    assert costs["us-0"] == pytest.approx(TP * 1000 + TP * 1000)
    assert costs["eu-0"] == pytest.approx(1.2 + TP * 1000)  # 2.2 > 2.0
    assert pol.choose(req, 1.0).target == "us-0"
    pol.rtt_of_target = lambda target, r: 0.0 if target.startswith(r.region) else 2.0  # client-region form
    assert pol.choose(rq(2, "w" * 4000, region="eu"), 1.0).target == "eu-0"
    pol.rtt_of_target = lambda t: -1.0
    with pytest.raises(ValueError, match="RTT"):
        pol.choose(rq(3, "v" * 400), 1.0)
    with pytest.raises(TypeError, match="rtt_of_target"):
        pol.rtt_of_target = 3


def test_geoprefix_ignores_short_matches_and_discounts_old_ones():
    pol = cost_policy("geoprefix", min_match_chars=256, match_half_life_s=10.0)
    pol.on_dispatch(rq(0, P[:128] + "a" * 3872), "a", 0.0)
    pol.on_complete("r0", "a", 0.1)
    req = rq(1, P[:128] + "b" * 3872)
    costs = pol.costs(req, ["a", "b"], 0.2)
    assert costs["a"] == costs["b"] == pytest.approx(TP * 1000)  # a 128-char (system prompt) match is ignored
    pol.on_dispatch(rq(2, P + "a" * 1952), "a", 1.0)
    pol.on_complete("r2", "a", 1.1)
    costs = pol.costs(rq(3, P + "b" * 1952), ["a", "b"], 11.0)  # the 2048-char match is 10 s old: half
    assert costs["a"] == pytest.approx(TP * (1000 - 512 * 0.5))


def test_geoprefix_trades_match_against_load_per_request():
    pol = cost_policy("geoprefix", match_half_life_s=None)
    pol.on_dispatch(rq(0, P + "a" * 1952), "a", 0.0)  # a: prefix, and 1000 tokens queued
    short = rq(1, P + "b" * 1952)
    assert pol.choose(short, 0.1).target == "b"  # 0.488 + 1.0 > 1.0
    long_ = rq(2, P * 4 + "c" * 100)  # 8292 chars; a holds only its first 2048 -> still b
    pol.on_dispatch(rq(3, P * 4), "a", 0.2)  # now a holds all 8192 chars, queue 1000 + 1536 (uncached) tokens
    costs = pol.costs(long_, ["a", "b"], 0.3)
    # own residual prefill + queue wait + the residual's slowdown of a's 2 in-flight requests (w_shared = 1)
    assert costs["a"] == pytest.approx(TP * (2073 - 2048) + TP * (1000 + 1536) + TP * (2073 - 2048) * 2)
    assert costs["b"] == pytest.approx(TP * 2073)
    assert pol.choose(long_, 0.3).target == "b"
    pol.on_complete("r0", "a", 0.4)
    pol.on_complete("r3", "a", 0.4)  # a drained: the same request now goes to its prefix
    assert pol.choose(long_, 0.5).target == "a"


def _zero_slope_fit(pol, target="a"):
    """Observed TTFTs that fall as uncached tokens grow (queueing dominates): the fit clamps t_p to 0."""
    for i in range(12):
        rid = f"z{i}"
        pol.on_dispatch(rq(rid, chr(65 + i) * (400 * (i + 1))), target, 0.0)  # no shared prefix
        pol.on_complete(f"r{rid}", target, 0.1, ttft_s=5.0 - 0.1 * i)


def test_geoprefix_floors_t_p_at_the_prior_so_a_queueing_dominated_fit_keeps_prefix_affinity():
    gorgo = cost_policy("gorgo", tp_scope="pooled", match_half_life_s=None)
    geo = cost_policy("geoprefix", match_half_life_s=None, w_shared=0.0)
    for pol in (gorgo, geo):
        _zero_slope_fit(pol)
        assert pol.ttft.t_p() == 0.0  # the raw fit: slope clamped to 0
    assert gorgo.pooled_t_p() == 0.0  # GORGO keeps its fit as is (tp_floor='none')
    assert geo.pooled_t_p() == TP and geo.t_p("b") == TP  # GeoPrefix: never below the prior
    for pol in (gorgo, geo):
        pol.on_dispatch(rq("p", P + "x" * 400), "a", 1.0)
        pol.on_complete("rp", "a", 1.1)
    req = rq("q", P + "y" * 400)
    assert len(set(gorgo.costs(req, ["a", "b"], 2.0).values())) == 1  # t_p = 0: every replica costs 0
    costs = geo.costs(req, ["a", "b"], 2.0)
    assert costs["a"] == pytest.approx(TP * (612 - 512)) and costs["b"] == pytest.approx(TP * 612)
    assert geo.choose(req, 2.0).target == "a"
    # the region layer reads the floored t_p too (stay cost, heartbeat)
    r = RegionRouter(TwoLayerConfig(region="us", remote="cost", cost=GEOPREFIX_COST), geo)
    assert r.heartbeat(0, 3.0, queued_tokens=0.0).extra["t_p_s"] == TP


def test_geoprefix_prices_the_residual_prefill_for_the_requests_in_flight_at_the_replica():
    geo = cost_policy("geoprefix", match_half_life_s=None, q_hat=0.0)  # w_shared = 1 by default
    gorgo = cost_policy("gorgo", tp_scope="pooled", match_half_life_s=None, q_hat=0.0)
    assert gorgo.config.w_shared == 0.0 and geo.config.w_shared == 1.0
    assert gorgo.config.w_shared_max_inflight is None and geo.config.w_shared_max_inflight == 32
    for pol in (geo, gorgo):
        pol.on_dispatch(rq("m", P + "x" * 400), "a", 0.0)  # a holds the prefix
        for i in range(3):
            pol.on_dispatch(rq(f"b{i}", f"{i}" * 3000), "b", 0.0)  # b: 3 requests in flight, no prefix
    req = rq("n", P[:1024] + "y" * 1424)  # 612 tokens; a matches 1024 chars = 256 tokens
    c = geo.costs(req, ["a", "b"], 0.1)
    assert c["a"] == pytest.approx(TP * 356 + TP * 356 * 1)
    assert c["b"] == pytest.approx(TP * 612 + TP * 612 * 3)
    assert gorgo.costs(req, ["a", "b"], 0.1) == {"a": pytest.approx(TP * 356), "b": pytest.approx(TP * 612)}


def test_the_shared_prefill_term_counts_at_most_w_shared_max_inflight_requests():
    capped = cost_policy("geoprefix", match_half_life_s=None, q_hat=0.0, w_shared_max_inflight=2)
    for i in range(3):
        capped.on_dispatch(rq(f"b{i}", f"{i}" * 3000), "b", 0.0)  # b: 3 requests in flight, counted as 2
    capped.on_dispatch(rq("a0", "z" * 3000), "a", 0.0)  # a: 1, under the cap
    req = rq("n", "y" * 2448)  # 612 tokens, no match anywhere
    assert capped.costs(req, ["a", "b"], 0.1) == {"a": pytest.approx(TP * 612 * 2), "b": pytest.approx(TP * 612 * 3)}
    with pytest.raises(ValueError, match="w_shared_max_inflight"):
        cost_policy("geoprefix", w_shared_max_inflight=0)


def test_work_tracker_unseen_uncached_memo_equals_a_fresh_sum():
    """The cost loop's memoised per-replica sum must equal ``unseen()``'s, bit for bit, through any
    mix of dispatches, completions, new report times and removed replicas."""
    import random

    from ray_geolb.policy.ttft_model import WorkItem, WorkTracker

    rng = random.Random(11)
    w = WorkTracker()
    live = []
    for step in range(3000):
        op = rng.random()
        if op < 0.45:
            rid = f"q{step}"
            w.add(WorkItem(rid, f"r{rng.randrange(4)}", step * 0.01, 100, rng.random() * 1000.0, 10))
            live.append(rid)
        elif op < 0.85 and live:
            w.pop(live.pop(rng.randrange(len(live))))
        elif op < 0.87:
            w.remove_target(f"r{rng.randrange(4)}")
        for t in ("r0", "r1", "r2", "r3"):
            since = rng.choice([None, step * 0.01 - rng.random() * 0.5, step * 0.01 - 0.2])
            assert w.unseen_uncached(t, since) == w.unseen(t, since)[2]
            assert w.unseen_uncached(t, since) == w.unseen(t, since)[2]  # memoised answer
