"""TTFT feedback and heartbeat extras without a Ray cluster: ReplicaStats.ttft_samples parsing,
Policy.observe_ttft, GeoPrefixRouter feeding reported samples to its policy, the emulated engine's
samples, and the ingress's live local view under the region layer's cost selector."""

import asyncio
import math
import random

import pytest
from fakes import fake_replica, fake_router_view, offline_router

from ray_geolb.policy import ReplicaStats, RouteRequest, build_policy
from ray_geolb.policy.availability import MAX_TTFT_SAMPLES
from ray_geolb.policy.region import GEOPREFIX_COST, GORGO_COST, CostSelector, PeerState, RegionRouter, TwoLayerConfig
from ray_geolb.policy.ttft_model import POOLED
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.ingress.admission import Waiter


# ---------------------------------------------------------------------------------------------- parsing
def test_ttft_samples_parse_and_default():
    s = ReplicaStats.from_dict({"num_waiting": 0, "ttft_samples": [[100, 0.05], (2000, 0.3)]})
    assert s.ttft_samples == ((100.0, 0.05), (2000.0, 0.3))
    assert ReplicaStats.from_dict({"num_waiting": 1}).ttft_samples is None
    assert ReplicaStats.from_dict({"ttft_samples": []}).ttft_samples is None
    assert ReplicaStats.from_dict({"ttft_samples": None}).ttft_samples is None


@pytest.mark.parametrize("bad, needle", [
    ("1,2", "list of"),
    ({"a": 1}, "list of"),
    ([[1, 2, 3]], r"ttft_samples\[0\] must be an"),
    ([[1, 0.1], [5]], r"ttft_samples\[1\] must be an"),
    ([[-1, 0.1]], "uncached tokens"),
    ([[10, -0.1]], "ttft_s"),
    ([[10, float("nan")]], "finite"),
    ([[10, float("inf")]], "finite"),
    ([[True, 0.1]], "must be a number"),
    ([["10", 0.1]], "must be a number"),
    ([[10, 0.1]] * (MAX_TTFT_SAMPLES + 1), "at most"),
])
def test_bad_ttft_samples_are_a_clear_error(bad, needle):
    with pytest.raises(ValueError, match=needle):
        ReplicaStats.from_dict({"num_waiting": 0, "ttft_samples": bad})


# ---------------------------------------------------------------------------------------------- policies
#: GeoPrefix with its t_p fitted on TTFT samples (GORGO's way; GeoPrefix's default fits engine step work)
TTFT_FITTED = {"name": "geoprefix", "ttft": {"source": "ttft"}}


def test_base_policy_ignores_samples_cost_policy_learns_t_p():
    sky = build_policy("skylb", targets=["a"])
    sky.observe_ttft("a", 1000, 0.5)  # no TTFT model: a no-op, no error
    geo = build_policy(TTFT_FITTED, targets=["a", "b"])  # a cost policy that fits TTFT samples
    prior = geo.config.ttft.prior_tp_s
    assert geo.pooled_t_p() == pytest.approx(prior) and geo.ttft.line()[2] == "prior"
    rate, base = 3e-4, 0.04  # faster than the prior floor? no: slower, so the floored value moves
    rng = random.Random(0)
    for i in range(40):
        x = rng.randint(100, 4000)
        geo.observe_ttft("a" if i % 2 else "b", x, base + rate * x)
    geo.observe_ttft("gone", 1000, 99.0)  # not a target: ignored
    assert geo.ttft.samples(POOLED) == 40
    assert geo.pooled_t_p() == pytest.approx(rate, rel=1e-6)
    assert geo.ttft.line()[0] == pytest.approx(base, rel=1e-6)


def test_simulator_path_still_learns_from_on_complete():
    """observe_ttft is additive: the simulator's on_complete(..., ttft_s=) path is unchanged."""
    geo = build_policy("gorgo", targets=["a"])
    for i in range(12):
        req = RouteRequest(request_id=f"r{i}", text=f"{i} " + "x" * (400 * (i + 1)))  # no shared prefix
        geo.on_dispatch(req, "a", float(i))
        geo.on_complete(req.request_id, "a", float(i) + 1, ttft_s=0.01 + 1e-3 * req.prompt_tokens, req=req)
    assert geo.ttft.samples("a") == 12 and geo.ttft.t_p() == pytest.approx(1e-3, rel=0.02)


