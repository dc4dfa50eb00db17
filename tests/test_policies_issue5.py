"""GORGO, GORGO-proxy, BalanceRoute (vllm_default, jsq_load, br0), FlowKV, GeoPrefix, the online TTFT
model and the 'cost' peer selector: each formula on small hand-computed cases."""

import random

import pytest
from pydantic import ValidationError

from ray_geolb.policy import PeerState, RegionRouter, ReplicaStats, RouteRequest, TwoLayerConfig, build_policy
from ray_geolb.policy.region import GEOPREFIX_COST, GORGO_COST, CostSelector, CostSelectorConfig, DrainRate, RttTable
from ray_geolb.policy.ttft_model import TtftModel, TtftModelConfig, theil_sen

FIXED = {"block_chars": 64, "growth": 0.0}  # fixed 64-char blocks: matches are exact multiples of 64
TP = 0.001  # 1 ms per token, so costs are easy to compute by hand
NEW = ("gorgo", "gorgo_proxy", "vllm_default", "jsq_load", "br0", "flowkv", "geoprefix")

P = "".join(chr(97 + (i * 7) % 26) for i in range(2048))  # 2048-char shared prefix


def rq(i, text, **kw):
    return RouteRequest(f"r{i}", text, **kw)


def cost_policy(name="gorgo", targets=("a", "b"), **over):
    cfg = {"availability": {"mode": "bp"}, "prefix": FIXED, "ttft": {"prior_tp_s": TP, "prior_base_s": 0.1}}
    cfg.update(over)
    return build_policy({"name": name, **cfg}, targets=list(targets))


# ----------------------------------------------------------------------------- TTFT model
def test_ttft_model_falls_back_to_gorgo_table1_prior():
    m = TtftModel()
    b, s, src = m.line("r0")
    assert src == "prior" and b == pytest.approx(0.15072) and s == pytest.approx(0.0938e-3)
    assert m.predict("r0", 1000) == pytest.approx(0.15072 + 0.0938)


def test_theil_sen_recovers_a_known_line_from_noisy_samples_with_outliers():
    rng = random.Random(7)
    m = TtftModel(TtftModelConfig(window=128, min_samples=8))
    base, tp = 0.2, 0.0005
    for i in range(128):
        x = rng.uniform(100, 8000)
        y = base + tp * x + rng.gauss(0, 0.01)
        if i % 5 == 0:  # 20 % outliers: requests that queued for seconds
            y += rng.uniform(2.0, 20.0)
        m.observe("r0", x, y)
    b, s, src = m.line("r0")
    assert src == "key"
    assert s == pytest.approx(tp, rel=0.05) and b == pytest.approx(base, abs=0.03)
    # ordinary least squares on the same data is dragged far off by the outliers
    xs, ys = zip(*zip(m._w["r0"].xs, m._w["r0"].ys))
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    ols = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    ols_b = my - ols * mx
    assert abs(ols_b - base) > 0.5 or abs(ols - tp) / tp > 0.2


def test_ttft_model_pooled_fallback_window_and_bad_samples():
    m = TtftModel(TtftModelConfig(window=16, min_samples=4, min_spread_tokens=10))
    for x in (100, 200, 300, 400):
        assert m.observe("a", x, 0.1 + 0.001 * x)
    assert m.line("a")[2] == "key" and m.line("b")[2] == "pooled"  # b has no samples: pooled line
    assert m.t_p("b") == pytest.approx(0.001)
    assert not m.observe("a", -1, 0.5) and not m.observe("a", 10, float("nan")) and not m.observe("a", "x", 1)
    for i in range(40):
        m.observe("a", 100 + i, 1.0)
    assert m.samples("a") == 16  # bounded window
    assert m.line("a")[1] == pytest.approx(0.0, abs=1e-9)  # the line moved with the window (slope clamped >= 0)
    assert theil_sen([1, 1, 1], [1, 2, 3]) is None  # no x spread: no slope


