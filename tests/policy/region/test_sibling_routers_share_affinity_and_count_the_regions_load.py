"""Several routers over one region's replicas (several ingress replicas): what one router learns from a
sibling's dispatch or forward, how staying is priced when the region's in-flight requests are spread over
n routers, and a slot lent between siblings."""

from __future__ import annotations

from policy_cases import FIXED, P, region, rq
from ray_geolb.policy import ReplicaStats, build_policy
from ray_geolb.policy.region import GEOPREFIX_COST


def test_a_siblings_dispatch_teaches_the_prefix_without_counting_its_load():
    a = build_policy({"name": "geoprefix", "prefix": FIXED}, targets=["t0", "t1"])
    b = build_policy({"name": "geoprefix", "prefix": FIXED}, targets=["t0", "t1"])
    req = rq(1, P + " question one")
    a.on_dispatch(req, "t1", 1.0)
    assert b.index.match(P + " question two") == {}
    b.learn_sibling_dispatch(req, "t1", 1.5)
    matched = b.index.match(P + " question three")
    assert matched.get("t1", 0) >= len(P) - 64 and "t0" not in matched, matched
    # the sibling counted the request; this router did not
    assert a.tracker.outstanding("t1") == 1 and b.tracker.outstanding("t1") == 0
    # a target this router does not have is not learnt, and a policy without an index keeps nothing
    b.learn_sibling_dispatch(rq(4, "x" * 512), "elsewhere", 2.0)
    assert b.index.match("x" * 512) == {}
    rr = build_policy("round_robin", targets=["t0"])
    assert rr.index is None
    rr.learn_sibling_dispatch(req, "t0", 1.0)
    assert rr.tracker.outstanding("t0") == 0


def test_a_siblings_forward_enters_the_regional_snapshot_without_forward_accounting():
    us = region(remote="cost", cost=GEOPREFIX_COST.model_dump(exclude_unset=True))
    assert us.snapshot.match(P + " next turn") == {}
    req = rq(1, P + " forwarded")
    us.learn_sibling_forward(req, "eu", 1.0)
    hit = us.snapshot.match(P + " next turn")  # the snapshot's blocks grow: most of the shared prefix
    assert set(hit) == {"eu"} and hit["eu"] > len(P) // 2, hit
    assert not us.selector._unseen_forwards(us, "eu")  # the forward was the sibling's: none counted here


def test_staying_counts_the_regions_in_flight_requests_not_one_routers():
    cost = GEOPREFIX_COST.model_dump(exclude_unset=True)
    one, shared = region(remote="cost", cost=cost), region(remote="cost", cost=cost)
    shared.local.set_headroom_share(1, 4)
    for r in (one, shared):
        for t in r.local.targets:
            r.local.on_stats(t, ReplicaStats(max_num_seqs=64, timestamp=0.0))
        for i in range(3):
            r.local.on_dispatch(rq(10 + i, f"busy {i} " * 50), "us-0", 0.5)
    sel = one.selector
    # no report since the dispatches: this router's unseen ones stand for every router's (times 4)
    assert sel.region_inflight(one) == sel._inflight(one) == 3
    assert sel.region_inflight(shared) == 12 and sel._inflight(shared) == 3
    # the heartbeat reports this router's own count (the registry adds a region's sources up)
    assert shared.selector.heartbeat_extra(shared, 0.0)["inflight"] == 3
    # so a long uncached prompt's stay costs more where the same own count stands for four routers' load
    req = rq(99, "y" * 4000)
    assert shared.stay_cost(req, 1.0) > one.stay_cost(req, 1.0)
    # a report that has seen them says what every router's requests are: 9 running and 2 waiting at us-0
    shared.local.on_stats("us-0", ReplicaStats(max_num_seqs=64, num_running=9, num_waiting=2, timestamp=2.0))
    assert sel.region_inflight(shared) == 11 and sel._inflight(shared) == 3
    shared.local.on_dispatch(rq(20, "new " * 50), "us-1", 2.5)  # one more since: counted for 4 routers
    assert sel.region_inflight(shared) == 15


def test_a_lent_slot_moves_between_siblings_and_the_region_never_grants_more_than_reported():
    a = build_policy({"name": "geoprefix", "prefix": FIXED, "availability": {"max_burst": 3}}, targets=["t"])
    b = build_policy({"name": "geoprefix", "prefix": FIXED, "availability": {"max_burst": 3}}, targets=["t"])
    a.set_headroom_share(0, 2)
    b.set_headroom_share(1, 2)
    report = ReplicaStats(max_num_seqs=64, num_running=0, num_waiting=0, timestamp=1.0)
    a.on_stats("t", report)
    b.on_stats("t", report)
    free = a.tracker.free_slots() + b.tracker.free_slots()
    assert free == 3
    give, take = (a, b) if a.tracker.free_slots() >= b.tracker.free_slots() else (b, a)
    before = take.tracker.free_slots()
    assert give.tracker.lend_slot("t", take.tracker)
    assert take.tracker.free_slots() == before + 1
    assert a.tracker.free_slots() + b.tracker.free_slots() == free
    while give.tracker.lend_slot("t", take.tracker):
        pass
    assert give.tracker.free_slots() == 0 and take.tracker.free_slots() == free
    assert "t" not in give.tracker.available
    assert not give.tracker.lend_slot("t", take.tracker)  # nothing left to lend


def test_a_slot_fewer_than_the_routers_goes_to_different_routers_report_by_report():
    """Near saturation a replica reports fewer free slots than there are routers: each report's slot goes to
    one router only (never two), and which one changes from report to report, so no router is left
    without that replica for ever."""
    n = 4
    routers = [build_policy({"name": "geoprefix", "prefix": FIXED}, targets=["t"]) for _ in range(n)]
    for rank, p in enumerate(routers):
        p.set_headroom_share(rank, n)
    winners = []
    for k in range(12):
        report = ReplicaStats(max_num_seqs=8, num_running=7, num_waiting=0, timestamp=100.0 + 0.5 * k + 0.013 * k)
        for p in routers:
            p.on_stats("t", report)
        got = [rank for rank, p in enumerate(routers) if p.tracker.free_slots() > 0]
        assert len(got) == 1 and routers[got[0]].tracker.free_slots() == 1, got
        winners.append(got[0])
    assert len(set(winners)) >= 3, winners
