"""The simulator's per-region LBs behave as the Serve ingress does (``RegionLayerSettings``): per-forward
peer accounting, forwards past a waiting queue with the real number ahead, the queue bound (429) and
the wait limit (503), heartbeats through the registry at its period, RTTs from probes. Each test first
checks that its scenario exercises the rule (an overloaded region that holds and forwards), and turns
the rule off to show that it is what made the difference. Go / wait / refuse is one rule
(``policy/region/queue_rule.py``, its table in ``tests/policy/region/test_lb_queue_rule_says_go_wait_or_refuse.py``);
``test_the_ingress_and_the_simulated_lb_run_the_one_queue_rule`` checks that both drivers call it and do
what it says.

The scenarios overload US on an SGLang L4 engine (it reserves KV for each request's output, so its
replica reports waiting requests and SP-P holds); on the vLLM model one replica admits 256 sequences
and the region never holds at this load."""

import asyncio
from collections import Counter
from unittest import mock

import pytest

from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.region import GEOPREFIX_COST, REGION_LAYER, PeerState, RegionDecision
from ray_geolb.policy.region.queue_rule import GO, QUEUE_FULL, REFUSE, WAIT, WAIT_TIMEOUT, QueueRule
from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.metrics import summarize
from ray_geolb.sim.simulator import SimConfig, Simulator
from ray_geolb.sim.workloads import tot

SGLANG = "llama3.1-8b-l4-sglang"
REPLICAS = {"us": 1, "eu": 2, "asia": 2}


def _run(system="skylb", replicas=REPLICAS, clients=None, duration=20.0, **deploy):
    wl = tot(2, clients=clients or {"us": 30, "eu": 2, "asia": 2}, seed=0)
    events = []
    sim = Simulator(wl, deployment_for(system, replicas, profile=SGLANG, **deploy), SimConfig(duration_s=duration),
                    trace=lambda kind, info: events.append((kind, info)) if kind in ("forward", "peers") else None)
    res = sim.run()
    return sim, res, events


def _forwards_per_table(events, lb="us"):
    """Per interval between two peer tables received by ``lb``: (reported queue lengths, forwards per peer)."""
    out, reported, count = [], None, Counter()
    for kind, info in events:
        if info["lb"] != lb:
            continue
        if kind == "peers":
            if reported is not None:
                out.append((reported, count))
            reported, count = {r: q for r, (_a, q, _t) in info["peers"].items()}, Counter()
        elif reported is not None:
            count[info["target"]] += 1
    return out


def test_each_forward_counts_in_the_peers_queue_until_the_next_peer_table():
    sim, res, events = _run()
    tau = sim.lbs["us"].router.config.tau
    intervals = _forwards_per_table(events)
    assert sum(sum(c.values()) for _r, c in intervals) > 0, "precondition: US must forward"
    for reported, count in intervals:
        for peer, n in count.items():
            # forwardable while the peer's queue (reported + forwards since) is <= tau
            assert n <= max(0, tau + 1 - reported[peer]), (peer, n, reported)
    # without the accounting a burst herds onto one peer within one table's period
    _sim, _res, events = _run(region_layer={"note_forwards": False})
    assert max(max(c.values(), default=0) for _r, c in _forwards_per_table(events)) > tau + 1


def test_geoprefix_prices_its_forwards_itself_and_is_not_capped_by_the_count():
    """GeoPrefix's cost selector counts the forwards since each heartbeat in its remote-queue and in-flight
    terms (``CostSelectorConfig.forwards_cap_peers=False``), so the per-forward count no longer caps it at
    tau + 1 per table; switched back on, the same run is capped as SkyLB is."""
    sim, _res, events = _run("geoprefix")
    tau = sim.lbs["us"].router.config.tau
    assert sim.lbs["us"].router.selector.config.forwards_cap_peers is False
    per_table = [n for _r, c in _forwards_per_table(events) for n in c.values()]
    assert per_table and max(per_table) > tau + 1, per_table
    capped = {"geoprefix": {"remote": "cost", "cost": dict(GEOPREFIX_COST, forwards_cap_peers=True)}}
    _sim, _res, events = _run("geoprefix", region_layer={"peer_selectors": {**REGION_LAYER.peer_selectors, **capped}})
    intervals = _forwards_per_table(events)
    assert sum(sum(c.values()) for _r, c in intervals) > 0
    for reported, count in intervals:
        for peer, n in count.items():
            assert n <= max(0, tau + 1 - reported[peer]), (peer, n, reported)


def test_requests_behind_waiting_ones_are_forwarded_with_the_real_number_ahead():
    _sim, res, events = _run()
    fwd = [info for kind, info in events if kind == "forward"]
    assert res.counters["lb_holds"] > 0 and fwd, "precondition: US holds and forwards"
    past = [f for f in fwd if f["ahead"] > 0]
    assert past, "a request with others waiting before it was forwarded"
    assert all(f["ahead"] <= f["queued"] for f in fwd)  # ahead: requests still waiting at that LB
    # strict FCFS (forward_past_queue off): only the head is decided, with nothing ahead
    _sim, _res, events = _run(region_layer={"forward_past_queue": False})
    fwd = [info for kind, info in events if kind == "forward"]
    assert fwd and all(f["ahead"] == 0 for f in fwd)


