"""GORGO v2 (the rewritten 2026 paper): the cost w_rtt·RTT_ms + w_prefill·uncached + w_load·queued on a
hand-computed case, the online (1+1)-ES tuner on synthetic feedback, config errors naming the field, and
the central-proxy deployment in a tiny simulation."""

import math

import pytest
from pydantic import ValidationError

from policy_cases import FIXED, P, rq
from ray_geolb.policy import RouteRequest, build_policy
from ray_geolb.policy.gorgo_tuner import EvolutionStrategy, OnlineWeightTuner, nearest_rank_percentile

RTT = {"near": 0.010, "far": 0.100}  # seconds proxy -> replica


def gorgo2(targets=("near", "far"), **over):
    cfg = {"prefix": FIXED, "tune": {"enabled": False}, **over}
    pol = build_policy({"name": "gorgo2", **cfg}, targets=list(targets))
    pol.rtt_of_target = RTT.get
    return pol


def test_cost_is_rtt_ms_plus_uncached_plus_queued_tokens():
    pol = gorgo2()  # the paper's starting weights: w_rtt 0.5 per ms, w_prefill 1, w_load 0.1 per token
    assert pol.weights == {"w_rtt": 0.5, "w_prefill": 1.0, "w_load": 0.1}
    # nothing cached anywhere: 1000 uncached tokens each, so the nearer replica wins on RTT alone
    fresh = rq(0, "q" * 4000)  # 4000 chars = 1000 tokens
    assert pol.scores(fresh, ["near", "far"]) == pytest.approx({"near": 5 + 1000, "far": 50 + 1000})
    assert pol.choose(fresh, 0.0).target == "near"
    # 'far' was sent a prompt with the same 2048-char (512-token) prefix, still in flight (1000 queued tokens)
    pol.on_dispatch(rq(1, P + "x" * 1952), "far", 0.0)
    assert pol.queued_prompt_tokens("far") == 1000  # all of the prompt, not discounted by cache hits
    req = rq(2, P + "y" * 1952)
    s = pol.scores(req, ["near", "far"])
    # near: 0.5·10 ms + 1000 uncached; far: 0.5·100 ms + (1000 − 512) uncached + 0.1·1000 queued
    assert s == pytest.approx({"near": 1005.0, "far": 50 + 488 + 100})
    d = pol.choose(req, 0.0)
    assert d.target == "far" and d.matched == 2048 and d.reason == "gorgo2_cost"  # the cache hit pays its RTT
    pol.on_complete("r1", "far", 1.0)  # completion releases the queued tokens
    assert pol.queued_prompt_tokens("far") == 0
    assert pol.scores(req, ["near", "far"])["far"] == pytest.approx(538.0)
    # a heavier load weight: the same in-flight request now outweighs the cache hit (1538 > 1005)
    heavy = gorgo2(w_load=1.0)
    heavy.on_dispatch(rq(1, P + "x" * 1952), "far", 0.0)
    assert heavy.scores(req, ["near", "far"]) == pytest.approx({"near": 1005.0, "far": 1538.0})
    assert heavy.choose(req, 0.0).target == "near"
    # ties go to the first replica in target order (their min() over the replica list)
    flat = gorgo2(w_rtt=0.0)
    assert flat.choose(rq(3, "z" * 400), 0.0).target == "near"


def test_no_rtt_hook_means_no_network_term_and_a_bad_rtt_is_refused():
    pol = build_policy({"name": "gorgo2", "prefix": FIXED}, targets=["a", "b"])
    assert pol.rtt_of_target is None and pol.rtt_ms("a", rq(0, "x")) == 0.0
    pol.rtt_of_target = lambda target, r: 0.0 if r.region == "eu" and target == "b" else 0.2  # (target, req)
    assert pol.choose(rq(1, "w" * 400, region="eu"), 0.0).target == "b"
    pol.rtt_of_target = lambda t: -1.0
    with pytest.raises(ValueError, match="RTT"):
        pol.choose(rq(2, "v" * 400), 0.0)
    with pytest.raises(TypeError, match="rtt_of_target"):
        pol.rtt_of_target = 3