def test_observed_ttfts_reach_the_policy_model_through_on_complete():
    pol = cost_policy(ttft={"prior_tp_s": TP, "prior_base_s": 0.1, "min_samples": 4, "min_spread_tokens": 10})
    for i, n in enumerate((400, 800, 1200, 1600, 2000)):
        req = rq(i, "q%d " % i + "z" * (n * 4 - 4))
        pol.on_dispatch(req, "a", float(i))
        pol.on_complete(req.request_id, "a", float(i) + 1, ttft_s=0.05 + 0.0002 * req.prompt_tokens, req=req)
    b, s, src = pol.ttft.line("a")
    assert src == "key" and s == pytest.approx(0.0002, rel=0.01) and b == pytest.approx(0.05, abs=1e-3)
    assert pol.work.count("a") == 0 and pol.tracker.outstanding("a") == 0
    req = rq(99, "failed " * 100)
    pol.on_dispatch(req, "b", 9.0)
    pol.on_complete(req.request_id, "b", 9.5, ttft_s=3.0, ok=False, req=req)
    assert pol.ttft.samples("b") == 0  # a failed request teaches nothing


# ----------------------------------------------------------------------------- GORGO
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


# ----------------------------------------------------------------------------- BalanceRoute
def test_vllm_default_score_counts_unseen_dispatches_as_waiting():
    pol = build_policy("vllm_default", targets=["a", "b"])
    pol.on_stats("a", ReplicaStats(num_waiting=1, num_running=2, timestamp=0.0))  # 4+2 = 6
    pol.on_stats("b", ReplicaStats(num_waiting=0, num_running=5, timestamp=0.0))  # 5
    assert pol.score("a") == 6 and pol.score("b") == 5
    assert pol.choose(rq(0, "hi"), 1.0).target == "b"
    pol.on_dispatch(rq(0, "hi"), "b", 1.0)  # unseen: 4·1 + 5 = 9
    assert pol.score("b") == 9 and pol.choose(rq(1, "hi"), 1.0).target == "a"


def test_jsq_load_adds_tokens_dispatched_since_the_report():
    pol = build_policy("jsq_load", targets=["a", "b"])
    pol.on_stats("a", ReplicaStats(kv_cache_usage=0.5, num_gpu_blocks=100, block_tokens=16, timestamp=0.0))
    pol.on_stats("b", ReplicaStats(kv_cache_usage=0.4, num_gpu_blocks=100, block_tokens=16, timestamp=0.0))
    assert pol.choose(rq(0, "x" * 800), 1.0).target == "b"
    pol.on_dispatch(rq(0, "x" * 800), "b", 1.0)  # +200 tokens: (640 + 200)/1600 = 0.525
    assert pol.kv_load("b") == pytest.approx(0.525)
    assert pol.choose(rq(1, "x" * 800), 1.0).target == "a"
    fresh = build_policy({"name": "jsq_load", "capacity_tokens": 1000}, targets=["c"])
    fresh.on_dispatch(rq(2, "x" * 400), "c", 0.0)  # no stats: own in-flight tokens / capacity_tokens
    assert fresh.kv_load("c") == pytest.approx(0.1)


def test_br0_marginal_overflow_then_jsq_tie_break():
    pol = build_policy({"name": "br0", "decode_tps": 0.0}, targets=["a", "b"])
    cap = dict(num_gpu_blocks=100, block_tokens=10, timestamp=0.0)  # 1000 tokens
    pol.on_stats("a", ReplicaStats(kv_cache_usage=0.5, **cap))
    pol.on_stats("b", ReplicaStats(kv_cache_usage=0.7, **cap))
    pol.on_dispatch(rq(0, "x" * 400, output_tokens_hint=300), "a", 1.0)  # K=500+100, grows by 300: P=900
    req = rq(1, "y" * 400, output_tokens_hint=100)  # s = 100 + 100
    assert pol.projected("a", 1.0) == pytest.approx(900)
    assert pol.overflow("a", req, 1.0) == pytest.approx(100)  # 900 + 200 - 1000
    assert pol.overflow("b", req, 1.0) == pytest.approx(0)  # 700 + 200 <= 1000
    assert pol.choose(req, 1.0).target == "b"  # although b's KV load (0.7) > a's (0.6)
    # outputs already produced shrink the projection: 10 s at 10 tok/s -> grow 200, P=800, F(a)=0
    pol2 = build_policy({"name": "br0", "decode_tps": 10.0}, targets=["a", "b"])
    pol2.on_stats("a", ReplicaStats(kv_cache_usage=0.5, **cap))
    pol2.on_stats("b", ReplicaStats(kv_cache_usage=0.7, **cap))
    pol2.on_dispatch(rq(0, "x" * 400, output_tokens_hint=300), "a", 1.0)
    assert pol2.overflow("a", req, 11.0) == 0 and pol2.choose(req, 11.0).target == "a"  # tie -> JSQ load
    # already overflowing: marginal = the whole request (not the total overflow)
    pol2.on_stats("b", ReplicaStats(kv_cache_usage=1.2, **dict(cap, timestamp=12.0)))
    assert pol2.overflow("b", req, 12.0) == pytest.approx(200)


