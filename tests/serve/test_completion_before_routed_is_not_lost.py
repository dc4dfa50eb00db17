"""Ray 2.60 may tell the router a request completed before it tells it the request was routed.

``Router._route_and_send_request_once`` registers the completion callback, then awaits the replica's
acceptance, then calls ``on_request_routed``: a request answered at once completes in between. The
request book must end such a request anyway -- no in-flight record, no reservation left -- and keep
its decision (no Ray cluster here: Ray's own ``PendingRequest``/``RequestMetadata`` and the router's
hooks called in that order; the Serve test is in ``test_geoprefix_router_in_serve.py``)."""

from __future__ import annotations

import asyncio

from fakes import fake_replica, offline_router, pending_request

import ray_geolb.serve.request_book as request_book


def _pr(i):
    return pending_request({"messages": [{"role": "user", "content": f"question {i} " * 40}]}, f"s{i}", f"i{i}")


def _router():
    r = offline_router(region="us")
    r.metrics._export = False
    reps = [fake_replica("a", {"num_waiting": 0, "num_running": 0, "max_num_seqs": 1, "timestamp": 1e12})]
    r._sync(reps)
    return r, reps


def test_a_completion_before_its_routed_call_ends_the_request():
    r, reps = _router()

    async def go():
        pr0, pr1 = _pr(0), _pr(1)
        assert r._choose(reps, pr0)[0][0] is reps[0]  # the one slot, reserved
        rid = reps[0].replica_id
        r.on_request_completed(rid, "i0")  # Ray's completion callback ran first...
        r.on_request_routed(pr0, rid, None)  # ...then its routed call
        assert r.book.inflight == {} and r.policy.tracker.outstanding("a") == 0
        assert r.counters["completed_before_routed"] == 1
        dec = r.book.decisions["i0"]
        assert dec["replica"] == "a" and dec["reason"] != "ray_reassigned", dec
        return r._choose(reps, pr1)  # the slot is free again

    second = asyncio.run(go())
    assert second and second[0][0] is reps[0]


def test_the_usual_order_is_unchanged():
    r, reps = _router()

    async def go():
        pr0 = _pr(0)
        r._choose(reps, pr0)
        rid = reps[0].replica_id
        r.on_request_routed(pr0, rid, None)
        assert set(r.book.inflight) == {"i0"} and r.policy.tracker.outstanding("a") == 1
        r.on_request_completed(rid, "i0")
        assert r.book.inflight == {} and r.policy.tracker.outstanding("a") == 0
        assert r.counters.get("completed_before_routed", 0) == 0

    asyncio.run(go())


def test_a_rejected_send_that_is_never_routed_leaves_nothing(monkeypatch):
    """A completion with no routed call after it (the replica rejected the send, or the caller left)
    releases the reservation at once; the entry kept for a routed call goes after a few seconds."""
    r, reps = _router()
    now = [1000.0]
    monkeypatch.setattr(request_book.time, "monotonic", lambda: now[0])

    async def go():
        pr0, pr1 = _pr(0), _pr(1)
        r._choose(reps, pr0)
        r.on_request_completed(reps[0].replica_id, "i0")  # rejected: no routed call follows
        assert r.policy.tracker.outstanding("a") == 0 and "i0" not in r.book.entries
        assert len(r.book._done_first) == 1
        assert r.book._done_first["i0"][0].pr is None  # Ray's call (its arguments) is not kept alive
        now[0] += request_book._DONE_FIRST_KEEP_S + 1
        r._choose(reps, pr1)
        r.on_request_completed(reps[0].replica_id, "i1")
        assert list(r.book._done_first) == ["i1"]  # the old one went

    asyncio.run(go())


def test_a_retry_after_a_rejected_send_is_not_taken_for_a_completed_one():
    """The replica rejected the send (its completion, no routed call); Ray routes the request again,
    to the same replica: that send runs, so its routed call makes an in-flight record."""
    r, reps = _router()

    async def go():
        pr0 = _pr(0)
        rid = reps[0].replica_id
        r._choose(reps, pr0)
        r.on_request_completed(rid, "i0")  # rejected
        r._choose(reps, pr0)  # Ray's retry: a new entry, the same replica
        r.on_request_routed(pr0, rid, None)
        assert set(r.book.inflight) == {"i0"} and r.policy.tracker.outstanding("a") == 1
        assert r.counters.get("completed_before_routed", 0) == 0
        r.on_request_completed(rid, "i0")
        assert r.book.inflight == {} and r.policy.tracker.outstanding("a") == 0

    asyncio.run(go())