def test_the_slot_wait_prices_the_requests_ahead():
    """GeoPrefix's stay cost includes the wait for a local slot, (ahead + 1) / drain rate: a newcomer
    behind waiting requests is priced with them (before, every decision saw 'nothing ahead')."""
    sim, res, events = _run("geoprefix", duration=30.0)
    sel = sim.lbs["us"].router.selector
    assert sel.config.stay_slot_wait and res.counters["lb_holds"] > 0
    waits = []
    orig = sel._stay_cost  # what every decision prices staying with (local_cost is it plus the match)

    def spy(router, req, now, shared, hit):
        c = orig(router, req, now, shared, hit)
        waits.append((router.queue_len, sel.last_slot_wait_s))
        return c

    sel._stay_cost = spy
    # decide a newcomer at US as the simulator does, with a queue of k ahead, at the run's end state
    lb = sim.lbs["us"]
    rate = sel.drain.rate(sim.now)
    assert rate, "precondition: US measured its drain rate"
    lb.policy.tracker.available.clear()  # saturated: staying means waiting for a slot
    for r, p in list(lb.router.peers.items()):  # every peer available (fresh, a free replica, no queue)
        lb.router.update_peer(PeerState(r, 1, 0, sim.now, rtt_s=p.rtt_s, extra=dict(p.extra or {})))
    assert lb.router.available_peers(sim.now), "precondition: US has a peer to compare staying with"
    for k in (0, 5):
        lb.router.set_queue(k, 1000.0 * k)
        lb.router.decide(RouteRequest(f"probe{k}", "x" * 400, region="us"), sim.now)
    (q0, w0), (q5, w5) = waits[-2:]
    assert (q0, q5) == (0, 5)
    assert w0 == pytest.approx(1 / rate) and w5 == pytest.approx(6 / rate)


def test_a_full_queue_refuses_and_a_long_wait_times_out_and_clients_retry():
    """The ingress's 429 (``max_queue`` already waiting) and 503 (waited ``max_wait_s``), both with
    Retry-After: the simulated client sends the same request again ``retry_after_s`` later, so a refused
    request stays in flight (not a rejection) and its latency counts from the first send."""
    local = {"us": 1}
    clients = {"us": 40}
    _s, base, _e = _run("region-local", local, clients)
    assert base.counters["lb_holds"] > 0, "precondition: the LB holds requests"
    assert base.counters["lb_queue_full"] == 0 and base.counters["lb_wait_timeout"] == 0  # the defaults: no refusal
    sim, full, _e = _run("region-local", local, clients, region_layer={"max_queue": 3})
    c = full.counters
    assert c["lb_queue_full"] > 0 and full.decisions["refused:queue_full"] == c["lb_queue_full"]
    assert max(full.samples["lb_queue"]) <= 3 and c["requests_rejected"] == 0
    assert c["requests_sent"] == c["requests_completed"] + c["in_flight_at_end"]
    assert c["requests_completed"] > 0
    sim, late, _e = _run("region-local", local, clients, region_layer={"max_wait_s": 2.0, "retry_after_s": 0.5})
    c = late.counters
    assert c["lb_wait_timeout"] > 0 and late.decisions["refused:wait_timeout"] == c["lb_wait_timeout"]
    assert all(sim.now - r.t_lb <= 2.0 for _k, r in sim.lbs["us"].queue.items())  # nobody waits longer
    assert c["requests_rejected"] == 0 and c["requests_sent"] == c["requests_completed"] + c["in_flight_at_end"]
    # a refused request was served after its retry: its LB wait alone exceeds the limit
    assert max(r[5] for r in late.requests) > 2.0
    # a central LB is not the ingress: never bounded
    _s, central, _e = _run("sp-p", local, clients, region_layer={"max_queue": 3, "max_wait_s": 2.0})
    assert central.counters["lb_queue_full"] == 0 and central.counters["lb_wait_timeout"] == 0
    assert max(central.samples["lb_queue"]) > 3


@pytest.mark.parametrize("period", [REGION_LAYER.heartbeat_period_s, 0.5])
def test_heartbeats_go_through_the_registry_at_its_period(period):
    dur = 20.0
    sim, res, events = _run("geoprefix", duration=dur, region_layer={"heartbeat_period_s": period})
    n_lbs = len(sim.lbs)
    span = dur + SimConfig().warmup_s  # the control plane runs from -warmup_s on
    # default network: every round trip to the registry (in us) is shorter than the period
    assert res.counters["heartbeats"] == pytest.approx(n_lbs * span / period, abs=n_lbs)
    assert sim.registry.heartbeats == pytest.approx(res.counters["heartbeats"], abs=n_lbs)
    tables = [info for kind, info in events if kind == "peers" and info["lb"] == "asia"]
    assert len(tables) == pytest.approx(span / period, abs=1)
    net = sim.net
    for lb in sim.lbs.values():
        for region, ps in lb.router.peers.items():
            # heard through the registry: at most a period (+ the legs via us) old
            age = sim.now - ps.timestamp
            assert 0 <= age <= 2 * period + net.rtt_s(lb.region, "us") + 1e-9, (lb.region, region)
            # the RTT it carries is a probe's measurement, relayed by the registry
            assert ps.rtt_s == pytest.approx(net.rtt_s(lb.region, region))
    assert summarize(res)["counters"]["forwards"] > 0


