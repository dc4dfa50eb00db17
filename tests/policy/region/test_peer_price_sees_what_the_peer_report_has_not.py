"""What a peer's heartbeat cannot show is still priced (``network-hard`` at t = 0.3 s): the
forwards this LB sent that had not reached the peer when it measured, and the backlog SP-P has already
pushed into the peer's engines."""

import pytest

from policy_cases import TP, fill, region, rq
from ray_geolb.policy import PeerState, ReplicaStats
from ray_geolb.policy.region import GEOPREFIX_COST


def _us():
    r = region(remote="cost", cost=GEOPREFIX_COST.model_copy(update={"staleness_scale_s": None}), tau=5)
    fill(r)
    return r


def test_forwards_that_had_not_reached_the_peer_when_it_measured_still_count():
    """A state's timestamp is when the peer measured it (the registry dates a heartbeat by the delay it
    declares; ``tests/serve/test_registry_actor_and_client.py``), and a forward reaches the peer half an
    RTT after it is sent. Forwards sent less than half an RTT before the timestamp are counted; older
    ones are taken as seen by the report."""
    r = _us()
    req = rq(0, "q" * 4000)
    r.update_peer(PeerState("au", 2, 0, 0.0, rtt_s=0.2, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
    for i in range(4):  # a burst at t = 1.0: two take the free replicas, two queue (1,000 tokens each)
        r.on_forward(rq(10 + i, "f" * 4000), "au", 1.0)
    assert r.selector.remote_wait(r, req, "au", 1.0) == pytest.approx(TP * 2000 / 2)
    # the peer measured its next state at 1.05, before the burst arrived (1.0 + RTT/2 = 1.1)
    r.update_peer(PeerState("au", 2, 0, 1.05, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
    assert r.selector.unreflected_since(r, "au") == pytest.approx(0.95)
    assert r.selector.remote_wait(r, req, "au", 1.05) == pytest.approx(TP * 2000 / 2)
    assert r.selector.peer_inflight(r, "au") == pytest.approx(4 / 2)
    # one measured after the burst arrived has seen it: the report's own figures rule
    r.update_peer(PeerState("au", 2, 0, 1.12, extra={"queued_tokens": 0, "replicas": 2, "inflight": 4}))
    assert r.selector.remote_wait(r, req, "au", 1.12) == 0
    assert r.selector.peer_inflight(r, "au") == pytest.approx(4 / 2)
    # the comparison keeps the in-flight count it priced (the state endpoint's last_cost_inflight)
    r.selector.peer_costs(r, req, ["au"], 1.12)
    assert r.selector.last_inflight == {"au": pytest.approx(4 / 2)}


def test_the_heartbeat_reports_the_engines_backlog_with_the_lb_queue():
    """``queued_tokens`` = the LB's queue + the local engines' queued prefill (the tokens staying is
    priced by): requests SP-P pushed into an engine that its report has not yet seen count."""
    peer = region("au", remote="cost", cost=GEOPREFIX_COST, targets=("au-0", "au-1"))
    assert peer.heartbeat(0, 1.0, queued_tokens=300.0).extra["queued_tokens"] == 300.0
    for i in range(3):
        peer.on_dispatch(rq(i, "pqr"[i] * 4000), "au-0", 1.0)  # 1,000 new tokens each, not yet in a report
    backlog = peer.selector.engine_queued_tokens(peer, 0.0)
    assert backlog == pytest.approx(3000)
    hb = peer.heartbeat(0, 1.1, queued_tokens=300.0)
    assert hb.extra["queued_tokens"] == pytest.approx(300 + 3000)
    assert peer.selector.local_queue_tokens(peer, rq(9, "x" * 400)) == pytest.approx(300 + 3000)
    # the replica's report has seen them, prefilled and decoding: only the LB queue is left
    peer.local.on_stats("au-0", ReplicaStats(num_waiting=0, num_running=3, max_num_seqs=64, timestamp=1.2))
    assert peer.heartbeat(0, 1.3, queued_tokens=300.0).extra["queued_tokens"] == pytest.approx(300)
    # and a peer that prices the backlogged region sees its wait
    us = _us()
    us.update_peer(PeerState("au", 2, 0, 1.1, rtt_s=0.2, extra=hb.extra))
    assert us.selector.remote_wait(us, rq(5, "q" * 400), "au", 1.1) == pytest.approx(TP * 3300 / 2)


def test_routers_that_share_the_replicas_each_report_their_part_of_the_reported_backlog():
    """With n ingress routers per region the registry adds their heartbeats up: each reports 1/n of the
    waiting the engines reported (all of them see the same reports) and all of its own unseen work."""
    peer = region("au", remote="cost", cost=GEOPREFIX_COST, targets=("au-0", "au-1"))
    for t in ("au-0", "au-1"):
        peer.local.on_stats(t, ReplicaStats(num_waiting=4, num_running=8, max_num_seqs=64, timestamp=1.0))
    peer.on_dispatch(rq(1, "u" * 4000), "au-0", 1.5)  # this router's own, after the reports: 1,000 tokens
    mean = peer.local.mean_prompt_tokens  # what a reported waiting request is taken to hold
    alone = peer.heartbeat(0, 2.0, queued_tokens=0.0).extra["queued_tokens"]
    assert alone == pytest.approx(8 * mean + 1000)
    peer.local.tracker.set_share(0, 2)
    assert peer.heartbeat(0, 2.0, queued_tokens=0.0).extra["queued_tokens"] == pytest.approx(4 * mean + 1000)
    assert peer.selector.local_queue_tokens(peer, rq(2, "x" * 400)) == pytest.approx(8 * mean + 1000)