# ----------------------------------------------------------------------------- FlowKV
def flowkv(**over):
    cfg = {"name": "flowkv", "prefix": FIXED, "ttft": {"prior_tp_s": TP}}
    cfg.update(over)
    return build_policy(cfg, targets=["a", "b"])


def test_flowkv_node_score_and_sliding_window():
    pol = flowkv()
    pol.on_stats("a", ReplicaStats(num_running=64, num_waiting=32, kv_cache_usage=0.5, max_num_seqs=128, timestamp=0.0))
    # 0.3·64/128 + 0.4·32/128 + 0.2·0.5 + 0.1·min(1, 32·512/8192)
    assert pol.node_score("a") == pytest.approx(0.15 + 0.1 + 0.1 + 0.1)
    pol.on_stats("a", ReplicaStats(num_running=0, num_waiting=0, kv_cache_usage=0.1, max_num_seqs=128, timestamp=1.0))
    assert pol.smoothed("a") == pytest.approx((0.25, 0.125, 0.3, 1.0))  # mean of the two reports
    pol.on_stats("a", ReplicaStats(num_running=0, num_waiting=0, kv_cache_usage=0.1, max_num_seqs=128, timestamp=10.0))
    assert pol.smoothed("a") == pytest.approx((0.0, 0.0, 0.1, 0.0))  # older reports left the 5 s window
    pol.on_dispatch(rq(0, "x" * 4000), "a", 11.0)  # unseen: +1/128 waiting, +1000/8192 budget
    assert pol.node_score("a") == pytest.approx(0.4 / 128 + 0.2 * 0.1 + 0.1 * 1000 / 8192)


def test_flowkv_states_route_differently():
    pol = flowkv(eps_low=0.3, eps_high=0.6, idle_threshold=0.3, extreme_duration_s=5.0)
    hot = dict(kv_cache_usage=0.9, max_num_seqs=10)
    # normal: both idle -> TTFT cost; a has the prefix
    pol.on_dispatch(rq(0, P + "a" * 1952), "a", 0.0)
    pol.on_complete("r0", "a", 0.5)
    d = pol.choose(rq(1, P + "b" * 1952), 1.0)
    assert pol.state == "normal" and d.target == "a" and d.reason == "normal_ttft"
    # imbalanced: a is busy (not idle), b idle -> b even though a has the prefix
    pol.on_stats("a", ReplicaStats(num_running=10, num_waiting=10, timestamp=2.0, **hot))  # 0.3+0.4+0.18+0.1 = 0.98
    pol.on_stats("b", ReplicaStats(num_running=0, num_waiting=0, timestamp=2.0, kv_cache_usage=0.0, max_num_seqs=10))
    d = pol.choose(rq(2, P + "c" * 1952), 2.5)
    assert pol.state == "imbalanced" and pol.system_score == pytest.approx(0.49) and d.target == "b"
    assert d.reason == "imbalanced_idle_ttft"
    # extreme: both hot -> least score; scale up once it lasted extreme_duration_s
    pol.on_stats("b", ReplicaStats(num_running=10, num_waiting=5, timestamp=3.0, **hot))  # 0.3+0.2+0.18+0.1=0.78
    d = pol.choose(rq(3, P + "d" * 1952), 3.0)
    assert pol.state == "extreme" and d.target == "b" and d.reason == "extreme_least_score"
    assert pol.scale_signal is None
    pol.choose(rq(4, "e" * 100), 8.5)
    assert pol.scale_signal == "up" and pol.describe()["scale_signal"] == "up"


# ----------------------------------------------------------------------------- GeoPrefix
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
    r = RegionRouter(TwoLayerConfig(region="us", remote="cost", cost=dict(GEOPREFIX_COST)), geo)
    assert r.heartbeat(0, 3.0, queued_tokens=0.0).extra["t_p_s"] == TP