def test_es_acceptance_and_one_fifth_rule_follow_the_authors_code():
    es = EvolutionStrategy({"w": 1.0}, {"w": (0.1, 10.0)}, sigma=0.5, success_window=8, seed=0)
    assert es.propose() == {"w": 1.0}  # the baseline: the starting weights themselves
    assert es.report({"w": 1.0}, -1.0) and es.best_score == -1.0
    # theirs: accepted iff score > best·(1 + tol); with a negative score that admits up to 0.5 % worse
    assert es.report({"w": 2.0}, -1.004) and es.best == {"w": 2.0}
    assert not es.report({"w": 3.0}, -1.1) and es.best == {"w": 2.0}
    for _ in range(6):  # 1 success in 8: below 1/5, sigma shrinks by 0.817 once the window is full
        es.report({"w": 3.0}, -9.0)
    assert es.sigma == pytest.approx(0.5 * 0.817)
    for i in range(8):  # all successes: sigma grows after each report
        es.report({"w": 2.0}, -0.5 / (i + 1))
    assert es.sigma > 0.5
    with pytest.raises(ValueError, match="w: lower bound must be > 0"):
        EvolutionStrategy({"w": 1.0}, {"w": (0.0, 1.0)})


def test_a_step_past_the_float_range_lands_on_the_box_edge_instead_of_raising():
    """Over a long run the 1/5 rule can grow sigma without bound (a simulated us outage did: OverflowError in
    ``math.exp``). Such a step is clipped to the weight's box, up or down, and the search goes on."""
    es = EvolutionStrategy({"w": 1.0, "v": 2.0}, {"w": (0.1, 10.0), "v": (0.5, 4.0)}, sigma=0.5, seed=1,
                           max_steps=10_000)
    es.report(es.propose(), -1.0)
    seen = set()
    for _ in range(64):
        es.sigma = 1e6  # where the rule took it (each failed report shrinks it again)
        cand = es.propose()
        assert set(cand) == {"w", "v"} and 0.1 <= cand["w"] <= 10.0 and 0.5 <= cand["v"] <= 4.0
        seen.add(cand["w"])
        es.report(cand, -2.0)
    assert seen == {0.1, 10.0}  # both edges, nothing in between at that sigma
    es.sigma = float("inf")
    assert all(0.1 <= es.propose()["w"] <= 10.0 for _ in range(8))


def test_tuner_moves_weights_towards_lower_p95_ttft_and_stays_in_the_box():
    """Synthetic feedback: every request's TTFT is a function of the live weights, lowest at w_rtt = 1.5
    and at the w_load box's floor; from the paper's start (0.5, 0.1) the ES must move w_rtt up and
    w_load down, never propose outside [0.05, 2] x [0.05, 0.5], and pin its best weights when it stops."""
    live = {"w_rtt": 0.5, "w_load": 0.1}
    seen = []

    def apply(w):
        assert 0.05 <= w["w_rtt"] <= 2.0 and 0.05 <= w["w_load"] <= 0.5, w
        seen.append(dict(w))
        live.update(w)

    def ttft(w):
        return 1.0 + math.log(w["w_rtt"] / 1.5) ** 2 + 0.5 * math.log(w["w_load"] / 0.05)

    tuner = OnlineWeightTuner(dict(live), {"w_rtt": (0.05, 2.0), "w_load": (0.05, 0.5)}, apply,
                              window_size=32, hop_size=32, seed=3)
    for _ in range(31):  # no step before a full window
        assert tuner.observe(ttft(live)) is None
    start = ttft(live)
    n = 31
    while tuner.enabled and n < 200_000:
        tuner.observe(ttft(live))
        n += 1
    assert not tuner.enabled and tuner.steps > 10  # the ES stopped (sigma fell below sigma_min)
    best = tuner.es.best
    assert live == best  # the best weights are pinned when it stops
    assert best["w_rtt"] > 0.5 and best["w_load"] < 0.1  # moved in the direction that lowers p95 TTFT
    assert best["w_rtt"] == pytest.approx(1.5, rel=0.25) and best["w_load"] == pytest.approx(0.05, rel=0.25)
    assert ttft(best) < start and -tuner.es.best_score == pytest.approx(ttft(best))
    assert len(seen) == tuner.steps + 1


def test_tuner_steps_every_hop_on_the_trailing_window():
    tuner = OnlineWeightTuner({"w_rtt": 0.5}, {"w_rtt": (0.05, 2.0)}, lambda w: None, window_size=8, hop_size=4,
                              seed=0)
    wrote = [tuner.observe(0.1 * i) is not None for i in range(16)]
    # first step once 8 samples exist (sample 8), then every 4: samples 12 and 16
    assert [i + 1 for i, w in enumerate(wrote) if w] == [8, 12, 16]
    assert tuner.es.best_score == pytest.approx(-0.7)  # baseline: p95 of samples 0..0.7 (nearest rank)
    assert nearest_rank_percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and nearest_rank_percentile([], 0.95) == 0.0


