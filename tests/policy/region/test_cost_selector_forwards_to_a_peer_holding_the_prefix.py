"""GeoPrefix's cost selector reads a peer's hash-only prefix summary: a request whose long
prefix another region's replicas hold is forwarded there when RTT + the peer's expected TTFT is cheaper
than staying, and stays otherwise; other systems ignore the summary."""

from __future__ import annotations

import json

import pytest

from policy_cases import TP, P, region, rq
from ray_geolb.policy import PeerState, ReplicaStats
from ray_geolb.policy.region import GEOPREFIX_COST, GORGO_COST
from ray_geolb.policy.region.prefix_summary import PrefixSummary

DOC = P * 8  # 16,384 characters: ~4,096 tokens, 4.1 s of prefill at 1 ms per token


def _peer_holding(text: str, name="eu", now=1.0):
    """The summary region ``name`` publishes after sending ``text`` to one of its replicas, over the wire."""
    peer = region(name, remote="cost", cost=GEOPREFIX_COST, targets=(f"{name}-0", f"{name}-1"))
    peer.on_dispatch(rq(99, text), f"{name}-0", now - 0.5)
    # the replica's next report has seen it (prefilled, decoding): nothing queued there any more, so the
    # heartbeat's queued tokens (LB queue + engine backlog) are 0 and what is priced is the match
    peer.local.on_stats(f"{name}-0", ReplicaStats(max_num_seqs=64, num_running=1, timestamp=now - 0.25))
    hb = peer.heartbeat(0, now, queued_tokens=0.0)
    assert hb.extra["queued_tokens"] == 0.0
    assert hb.prefix_summary is not None and hb.prefix_summary.n > 0
    wire = json.loads(json.dumps(hb.prefix_summary.to_wire()))
    return PeerState(name, 2, 0, now, rtt_s=0.15, extra=hb.extra, prefix_summary=PrefixSummary.from_wire(wire))


def _us(cost=GEOPREFIX_COST, policy="geoprefix"):
    return region("us", policy=policy, remote="cost", cost=cost)


# the home rule (a new long prompt goes to one region chosen by hash, test_new_long_prompt_has_one_home_region.py)
# left out, so that what decides below is the summary alone
NO_HOME = GEOPREFIX_COST.model_copy(update={"home_key_chars": None})


def test_forwards_to_the_peer_that_holds_a_long_prefix_before_saturation():
    r = _us()
    r.update_peer(_peer_holding(DOC + " question one"))
    r.set_queue(0, 0.0)
    req = rq(0, DOC + " question two")
    d = r.decide(req, 1.0)
    assert d.kind == "forward" and d.target == "eu" and d.reason == "cost_before_saturation"
    assert d.matched >= len(DOC) - 2048  # the summary's match, to within a block
    costs = r.selector.last_costs
    assert costs["eu"] + 1.0 < costs[None]  # cheaper than staying by more than the 1 s margin
    assert costs["eu"] < 0.15 + TP * 1000  # RTT plus the residual prefill of the question only


def test_stays_without_a_summary_or_a_match_or_when_forwarding_costs_more():
    doc_peer = _peer_holding(DOC + " question one")
    # no summary in the heartbeat: the snapshot knows nothing of eu, so staying wins (ties stay local)
    r = _us(NO_HOME)
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.15, extra=doc_peer.extra))
    assert r.decide(rq(0, DOC + " question two"), 1.0).kind == "local"
    # a summary that does not hold this request's prefix
    r = _us(NO_HOME)
    r.update_peer(doc_peer)
    assert r.decide(rq(1, "z" * len(DOC)), 1.0).kind == "local"
    # a short shared prefix saves less than the margin
    r = _us()
    r.update_peer(_peer_holding(P[:512] + " x"))
    assert r.decide(rq(2, P[:512] + " another question"), 1.0).kind == "local"
    # the peer holds it, but is so far away that the RTT eats the saving
    r = _us()
    far = _peer_holding(DOC + " question one")
    far.rtt_s = 6.0
    r.update_peer(far)
    d = r.decide(rq(3, DOC + " question two"), 1.0)
    assert d.kind == "local"
    assert r.selector.last_costs["eu"] > r.selector.last_costs[None] - 1.0


@pytest.mark.parametrize("cost", [GORGO_COST, NO_HOME.model_copy(update={"peer_summary": False})])
def test_systems_without_peer_summary_ignore_it(cost):
    peer = _peer_holding(DOC + " question one")
    r = _us(cost=dict(cost, forward_before_saturation=True, forward_margin_s=1.0))
    r.update_peer(peer)
    assert r.decide(rq(0, DOC + " question two"), 1.0).kind == "local"
    assert r.prefix_summary() is None  # nor do they publish one


def test_the_summary_is_rebuilt_only_when_the_index_changed():
    r = _us()
    r.on_dispatch(rq(0, DOC), "us-0", 1.0)
    a = r.prefix_summary()
    assert r.prefix_summary() is a
    r.on_dispatch(rq(1, DOC + " more"), "us-1", 2.0)
    b = r.prefix_summary()
    assert b is not a and b.n >= a.n