# ---------------------------------------------------------------------------------------------- router feed
def test_router_feeds_reported_samples_once_per_report():
    from ray_geolb.serve.router import DEFAULT_POLICY

    r = offline_router(policy=TTFT_FITTED)
    assert r.policy.name == DEFAULT_POLICY == "geoprefix"
    base = {"num_waiting": 0, "num_running": 0, "max_num_seqs": 8}
    s1 = {**base, "timestamp": 1.0, "ttft_samples": [[100 * k, 0.02 + 2e-4 * 100 * k] for k in range(1, 11)]}
    reps = [fake_replica("a", s1), fake_replica("b", {**base, "timestamp": 1.0})]
    r._sync(reps)
    assert r.counters["ttft_samples"] == 10 and r.policy.ttft.samples("a") == 10
    r._sync(reps)  # the same report broadcast again (same timestamp): not fed twice
    r._sync([fake_replica("a", dict(s1)), reps[1]])  # an equal copy (same timestamp) neither
    assert r.policy.ttft.samples(POOLED) == 10
    assert r.policy.pooled_t_p() == pytest.approx(2e-4, rel=1e-6)
    # a bad report is rejected whole (counted as bad_stats) and routing state is untouched
    r._sync([fake_replica("a", {**base, "timestamp": 2.0, "ttft_samples": [[1, -5]]}), reps[1]])
    assert r.counters["bad_stats"] == 1 and r.policy.ttft.samples(POOLED) == 10
    assert r.policy.tracker.stats("a").timestamp == 1.0
    # a replica of another region: its samples are not this router's
    r2 = offline_router(region="us", policy=TTFT_FITTED)
    r2._sync([fake_replica("x", s1, region="eu"), fake_replica("y", {**base, "timestamp": 1.0}, region="us")])
    assert r2.policy.ttft.samples(POOLED) == 0 and r2.local_replica_ids() == ["y"]


def test_default_router_fits_t_p_on_the_engines_step_work():
    """GeoPrefix's default t_p source: the cumulative ``engine_work`` in each replica's report; the
    router hands the reports to the policy, which fits busy time on the work between two reports."""
    from ray_geolb.serve.router import DEFAULT_POLICY

    r = offline_router()
    assert r.policy.name == DEFAULT_POLICY and r.policy.ttft.config.source == "engine_steps"
    base_s, tp, dec = 0.02, 1.5e-4, 4e-3  # per step, per prefill token, per decode token
    work = {"a": [0.0, 0.0, 0.0, 0.0], "b": [0.0, 0.0, 0.0, 0.0]}
    rng = random.Random(1)
    for k in range(1, 30):
        reps = []
        for uid in ("a", "b"):
            steps, pre, de = rng.randint(5, 40), rng.randint(0, 20_000), rng.randint(0, 400)
            w = work[uid]
            w[0] += steps
            w[1] += pre
            w[2] += de
            w[3] += base_s * steps + tp * pre + dec * de
            reps.append(fake_replica(uid, {"num_waiting": 0, "num_running": 1, "max_num_seqs": 8, "timestamp": float(k),
                                   "engine_work": dict(zip(("steps", "prefill_tokens", "decode_tokens", "busy_s"),
                                                           w))}))
        r._sync(reps)
    assert r.policy.ttft.samples(POOLED) >= 8
    assert r.policy.pooled_t_p() == pytest.approx(tp, rel=0.05)


def test_router_queued_tokens_view():
    r = offline_router()
    assert r.queued_tokens() == 0.0
    from ray_geolb.serve.request_book import Entry

    for i, n in enumerate((100, 300)):
        req = RouteRequest(request_id=f"h{i}", text="y" * 4 * n)
        r.book.held[req.request_id] = Entry(req, None, 0.0)
    r._pending_requests_by_id = {"h0": 1, "h1": 1, "unseen": 1}  # Ray's pending queue: one not yet seen
    assert r.queued_tokens() == pytest.approx(400 + r.policy.mean_prompt_tokens)