def test_geoprefix_prices_the_residual_prefill_for_the_requests_in_flight_at_the_replica():
    geo = cost_policy("geoprefix", match_half_life_s=None, q_hat=0.0)  # w_shared = 1 by default
    gorgo = cost_policy("gorgo", tp_scope="pooled", match_half_life_s=None, q_hat=0.0)
    assert gorgo.config.w_shared == 0.0 and geo.config.w_shared == 1.0
    for pol in (geo, gorgo):
        pol.on_dispatch(rq("m", P + "x" * 400), "a", 0.0)  # a holds the prefix
        for i in range(3):
            pol.on_dispatch(rq(f"b{i}", f"{i}" * 3000), "b", 0.0)  # b: 3 requests in flight, no prefix
    req = rq("n", P[:1024] + "y" * 1424)  # 612 tokens; a matches 1024 chars = 256 tokens
    c = geo.costs(req, ["a", "b"], 0.1)
    assert c["a"] == pytest.approx(TP * 356 + TP * 356 * 1)
    assert c["b"] == pytest.approx(TP * 612 + TP * 612 * 3)
    assert gorgo.costs(req, ["a", "b"], 0.1) == {"a": pytest.approx(TP * 356), "b": pytest.approx(TP * 612)}


# ----------------------------------------------------------------------------- region layer
def region(name="us", policy="geoprefix", targets=("us-0", "us-1"), **two):
    local = build_policy({"name": policy, "prefix": FIXED, "ttft": {"prior_tp_s": TP}}, targets=list(targets)) \
        if policy in ("gorgo", "geoprefix", "flowkv", "gorgo_proxy") else build_policy(policy, targets=list(targets))
    for t in targets:
        local.on_stats(t, ReplicaStats(max_num_seqs=64, timestamp=0.0))
    return RegionRouter(TwoLayerConfig(region=name, **two), local)


def fill(r, now=1.0):
    for t in r.local.targets:
        r.local.on_stats(t, ReplicaStats(num_waiting=1, timestamp=now))


@pytest.mark.parametrize("name", NEW)
def test_every_new_policy_runs_through_a_region_router(name):
    r = region(policy=name, remote="cost")
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.1))
    d = r.decide(rq(0, "hello " * 200), 1.0)
    assert d.kind == "local" and d.target in ("us-0", "us-1")
    r.on_dispatch(rq(0, "hello " * 200), d.target, 1.0)
    r.local.on_complete("r0", d.target, 1.5, ttft_s=0.3)
    assert r.local.tracker.outstanding(d.target) == 0


@pytest.mark.parametrize("preset, expect", [(GORGO_COST, "eu"), (GEOPREFIX_COST, "asia")])
def test_remote_queue_is_what_separates_gorgo_from_geoprefix(preset, expect):
    r = region(policy="gorgo" if preset is GORGO_COST else "geoprefix", remote="cost", cost=preset, tau=2)
    fill(r)
    r.set_queue(0, 0)
    # eu: near but its LB holds 2 requests of 40k tokens over 1 replica; asia: far, empty
    r.update_peer(PeerState("eu", 1, 2, 1.0, rtt_s=0.05, extra={"queued_tokens": 80_000, "replicas": 1}))
    r.update_peer(PeerState("asia", 2, 0, 1.0, rtt_s=0.2, extra={"queued_tokens": 0, "replicas": 2}))
    d = r.decide(rq(0, "q" * 4000), 1.0)
    assert d.kind == "forward" and d.target == expect and d.reason == "cost"
    costs = r.selector.last_costs
    assert costs["asia"] == pytest.approx(0.2 + TP * 1000)
    if preset is GORGO_COST:
        assert costs["eu"] == pytest.approx(0.05 + TP * 1000)  # the remote queue is left out
    else:
        assert costs["eu"] == pytest.approx(0.05 + TP * 1000 + TP * 80_000)


def test_cost_selector_holds_when_staying_is_cheaper_and_counts_the_local_queue():
    r = region(remote="cost", cost=GORGO_COST)
    for t in r.local.targets:  # both batches full under SP-P (no headroom), nothing waiting yet
        r.local.on_stats(t, ReplicaStats(num_waiting=0, num_running=64, max_num_seqs=64, timestamp=1.0))
    assert r.local.choose(rq(9, "x"), 1.0) is None
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.3))
    r.set_queue(1, 400)  # one request of 400 tokens held here, 2 replicas
    d = r.decide(rq(0, "q" * 4000), 1.0)
    assert d.kind == "hold" and d.reason == "stay_cheaper"
    assert r.selector.last_costs[None] == pytest.approx(TP * 1000 + TP * 400 / 2)
    r.set_queue(5, 2000)  # now: 1.0 + 1.0 > 0.3 + 1.0
    d = r.decide(rq(1, "q" * 4000), 1.0)
    assert d.kind == "forward" and d.target == "eu"


