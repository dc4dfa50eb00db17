"""Engine truth wins over a lost completion (no cluster): the GeoPrefixRouter's in-flight records
that Ray never completed are released when their replica reports an idle engine."""

from __future__ import annotations

from fakes import fake_replica, offline_router

from ray_geolb.policy import RouteRequest, build_policy
from ray_geolb.serve.replica_set import ReplicaSet
from ray_geolb.serve.request_book import RequestBook


def test_an_idle_engine_report_releases_completions_ray_never_delivered():
    """Records routed well before the idle report go (counted); younger ones (maybe still on their
    way to the engine) and other replicas' stay."""
    policy = build_policy("geoprefix", targets=["r1", "r2"])
    counters = {}
    book = RequestBook(policy, "us", counters, 100)
    for i, (target, at) in enumerate((("r1", 10.0), ("r1", 19.5), ("r2", 10.0))):
        req = RouteRequest(request_id=f"i{i}", text="hello " * 20)  # the router keys by internal id
        policy.on_dispatch(req, target, at)
        book.inflight[f"i{i}"] = (target, req, at)
    assert book.reconcile("r1", idle_at=20.0, grace_s=2.0) == 1
    assert set(book.inflight) == {"i1", "i2"} and counters["reconciled"] == 1
    assert policy.tracker.outstanding("r1") == 1 and policy.tracker.outstanding("r2") == 1


def test_only_new_idle_reports_of_replicas_with_a_load_signal_are_passed_on():
    policy = build_policy("geoprefix", targets=[])
    idle = []
    rs = ReplicaSet(policy, None, {"bad_stats": 0, "ttft_samples": 0}, lambda m: None,
                    on_idle=lambda uid, at: idle.append((uid, at)))

    rs.sync([fake_replica("a", {"num_waiting": 0, "num_running": 0, "timestamp": 100.0}),
             fake_replica("b", {"num_waiting": 0, "num_running": 2, "timestamp": 100.0}),
             fake_replica("c", {"kv_events": True, "timestamp": 100.0})])  # no load field: never "idle"
    assert idle == [("a", 100.0)]
    rs.sync([fake_replica("a", {"num_waiting": 0, "num_running": 0, "timestamp": 100.0})])  # the same report again
    assert idle == [("a", 100.0)]


def test_the_router_checks_reconcile_after_s():
    import pytest

    for bad in (0, -1, True, "2"):
        with pytest.raises(ValueError, match="reconcile_after_s"):
            offline_router(reconcile_after_s=bad)
    r = offline_router(reconcile_after_s=None)  # off: no idle callback
    assert r.replicas.on_idle is None and r.counters["reconciled"] == 0