# ---------------------------------------------------------------------------------------------- emulated engine
def test_emulated_engine_reports_wall_clock_ttft_samples_since_last_report():
    from ray_geolb.engine.profiles import get_profile
    from ray_geolb.serve.emulated import TTFT_SAMPLES_PER_REPORT, EmulatedEngine

    scale = 0.5
    eng = EmulatedEngine(time_scale=scale, output_tokens=1)
    prof = get_profile("llama3.1-8b-h100")

    async def run():
        out = []
        text = "the same long prefix " * 200
        for suffix in ("one", "two"):  # the second shares the first's cached blocks
            req = eng.make_request(text + suffix, 1, suffix)
            async for _ in eng.generate(req):
                pass
            out.append(req)
        await eng.driver.close()
        return out

    reqs = asyncio.run(run())
    st = eng.stats()
    samples = st["ttft_samples"]
    assert len(samples) == 2
    (x1, y1), (x2, y2) = samples
    assert x1 == reqs[0].prompt_tokens  # nothing cached yet
    B = eng.model.config.block_tokens
    assert x2 == reqs[1].prompt_tokens - ((reqs[1].prompt_tokens - 1) // B) * B  # all but the last block hit
    # wall clock = engine seconds x time_scale (batch size 1: overhead + one prefill step)
    expect1 = scale * prof.batch1_ttft(x1)
    assert y1 == pytest.approx(expect1, rel=0.25, abs=0.01)
    assert y2 < y1
    assert "ttft_samples" not in eng.stats()  # drained: only samples since the previous report
    assert TTFT_SAMPLES_PER_REPORT >= 64
    ReplicaStats.from_dict(st)  # what the router parses


# ---------------------------------------------------------------------------------------------- ingress view
def _fake_ingress(policy, available=0, router_queue=0, router_tokens=0.0, remote="cost"):
    from ray_geolb.serve.ingress import IngressConfig, RequestPath

    cfg = IngressConfig(region="us", peers={"eu": "geolb-eu", "asia": "geolb-asia"}, registry=None,
                        two_layer={"remote": remote, "cost": GEOPREFIX_COST})
    fake = fake_router_view(policy, slots=available, queue=router_queue, tokens=router_tokens)
    return RequestPath(cfg, geo_router=lambda: fake)  # not started: no registry link, no RTT probes


def _busy_geoprefix(n_inflight=4):
    geo = build_policy(TTFT_FITTED, targets=["r1", "r2"])
    for t in ("r1", "r2"):
        geo.on_stats(t, ReplicaStats(num_waiting=2, num_running=4, timestamp=0.0, max_num_seqs=4))
    for i in range(n_inflight):
        req = RouteRequest(request_id=f"inf{i}", text=f"in flight {i} " * 200)
        geo.on_dispatch(req, "r1" if i % 2 else "r2", 1.0)
    for i in range(10):
        geo.observe_ttft("r1", 200 * (i + 1), 0.05 + 2e-4 * 200 * (i + 1))
    return geo


def test_local_view_is_the_live_policy_and_prices_staying_like_the_simulator():
    geo = _busy_geoprefix()
    ing = _fake_ingress(geo, available=0, router_queue=3, router_tokens=900.0)
    view = ing.router.local
    assert view.targets is geo.targets and view.ttft is geo.ttft and view.index is geo.index
    assert view.pooled_t_p() == geo.pooled_t_p() == pytest.approx(2e-4)
    assert view.tracker.outstanding("r1") == 2 and view.tracker.stats("r1").num_waiting == 2
    # the simulator's RegionRouter over the real policy, with the same LB queue ahead, prices staying alike
    sim = RegionRouter(TwoLayerConfig(region="us", remote="cost", cost=GEOPREFIX_COST), geo)
    sim.set_queue(3, 900.0)
    ing.set_queue_ahead(None)
    assert (ing.router.queue_len, ing.router.queued_tokens) == (3, 900.0)
    req = RouteRequest(request_id="q", text="a new question " * 150)
    now = 5.0
    assert ing.router.selector.local_cost(ing.router, req, now) == pytest.approx(sim.selector.local_cost(sim, req, now))
    # heartbeat extras: what the simulator's RegionRouter.heartbeat sends, queue = ingress + router queue
    w = Waiter(RouteRequest(request_id="w", text="", prompt_tokens=250))
    ing.admission.queue.append(w, w)  # one request waiting at the ingress, 250 prompt tokens
    ex = ing.heartbeat_extra()
    assert ex == sim.heartbeat(4, now, queued_tokens=1150.0).extra
    assert ex["replicas"] == 2 and ex["inflight"] == 4 and ex["t_p_s"] == pytest.approx(2e-4)
    # the ingress's and the router's queues, plus the engines' backlog (what staying is priced by)
    backlog = sim.selector.engine_queued_tokens(sim, geo.mean_prompt_tokens)
    assert backlog > 0 and ex["queued_tokens"] == pytest.approx(1150.0 + backlog)


def test_saturated_region_forwards_by_relayed_extras():
    """A saturated us (no available replica) with peers whose heartbeats went through the registry:
    eu is nearer and reports an empty LB queue and a free replica, but runs a large batch (what SP-P
    availability cannot see); asia is idle. The cost selector, fed the relayed extras, prices eu's
    batch and forwards to asia; without the extras it would pick the nearer eu."""
    from ray_geolb.policy.region.peer_table import peer_states_from_table
    from ray_geolb.policy.region.registry_state import RegistryState

    reg = RegistryState()
    table = reg.heartbeat_batch([
        {"region": "eu", "available_replicas": 1, "queue_len": 0, "source": "eu-a",
         "extra": {"queued_tokens": 0.0, "inflight": 4, "t_p_s": 2e-4, "replicas": 1}},
        {"region": "eu", "available_replicas": 1, "queue_len": 0, "source": "eu-b",  # a 2nd ingress replica
         "extra": {"queued_tokens": 0.0, "inflight": 2, "t_p_s": 2e-4, "replicas": 1}},
        {"region": "asia", "available_replicas": 2, "queue_len": 0,
         "extra": {"queued_tokens": 0.0, "inflight": 0, "t_p_s": 2e-4, "replicas": 2}},
        {"region": "us", "available_replicas": 0, "queue_len": 6},
    ])
    assert table["regions"]["eu"]["extra"] == {"queued_tokens": 0.0, "inflight": 6, "t_p_s": 2e-4, "replicas": 1}
    now = policy_now()  # the ingress's clock (serve/clock.py)

    def region(with_extras):
        ing = _fake_ingress(_busy_geoprefix(), available=0, router_queue=6, router_tokens=6000.0)
        for ps in peer_states_from_table(table, now, "us"):
            if not with_extras:
                ps.extra = {"sources": ps.extra["sources"]}
            ing.router.update_peer(ps)
        ing.router.observe_rtt("eu", 0.05)
        ing.router.observe_rtt("asia", 0.15)
        return ing

    ing = region(True)
    assert ing.router.peers["eu"].extra["inflight"] == 6 and ing.router.peers["asia"].extra["replicas"] == 2
    d = ing.decide(RouteRequest(request_id="n", text="please route me " * 100))
    costs = ing.router.selector.last_costs
    assert d.kind == "forward" and d.target == "asia", (d, costs)
    assert costs["asia"] < costs["eu"] and costs["asia"] < costs[None]
    bare = region(False)
    d = bare.decide(RouteRequest(request_id="m", text="please route me " * 100))
    assert d.kind == "forward" and d.target == "eu", (d, bare.router.selector.last_costs)


def test_a_failing_decide_is_counted_and_degrades_without_retrying():
    """The local layer reads the router's published snapshot: there is no racing read to retry. A
    region layer that fails anyway is counted, and that request is decided by local availability
    at once (the next one is decided normally); residency holds on that fallback."""
    ing = _fake_ingress(_busy_geoprefix(), available=1)
    calls = {"n": 0}
    real = ing.router.decide

    def flaky(req, now, candidates=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug in the region layer")
        return real(req, now)

    ing.router.decide = flaky
    d = ing.decide(RouteRequest(request_id="z", text="hi " * 10))
    assert (d.kind, d.reason) == ("local", "local_available") and calls["n"] == 1  # no retry
    assert ing.counters["decide_errors"] == 1
    assert ing.decide(RouteRequest(request_id="z1", text="hi " * 10)).kind == "local" and calls["n"] == 2
    ing.router.decide = lambda *a: (_ for _ in ()).throw(RuntimeError("always"))
    d = ing.decide(RouteRequest(request_id="z2", text="hi " * 10))
    assert d.kind == "local" and d.reason == "local_available" and ing.counters["decide_errors"] == 2
    # residency holds on the fallback: a request that may not be served in us is never sent local
    d = ing.decide(RouteRequest(request_id="z3", text="hi " * 10, allowed_regions={"eu"}))
    assert (d.kind, d.reason) == ("hold", "decide_error") and ing.counters["decide_errors"] == 3


def test_local_view_without_router_or_with_skylb():
    from ray_geolb.policy.region import CostSelector

    ing = _fake_ingress(None, available=1)
    ing.local.geo_router = lambda: None
    assert ing.router.local.targets == [] and ing.heartbeat_extra() == {}
    assert not hasattr(ing.router.local, "pooled_t_p") and getattr(ing.router.local, "index", None) is None
    sky = build_policy("skylb", targets=["r1"])
    ing2 = _fake_ingress(sky, available=1)
    assert not hasattr(ing2.router.local, "pooled_t_p") and ing2.router.local.index is sky.index
    ex = ing2.heartbeat_extra()  # the selector's own prior t_p, as RegionRouter.heartbeat does in the simulator
    assert ex["t_p_s"] == CostSelector().ttft.config.prior_tp_s and ex["replicas"] == 1
    assert math.isfinite(ex["queued_tokens"])


def test_stay_cost_includes_the_measured_wait_for_a_local_slot():
    """Saturated us (no available replica), busy-ish peers 40-50 ms away: by prefill work alone staying
    looks cheaper; once the region has measured how fast its slots free up (2.5 completions/s), the
    wait for a slot makes the forward the cheaper option. The term is the policy core's
    (``CostSelectorConfig.stay_slot_wait``, on in GEOPREFIX_COST), fed by the ingress's completion path
    through ``RegionRouter.on_local_complete`` -- the simulator feeds the same hook."""
    geo = build_policy("geoprefix", targets=["r1"])
    geo.on_stats("r1", ReplicaStats(num_waiting=0, num_running=2, timestamp=0.0, max_num_seqs=2))
    for i in range(2):
        geo.on_dispatch(RouteRequest(request_id=f"run{i}", text=f"running {i} " * 50), "r1", 0.5)
    ing = _fake_ingress(geo, available=0)
    sel = ing.router.selector
    assert type(sel) is CostSelector and sel.config.stay_slot_wait
    now = policy_now()
    for r in ("eu", "asia"):
        ing.router.update_peer(PeerState(r, 1, 0, now, extra={"queued_tokens": 0.0, "inflight": 2, "replicas": 1}))
    ing.router.observe_rtt("eu", 0.04)
    ing.router.observe_rtt("asia", 0.05)
    req = lambda i: RouteRequest(request_id=f"b{i}", text=f"burst user {i} " * 40)  # noqa: E731
    assert ing.local_drain_rate() is None
    d = ing.decide(req(0))
    assert (d.kind, d.reason) == ("hold", "stay_cheaper") and sel.last_slot_wait_s == 0.0, sel.last_costs
    t = policy_now()
    for dt in (3.2, 2.4, 1.6, 0.8, 0.0):  # 5 completions in 3.2 s
        ing.router.on_local_complete(t - dt)
    ing.local_done()  # the ingress's own completion path feeds the same estimator (a 6th, now)
    assert ing.local_drain_rate() == pytest.approx(6 / 3.2, rel=0.05)
    assert ing.slot_wait_s(0) == pytest.approx(3.2 / 6, rel=0.05)
    d = ing.decide(req(1))
    assert d.kind == "forward" and d.target == "eu", sel.last_costs
    assert sel.last_slot_wait_s == pytest.approx(3.2 / 6, rel=0.05)  # nothing ahead: one slot's wait
    for i in range(2):
        w = Waiter(RouteRequest(request_id=f"w{i}", text=""))
        ing.admission.queue.append(w, w)
    ing.decide(req(2))
    assert sel.last_slot_wait_s == pytest.approx(3 * 3.2 / 6, rel=0.05)  # two ahead at this LB


def test_ingress_slot_wait_config_maps_onto_the_core_config():
    from pydantic import ValidationError

    from ray_geolb.serve.ingress import IngressConfig

    def cost(**kw):
        return IngressConfig(region="us", registry=None, **kw).two_layer_config().cost

    geo = {"remote": "cost", "cost": GEOPREFIX_COST}
    c = cost(two_layer=geo)  # None: the preset's own value (on for GeoPrefix)
    assert c.stay_slot_wait and (c.drain_window_s, c.drain_min_samples) == (10.0, 4)
    assert not cost(two_layer={"remote": "cost", "cost": GORGO_COST}).stay_slot_wait  # GORGO: off
    c = cost(two_layer={"remote": "cost", "cost": GORGO_COST}, stay_slot_wait=True, drain_window_s=5.0,
             drain_min_samples=3)  # the ingress fields override
    assert c.stay_slot_wait and (c.drain_window_s, c.drain_min_samples) == (5.0, 3) and not c.remote_queue
    c = cost(two_layer=geo, stay_slot_wait=False)  # turns GeoPrefix's term off, the rest of the preset kept
    assert not c.stay_slot_wait and c.remote_queue and c.w_shared == GEOPREFIX_COST.w_shared
    for bad in ({"drain_window_s": 0}, {"drain_window_s": float("inf")}, {"drain_min_samples": 1}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            IngressConfig(region="us", registry=None, **bad)
    with pytest.raises(ValidationError, match="drain_min_samples"):
        cost(two_layer={"remote": "cost", "cost": {"drain_min_samples": 0}})