def test_geoprefix_remote_wait_staleness_and_forwards_since_heartbeat():
    r = region(remote="cost", cost=dict(GEOPREFIX_COST, staleness_scale_s=2.0), tau=5)
    fill(r)
    r.update_peer(PeerState("eu", 1, 1, 1.0, rtt_s=0.1, extra={"queued_tokens": 1000, "replicas": 2}))
    req = rq(0, "q" * 4000)
    # age 1 s: factor 1 + 1/2; wait = t_p · 1000 · 1.5 / 2
    assert r.selector.remote_wait(r, req, "eu", 2.0) == pytest.approx(TP * 1000 * 1.5 / 2)
    r.on_forward(rq(1, "a" * 2000), "eu", 1.5)  # first forward since the heartbeat: took the free replica
    assert r.selector.remote_wait(r, req, "eu", 1.0) == pytest.approx(TP * 1000 / 2)
    r.on_forward(rq(2, "b" * 2000), "eu", 1.6)  # second one queues there: +500 tokens
    assert r.selector.remote_wait(r, req, "eu", 1.0) == pytest.approx(TP * 1500 / 2)
    r.update_peer(PeerState("eu", 1, 0, 2.0, extra={"queued_tokens": 0, "replicas": 2}))  # newer heartbeat resets
    assert r.selector.remote_wait(r, req, "eu", 2.0) == 0


def test_rtt_ewma_from_probes_overrides_heartbeat_rtt():
    r = region(remote="cost", cost=GORGO_COST)
    fill(r)
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.05))
    r.update_peer(PeerState("asia", 2, 0, 1.0, rtt_s=0.10))
    assert r.decide(rq(0, "q" * 400), 1.0).target == "eu"
    for s in (0.5, 0.5, 0.5):
        r.observe_rtt("eu", s)
    assert r.selector.rtt_of(r, "eu") == pytest.approx(0.5)
    assert r.decide(rq(1, "q" * 400), 1.0).target == "asia"
    t = RttTable(alpha=0.5)
    t.observe("x", 0.2)
    assert t.observe("x", 0.4) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="RTT"):
        t.observe("x", -1)


def test_snapshot_match_lowers_a_peers_cost():
    r = region(remote="cost", cost=GORGO_COST, snapshot=FIXED)
    fill(r)
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.10))
    r.update_peer(PeerState("asia", 2, 0, 1.0, rtt_s=0.15))
    r.on_forward(rq(0, P + "a" * 1952), "asia", 1.0)
    d = r.decide(rq(1, P + "b" * 1952), 1.1)  # asia: 0.15 + 0.488 < eu: 0.1 + 1.0
    assert d.kind == "forward" and d.target == "asia" and d.matched == 2048
    assert r.selector.last_costs["asia"] == pytest.approx(0.15 + TP * (1000 - 512))


def test_heartbeat_carries_queue_tokens_replicas_and_t_p():
    r = region(remote="cost")
    hb = r.heartbeat(3, 2.0, queued_tokens=1200)
    assert hb.queue_len == 3 and hb.extra == {"replicas": 2, "t_p_s": pytest.approx(TP), "inflight": 0,
                                              "queued_tokens": 1200.0}
    r.on_dispatch(rq(0, "x" * 400), "us-0", 2.1)
    assert r.heartbeat(3, 2.5).extra["inflight"] == 1  # requests in flight at this region's replicas
    plain = region(policy="skylb")  # SkyLB modes keep their heartbeat unchanged
    assert plain.heartbeat(0, 2.0).extra == {}


