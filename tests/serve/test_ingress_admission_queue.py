"""The ingress's admission queue (``serve/ingress/admission.py``): FCFS on the one HoldQueue, bounded
(429), time-limited (503), and a request cancelled while it waits always leaves it -- also when the
cancellation comes just as it is woken (Python 3.11's ``asyncio.wait_for`` swallows that one)."""

import asyncio

import pytest

from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.region import RegionDecision
from ray_geolb.serve.ingress import AdmissionQueue, GeoHTTPError, IngressConfig


def _queue(decide, **kw):
    return AdmissionQueue(IngressConfig(region="us", registry=None, **kw), decide)


def _req(i, tokens=10):
    return RouteRequest(request_id=f"r{i}", text="x" * 40, prompt_tokens=tokens)


HOLD = RegionDecision("hold", reason="local_full")
LOCAL = RegionDecision("local", None, 0, "local_available")
FORWARD = RegionDecision("forward", "eu", 0, "prefix")


def test_fcfs_newcomer_behind_waiting_requests_may_be_forwarded_not_served_locally():
    async def run():
        state = {"d": HOLD}
        seen = []

        def decide(rreq, waiting):
            seen.append((rreq.request_id, q.ahead(waiting)))
            return state["d"]

        q = _queue(decide, poll_s=0.01)
        first = asyncio.ensure_future(q.admit(_req(1, 30)))
        while not q.queue:
            await asyncio.sleep(0)
        assert len(q) == 1 and q.tokens == 30 and q.ahead(None) == (1, 30)
        state["d"] = FORWARD  # behind a waiting request, a newcomer may be forwarded at once
        assert await q.admit(_req(2)) is FORWARD and len(q) == 1
        state["d"] = LOCAL  # ... but may not take a local replica: it queues behind the head
        second = asyncio.ensure_future(q.admit(_req(3, 5)))
        assert await first is LOCAL  # the head takes it
        assert await second is LOCAL
        assert len(q) == 0 and q.tokens == 0
        assert ("r3", (1, 30)) in seen  # the newcomer saw the head's tokens ahead of it
        assert q.counts == {"held": 2, "queue_full": 0, "wait_timeout": 0, "deadline_unreachable": 0}

    asyncio.run(run())


def test_bounds_and_deadline():
    async def run():
        q = _queue(lambda r, w: HOLD, max_queue=1, max_wait_s=0.2, poll_s=0.01, retry_after_s=2.0)
        held = asyncio.ensure_future(q.admit(_req(1)))
        while not q.queue:
            await asyncio.sleep(0)
        with pytest.raises(GeoHTTPError) as full:
            await q.admit(_req(2))
        assert full.value.status == 429 and full.value.type == "queue_full" and full.value.retry_after_s == 2.0
        with pytest.raises(GeoHTTPError) as late:
            await held
        assert late.value.status == 503 and late.value.type == "wait_timeout" and "local_full" in late.value.message
        with pytest.raises(GeoHTTPError) as capped:  # the client's shorter wait cap
            await q.admit(_req(3), max_wait_s=0.0)
        assert capped.value.status == 503 and "within 0 s" in capped.value.message
        assert len(q) == 0 and q.counts == {"held": 2, "queue_full": 1, "wait_timeout": 2, "deadline_unreachable": 0}

    asyncio.run(run())


@pytest.mark.parametrize("spins", range(6))
def test_a_request_cancelled_as_it_is_woken_leaves_the_queue(spins):
    """The wake-up (kick) and the client's cancellation land in the same few loop turns: the request
    must still end with CancelledError and leave the queue (not wait on until its deadline)."""
    async def run():
        q = _queue(lambda r, w: HOLD, max_wait_s=30.0, poll_s=10.0)
        t = asyncio.ensure_future(q.admit(_req(1)))
        while not q.queue:
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        q.kick()
        for _ in range(spins):
            await asyncio.sleep(0)
        t.cancel()
        done, _ = await asyncio.wait({t}, timeout=1.0)
        assert done and t.cancelled(), "a cancellation was swallowed: the request is still waiting"
        assert len(q) == 0 and q.tokens == 0

    asyncio.run(run())