def _spy_rule():
    """Patch QueueRule's verdicts to record (method, verdict) for every call, whoever makes it."""
    calls = []
    patches = []
    for name in ("admit", "again", "timed_out"):
        orig = getattr(QueueRule, name)

        def spy(*args, _orig=orig, _name=name):
            v = _orig(*args)
            calls.append((_name, v))
            return v

        patches.append(mock.patch.object(QueueRule, name, staticmethod(spy) if name == "timed_out" else spy))
    return calls, patches


def test_the_ingress_and_the_simulated_lb_run_the_one_queue_rule():
    """One rule, two drivers: the Serve ingress's ``AdmissionQueue`` and the simulator's ``RegionLB`` ask
    ``QueueRule`` for every verdict, and each refusal they count is one the rule gave."""
    from ray_geolb.serve.ingress import AdmissionQueue, GeoHTTPError, IngressConfig

    calls, patches = _spy_rule()
    for p in patches:
        p.start()
    try:
        # Serve: a held head, a newcomer refused by the bound, the head refused by the wait limit
        q = AdmissionQueue(IngressConfig(region="us", registry=None, max_queue=1, max_wait_s=0.2, poll_s=0.01),
                           lambda r, w: RegionDecision("hold", reason="local_full"))

        async def serve():
            held = asyncio.ensure_future(q.admit(RouteRequest("r1", "x", prompt_tokens=1)))
            while not q.queue:
                await asyncio.sleep(0)
            for rid in ("r2", "r1"):
                with pytest.raises(GeoHTTPError):
                    await (q.admit(RouteRequest(rid, "x", prompt_tokens=1)) if rid == "r2" else held)

        asyncio.run(serve())
        served = Counter((m, v.action, v.reason if v.action == REFUSE else None) for m, v in calls)
        assert served[("admit", WAIT, None)] == 1 and served[("again", WAIT, None)] >= 1
        assert served[("admit", REFUSE, QUEUE_FULL)] == q.counts["queue_full"] == 1
        assert served[("timed_out", REFUSE, WAIT_TIMEOUT)] == q.counts["wait_timeout"] == 1
        # the simulator: an overloaded region-local LB with a small bound and a short wait limit
        del calls[:]
        _s, res, _e = _run("region-local", {"us": 1}, {"us": 40},
                           region_layer={"max_queue": 3, "max_wait_s": 2.0, "retry_after_s": 0.5})
    finally:
        for p in patches:
            p.stop()
    sim = Counter((m, v.action, v.reason if v.action == REFUSE else None) for m, v in calls)
    c = res.counters
    assert c["lb_queue_full"] > 0 and c["lb_wait_timeout"] > 0, "precondition: both refusals happen"
    assert sim[("admit", REFUSE, QUEUE_FULL)] == c["lb_queue_full"]
    assert sim[("timed_out", REFUSE, WAIT_TIMEOUT)] == c["lb_wait_timeout"]
    assert sim[("admit", GO, None)] > 0 and sim[("admit", WAIT, None)] > 0
    assert sim[("again", GO, None)] > 0 and sim[("again", WAIT, None)] > 0


def test_the_ingress_and_the_simulated_lb_send_one_heartbeat_message():
    """One heartbeat builder (``policy/region/heartbeat.py``): Serve's ``PeerMesh.heartbeat`` and the
    simulated LB both call it, and the registry accepts what each sends."""
    from ray_geolb.policy.region import heartbeat as hb_mod
    from ray_geolb.policy.region.registry_state import RegistryState
    from ray_geolb.serve.ingress import IngressConfig
    from ray_geolb.serve.ingress.request_path import RequestPath

    built = []

    def spy(*args, **kw):
        built.append(hb_mod.heartbeat_message(*args, **kw))
        return built[-1]

    cfg = IngressConfig(region="us", registry=None, model_name="m", peers={"eu": "geolb-eu"}, latency={"scale": 0.0})
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: None)
    ing.router.observe_rtt("eu", 0.05)
    with mock.patch("ray_geolb.serve.ingress.peers.heartbeat_message", spy), \
            mock.patch("ray_geolb.sim.region_lb.heartbeat_message", spy):
        serve_hb = ing.peers.heartbeat()
        _sim, res, _e = _run("geoprefix", duration=1.0)
    assert built[0] is serve_hb and serve_hb["rtts"] == {"eu": 0.05} and serve_hb["region"] == "us"
    sim_hbs = built[1:]
    assert sim_hbs and len(sim_hbs) == res.counters["heartbeats"]  # every simulated heartbeat was built by it
    assert {"region", "source", "available_replicas", "queue_len", "rtts"} <= set(serve_hb) & set(sim_hbs[-1])
    reg = RegistryState(regions=["us", "eu"])
    assert "errors" not in reg.heartbeat_batch([serve_hb])