@pytest.mark.parametrize("w_shared, expect", [(0.0, "ca"), (1.0, "au")])
def test_peer_recompute_is_priced_for_the_requests_in_flight_there(w_shared, expect):
    r = region(remote="cost", cost={**GEOPREFIX_COST, "w_shared": w_shared}, snapshot=FIXED)
    fill(r)  # no local replica available
    r.update_peer(PeerState("ca", 2, 0, 1.0, rtt_s=0.02, extra={"replicas": 2, "inflight": 60}))  # near, 30/replica
    r.update_peer(PeerState("au", 2, 0, 1.0, rtt_s=0.2, extra={"replicas": 2, "inflight": 0}))  # far, idle
    req = rq(1, "q" * 4000)  # 1000 tokens, cached nowhere
    d = r.decide(req, 1.1)
    assert d.kind == "forward" and d.target == expect
    c = r.selector.last_costs
    # ca: 0.02 + 1.0 (+ 1.0 × 30 in flight per replica); au: 0.2 + 1.0
    assert c["ca"] == pytest.approx(0.02 + TP * 1000 * (1 + 30 * w_shared))
    assert c["au"] == pytest.approx(0.2 + TP * 1000)
    if w_shared:  # forwards since the heartbeat count as in flight there
        r.on_forward(req, "au", 1.2)
        assert r.selector.peer_inflight(r, "au") == pytest.approx(0.5)
    assert GORGO_COST.get("w_shared", 0.0) == 0.0  # GORGO's selector is unchanged


# ----------------------------------------------------------------------------- data residency
@pytest.mark.parametrize("remote", ["prefix", "ring", "nearest", "cost"])
def test_tenant_regions_bound_every_forward_path(remote):
    r = region(remote=remote, tenant_regions={"acme": {"asia"}, "local": {"us"}})
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.05))
    r.update_peer(PeerState("asia", 2, 0, 1.0, rtt_s=0.2))
    d = r.decide(rq(0, "q" * 400, tenant="acme"), 1.0)  # local available but not allowed for acme
    assert d.kind == "forward" and d.target == "asia"
    fill(r)
    for i in range(10):
        d = r.decide(rq(10 + i, "q%d" % i * 100, tenant="acme"), 1.1)
        assert d.kind == "forward" and d.target == "asia"
        assert r.decide(rq(30 + i, "q%d" % i * 100, tenant="local"), 1.1).kind == "hold"
    assert r.decide(rq(50, "q" * 40), 1.1).target in ("eu", "asia")  # no tenant: any region
    d = r.decide(rq(51, "q" * 40, tenant="acme", allowed_regions={"eu"}), 1.1)
    assert d.kind == "reject" and "tenant" in d.reason
    assert r.available_peers(1.1, rq(52, "x", tenant="acme")) == ["asia"]


def test_tenant_regions_validation_names_the_field():
    with pytest.raises(ValidationError, match="tenant_regions"):
        TwoLayerConfig(region="us", tenant_regions={"acme": set()})
    with pytest.raises(ValidationError, match="tenant_regions"):
        TwoLayerConfig(region="us", tenant_regions={"acme": {"bad region!"}})


# ----------------------------------------------------------------------------- build + config errors
@pytest.mark.parametrize("name", NEW)
def test_builds_from_name_and_dict(name):
    a = build_policy(name, targets=["x"])
    b = build_policy({"name": name, "seed": 3}, targets=["x"])
    assert a.name == b.name == name and b.config.seed == 3
    assert a.choose(rq(0, "hi there"), 0.0).target == "x"


@pytest.mark.parametrize("spec, field", [
    ({"name": "gorgo", "q_hat": -1}, "q_hat"),
    ({"name": "gorgo", "ttft": {"window": 2}}, "ttft.window"),
    ({"name": "gorgo_proxy", "chars_per_token": 0}, "chars_per_token"),
    ({"name": "vllm_default", "capacity_tokens": 0}, "capacity_tokens"),
    ({"name": "jsq_load", "bogus": 1}, "bogus"),
    ({"name": "br0", "decode_tps": -1}, "decode_tps"),
    ({"name": "flowkv", "eps_low": 0.9, "eps_high": 0.5}, "eps_high"),
    ({"name": "flowkv", "window_s": 0}, "window_s"),
    ({"name": "geoprefix", "min_match_chars": -5}, "min_match_chars"),
    ({"name": "geoprefix", "match_half_life_s": 0}, "match_half_life_s"),
])
def test_bad_config_is_a_validation_error_naming_the_field(spec, field):
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        build_policy(spec)


