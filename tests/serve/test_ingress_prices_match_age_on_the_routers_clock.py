"""The ingress prices a local prefix match by its age on the router's clock.

The GeoPrefixRouter stamps its prefix tree with ``policy_now()`` (wall time: replicas' reports come
from other processes); the ingress once priced staying with ``time.monotonic()``, so every match
looked newer than "now" and the age discount was skipped (a 600-s-old match priced as fresh). Here a
real GeoPrefixRouter (no Ray: ``initialize_state`` only) sits behind a real RequestPath, and the
same situation is priced by the simulator's RegionRouter on a virtual clock that starts at 1,000 s:
distinct clocks, same ages, same costs."""

from __future__ import annotations

import pytest
from fakes import fake_replica, offline_router

from ray_geolb.policy import ReplicaStats, RouteRequest, build_policy
from ray_geolb.policy.region import GEOPREFIX_COST, PeerState, RegionRouter, TwoLayerConfig
from ray_geolb.serve import clock
from ray_geolb.serve.ingress import IngressConfig, RequestPath

AGE_S = 600.0
DOC = "a shared 3,000-character system prompt about routing requests between regions. " * 40
QUESTION = DOC + "and now a question"
COST = GEOPREFIX_COST.model_copy(update={"match_half_life_s": 300.0})


def _busy(now: float) -> dict:
    return {"num_waiting": 1, "num_running": 4, "max_num_seqs": 4, "timestamp": now}


def _ingress_stay_cost(age_s: float) -> float:
    """The stay cost the real ingress computes for QUESTION when DOC reached replica a ``age_s`` ago."""
    router = offline_router()
    now = clock.policy_now()
    router._sync([fake_replica("a", _busy(now)), fake_replica("b", _busy(now))])  # saturated: layer 1 prices a forward
    # what RequestBook.routed does when the router dispatched DOC: stamp the tree on the policy clock
    router.policy.on_dispatch(RouteRequest(request_id="doc", text=DOC), "a", now - age_s)
    router.policy.on_complete("doc", "a", now - age_s + 1.0)
    router.publish()  # the router publishes after its own events; this test changed its policy directly
    cfg = IngressConfig(region="us", peers={"eu": "geolb-eu"}, registry=None,
                        two_layer={"remote": "cost", "cost": COST, "peer_stale_s": 10.0})
    ing = RequestPath(cfg, geo_router=lambda: router)  # not started: no registry link, no probes
    ing.router.update_peer(PeerState("eu", 2, 0, clock.policy_now()))
    ing.router.observe_rtt("eu", 0.1)
    d = ing.decide(RouteRequest(request_id="q", text=QUESTION))
    assert d.kind in ("forward", "hold"), d  # not local: the local replicas report waiting
    return ing.router.selector.last_costs[None]


def _simulated_stay_cost(age_s: float) -> float:
    """The same situation on the simulator's virtual clock (starts at 1,000 s)."""
    now = 1000.0
    geo = build_policy("geoprefix", targets=["a", "b"])
    for t in ("a", "b"):
        geo.on_stats(t, ReplicaStats.from_dict(_busy(now)))
    geo.on_dispatch(RouteRequest(request_id="doc", text=DOC), "a", now - age_s)
    geo.on_complete("doc", "a", now - age_s + 1.0)
    sim = RegionRouter(TwoLayerConfig(region="us", remote="cost", cost=COST, peer_stale_s=10.0), geo)
    sim.set_queue(0, 0.0)
    sim.update_peer(PeerState("eu", 2, 0, now))
    sim.observe_rtt("eu", 0.1)
    d = sim.decide(RouteRequest(request_id="q", text=QUESTION), now)
    assert d.kind in ("forward", "hold"), d
    return sim.selector.last_costs[None]


def test_an_old_local_match_is_discounted_by_its_age_in_the_ingress():
    fresh, old = _ingress_stay_cost(0.0), _ingress_stay_cost(AGE_S)
    # two half-lives: the match counts a quarter, so staying costs more (more prompt to prefill)
    assert old > fresh * 1.2, (fresh, old)


@pytest.mark.parametrize("age_s", [0.0, 150.0, AGE_S])
def test_ingress_on_wall_time_and_simulator_on_virtual_time_price_staying_alike(age_s):
    assert _ingress_stay_cost(age_s) == pytest.approx(_simulated_stay_cost(age_s), rel=1e-3)