def test_policy_feeds_completed_ttfts_to_the_tuner_and_writes_the_live_weights():
    pol = build_policy({"name": "gorgo2", "prefix": FIXED, "tune": {"window_size": 4, "hop_size": 2}},
                       targets=["a", "b"])
    assert pol.tuner is not None and pol.weights["w_rtt"] == 0.5
    for i in range(4):
        pol.on_dispatch(rq(i, "p" * 400), "a", 0.0)
        pol.on_complete(f"r{i}", "a", 1.0, ttft_s=0.2)
    assert pol.tuner.steps == 1 and pol.weights["w_rtt"] != 0.5 and pol.weights["w_prefill"] == 1.0
    assert 0.05 <= pol.weights["w_rtt"] <= 2.0 and 0.05 <= pol.weights["w_load"] <= 0.5
    pol.observe_ttft("a", 100, 0.2)  # replica-reported samples feed it too
    assert pol.tuner.samples_seen == 5
    pol.observe_ttft("elsewhere", 100, 0.2)  # not one of its targets: ignored
    assert pol.tuner.samples_seen == 5
    assert pol.describe()["tuner"]["steps"] == 1
    assert build_policy({"name": "gorgo2", "tune": {"enabled": False}}).tuner is None


@pytest.mark.parametrize("cfg, field", [
    ({"w_rtt": -1.0}, "w_rtt"),
    ({"tune": {"ranges": {"w_rtt": [0.0, 2.0]}}}, "tune.ranges"),
    ({"tune": {"ranges": {"w_rtt": [2.0, 1.0]}}}, "tune.ranges"),
    ({"tune": {"ranges": {"w_foo": [0.1, 1.0]}}}, "tune.ranges"),
    ({"tune": {"ranges": {}}}, "tune.ranges"),
    ({"tune": {"objective": "neg_p42_vibes"}}, "tune.objective"),
    ({"tune": {"hop_size": 0}}, "tune.hop_size"),
    ({"tune": {"sigma_decay": 1.5}}, "tune.sigma_decay"),
    ({"tune": {"bogus": 1}}, "tune.bogus"),
])
def test_bad_config_names_the_field(cfg, field):
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        build_policy({"name": "gorgo2", **cfg})


def test_a_tuned_weight_must_start_positive():
    with pytest.raises(ValidationError, match="w_load must be > 0"):
        build_policy({"name": "gorgo2", "w_load": 0.0})
    build_policy({"name": "gorgo2", "w_load": 0.0, "tune": {"enabled": False}})  # fixed weights may be 0


def test_the_paper_deployment_is_one_central_proxy_and_tunes_in_a_tiny_simulation():
    from ray_geolb.sim.deploy import deployment_for
    from ray_geolb.sim.scenarios import build_workload, remap_regions
    from ray_geolb.sim.simulator import SimConfig, Simulator

    reps = {"us-west": 1, "germany": 1, "israel": 1}
    kw = dict(network="gorgo", central_region="us-west", profile="mistral-7b-a100")
    static = deployment_for("gorgo2-static", reps, **kw)
    assert static.lb_kind == "central" and static.rtt_aware
    assert static.policy == {"name": "gorgo2", "w_rtt": 0.276, "w_load": 0.5, "tune": {"enabled": False}}
    dep = deployment_for("gorgo2", reps, policy={"name": "gorgo2", "tune": {"window_size": 8, "hop_size": 4}}, **kw)
    assert dep.lb_kind == "central" and dep.rtt_aware
    wl = build_workload({"name": "conversation:wildchat", "kw": {"clients": {"us": 2, "eu": 2, "asia": 2},
                                                                "seed": 0}})
    wl = remap_regions(wl, {"us": "us-west", "eu": "germany", "asia": "israel"})
    sim = Simulator(wl, dep, SimConfig(duration_s=20.0, seed=0))
    res = sim.run()
    assert res.requests
    pol = sim.lbs["us-west"].policy
    assert pol.tuner.samples_seen >= 8 and pol.tuner.steps >= 1  # the simulator's LB-side TTFTs drive the ES
    assert 0.05 <= pol.weights["w_rtt"] <= 2.0 and 0.05 <= pol.weights["w_load"] <= 0.5
    # the network term in ms: client (US-West) -> proxy (US-West) -> replica (Germany), 281 ms
    assert pol.rtt_ms("germany-0", RouteRequest("x", "hi", region="us-west")) == pytest.approx(281.0)