@pytest.mark.parametrize("cfg, field", [({"remote": "cost", "cost": {"rtt_alpha": 0}}, "cost.rtt_alpha"),
                                        ({"cost": {"remote_queue": "maybe"}}, "cost.remote_queue"),
                                        ({"cost": {"ttft": {"prior_tp_s": 0}}}, "cost.ttft.prior_tp_s"),
                                        ({"cost": {"stay_slot_wait": "maybe"}}, "cost.stay_slot_wait"),
                                        ({"cost": {"drain_window_s": 0}}, "cost.drain_window_s"),
                                        ({"cost": {"drain_window_s": float("inf")}}, "cost.drain_window_s"),
                                        ({"cost": {"drain_min_samples": 1}}, "cost.drain_min_samples")])
def test_two_layer_cost_config_errors_name_the_field(cfg, field):
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        TwoLayerConfig(region="us", **cfg)
    with pytest.raises(ValidationError):
        CostSelector(cfg.get("cost"))


def test_stay_cost_leaves_the_in_flight_term_out_when_peers_do_not_report_it():
    r = region(remote="cost", cost=dict(GEOPREFIX_COST), snapshot=FIXED)
    fill(r)
    for i in range(4):
        r.on_dispatch(rq(f"l{i}", f"{i}" * 800), "us-0", 0.5)  # 4 requests in flight here
    req = rq(1, "q" * 4000)
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.1))  # a heartbeat without 'inflight' (e.g. an old peer)
    r.decide(req, 1.1)
    no_count = r.selector.last_costs[None]
    r.update_peer(PeerState("eu", 2, 0, 1.05, rtt_s=0.1, extra={"replicas": 2, "inflight": 0}))
    r.decide(req, 1.1)
    assert r.selector.last_costs[None] == pytest.approx(no_count + TP * 1000 * 4 / 2)


# ----------------------------------------------------------------------------- wait for a local slot
def test_drain_rate_window_min_samples_and_bounded_memory():
    d = DrainRate(window_s=10.0, min_samples=3)
    assert d.rate(0.0) is None
    d.observe(1.0)
    d.observe(2.0)
    assert d.rate(2.0) is None  # 2 < min_samples: unknown
    d.observe(5.0)
    assert d.rate(5.0) == pytest.approx(3 / 4.0)  # 3 completions since t=1
    assert d.rate(9.0) == pytest.approx(3 / 8.0)  # no completion since: the rate decays
    assert d.rate(11.5) is None and len(d) == 2  # t=1 left the window (trimmed on the query)
    d.observe(4.0)  # out of order: counted as the newest (5.0), timestamps stay sorted
    assert d.rate(12.0) == pytest.approx(3 / 10.0)
    d.observe(30.0)
    assert len(d) == 1  # an observe trims too
    small = DrainRate(window_s=100.0, min_samples=2, max_samples=4)
    for i in range(1000):
        small.observe(i * 0.01)
    assert len(small) == 4  # memory bounded; the rate is over the span of the kept samples
    assert small.rate(9.99) == pytest.approx(4 / 0.03)
    for kw, field in (({"window_s": 0}, "drain_window_s"), ({"window_s": float("nan")}, "drain_window_s"),
                      ({"min_samples": 1}, "drain_min_samples"), ({"min_samples": 5, "max_samples": 4}, "max_samples")):
        with pytest.raises(ValueError, match=field):
            DrainRate(**kw)
    with pytest.raises(ValueError, match="finite"):
        d.observe(float("nan"))


def _saturated(cost, **two):
    """Both local replicas unavailable (SP-P: something waiting), 3 requests ahead at this LB."""
    r = region(remote="cost", cost=cost, **two)
    fill(r)
    r.set_queue(3, 0.0)
    assert not r.local.tracker.available
    return r


def test_stay_cost_adds_the_slot_wait_when_no_local_replica_is_available():
    req = rq(0, "q" * 4000)
    on = _saturated(dict(GEOPREFIX_COST, q_hat=2.0))
    off = _saturated(dict(GEOPREFIX_COST, q_hat=2.0, stay_slot_wait=False))
    base = off.selector.local_cost(off, req, 10.0)
    for t in (6.0, 7.0, 8.0):  # 3 completions < drain_min_samples = 4: rate unknown, no term
        on.on_local_complete(t)
        off.on_local_complete(t)
    assert on.selector.local_cost(on, req, 10.0) == pytest.approx(base) and on.selector.last_slot_wait_s == 0.0
    on.on_local_complete(9.0)  # 4 completions since t=6: 4 / (10 - 6) = 1 per second
    assert on.selector.drain.rate(10.0) == pytest.approx(1.0)
    assert on.selector.local_cost(on, req, 10.0) == pytest.approx(base + 2.0 * (3 + 1) / 1.0)
    assert on.selector.last_slot_wait_s == pytest.approx(4.0)
    on.set_queue(0, 0.0)  # the head of the queue: one slot's wait
    assert on.selector.local_cost(on, req, 10.0) == pytest.approx(base + 2.0 * 1 / 1.0)
    assert off.selector.local_cost(off, req, 10.0) == pytest.approx(base)  # off: never the term
    # a local replica is available: staying is not waiting for a slot, no term
    on.local.on_stats("us-0", ReplicaStats(max_num_seqs=64, timestamp=2.0))
    off.local.on_stats("us-0", ReplicaStats(max_num_seqs=64, timestamp=2.0))
    assert on.local.tracker.available
    assert on.selector.local_cost(on, req, 10.0) == pytest.approx(off.selector.local_cost(off, req, 10.0))
    assert on.selector.last_slot_wait_s == 0.0


def test_slot_wait_turns_a_hold_into_a_forward_in_geoprefix_only():
    """Saturated us, idle eu 100 ms away: by prefill work staying is cheaper (the forward pays the RTT);
    once us has measured that its slots free at 2/s, GeoPrefix forwards. GORGO's selector (no such
    term, as in the paper) keeps holding on the same inputs."""
    def run(cost):
        r = region(remote="cost", cost=dict(cost), policy="gorgo" if cost is GORGO_COST else "geoprefix")
        for t in r.local.targets:  # both batches full under SP-P, nothing waiting in the engines
            r.local.on_stats(t, ReplicaStats(num_waiting=0, num_running=64, max_num_seqs=64, timestamp=1.0))
        r.set_queue(0, 0.0)
        r.update_peer(PeerState("eu", 2, 0, 9.9, rtt_s=0.1, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
        r.observe_rtt("eu", 0.1)
        first = r.decide(rq(0, "q" * 400), 10.0).kind
        for i in range(8):  # 8 completions in the last 4 s
            r.on_local_complete(10.0 + 0.5 * i)
        return first, r.decide(rq(1, "q" * 400), 13.5), r
    first, d, r = run(GEOPREFIX_COST)
    assert first == "hold" and d.kind == "forward" and d.target == "eu", r.selector.last_costs
    assert r.selector.last_slot_wait_s == pytest.approx(3.5 / 8)
    first, d, r = run(GORGO_COST)
    assert first == "hold" and (d.kind, d.reason) == ("hold", "stay_cheaper"), r.selector.last_costs
    assert not CostSelectorConfig(**GORGO_COST).stay_slot_wait and r.selector.last_slot_wait_s == 0.0


def test_on_local_complete_without_the_cost_selector_is_a_no_op():
    r = region(remote="prefix")
    assert r.selector is None
    r.on_local_complete(1.0)  # nothing to feed, nothing raised


def test_the_simulator_feeds_every_local_completion_to_the_drain_rate():
    from ray_geolb.sim.deploy import deployment_for
    from ray_geolb.sim.simulator import SimConfig, Simulator
    from ray_geolb.sim.workloads import tot

    wl = tot(2, clients={"us": 12, "eu": 4, "asia": 4}, seed=0)
    sim = Simulator(wl, deployment_for("geoprefix", {"us": 1, "eu": 1, "asia": 1}), SimConfig(duration_s=8.0))
    seen = {}
    for lb in sim.lbs.values():
        orig = lb.router.selector.on_local_complete
        seen[lb.region] = []
        lb.router.selector.on_local_complete = (lambda o, l: lambda now: (l.append(now), o(now)))(orig, seen[lb.region])
    done = {}
    for lb in sim.lbs.values():
        orig = lb.policy.on_complete
        done[lb.region] = []
        lb.policy.on_complete = (lambda o, l: lambda rid, *a, **k: (l.append(a[1]), o(rid, *a, **k)))(orig, done[lb.region])
    sim.run()
    assert sum(map(len, done.values())) > 20
    assert seen == done  # one drain sample per local completion, at the time the LB saw it
    assert all(lb.router.selector.config.stay_slot_wait for lb in sim.lbs.values())
    assert all(len(lb.router.selector.drain) for lb in sim.lbs.values() if done[lb.region])


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
