"""Deadlines without Ray: the queue rule's deadline check, the ingress's estimates of wait and service
(``serve/ingress/deadlines.py``), and the admission queue refusing a request at once -- 429
``deadline_unreachable`` with ``Retry-After`` -- on arrival or while it waits, instead of letting it
expire in the queue. (Under a real burst: ``test_deadlines_hold_under_a_burst.py``.)"""

import asyncio
import math

import pytest

from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.region import RegionDecision
from ray_geolb.policy.region.queue_rule import DEADLINE_UNREACHABLE, REFUSE, WAIT, QueueRule
from ray_geolb.serve.ingress import AdmissionQueue, GeoHTTPError, IngressConfig
from ray_geolb.serve.ingress.deadlines import DEADLINE_RESERVE_S, DeadlineEstimates, deadline_from_arrival, reserve_for

HOLD = RegionDecision("hold", reason="local_full")
LOCAL = RegionDecision("local", None, 0, "local_available")


def _req(i):
    return RouteRequest(request_id=f"r{i}", text="x" * 40, prompt_tokens=10)


def test_the_rule_refuses_only_an_expected_finish_after_the_deadline():
    assert QueueRule.deadline(5.0, None, None) == (WAIT, None)  # nothing known: nothing refused
    assert QueueRule.deadline(5.0, 3.0, 1.5) == (WAIT, None)
    assert QueueRule.deadline(5.0, 4.0, 1.5) == (REFUSE, DEADLINE_UNREACHABLE)
    assert QueueRule.deadline(1.0, None, 1.5) == (REFUSE, DEADLINE_UNREACHABLE)  # service alone is too long


def test_the_ingress_keeps_a_reserve_of_each_deadline_for_what_it_cannot_see():
    assert reserve_for(10.0) == DEADLINE_RESERVE_S
    assert reserve_for(2.0) == min(DEADLINE_RESERVE_S, 0.5)  # never more than a quarter of it
    assert reserve_for(math.inf) == 0.0
    assert deadline_from_arrival(100.0, 10.0) == 100.0 + 10.0 - DEADLINE_RESERVE_S


def test_estimates_of_wait_and_service():
    est = DeadlineEstimates(alpha=0.5, window_s=10.0, min_samples=4)
    assert est.service_s(False) is None and est.wait_s(3, 0, 0.0) is None  # nothing measured yet
    assert est.wait_s(2, 3, 0.0) == 0.0  # a free slot is left for it
    est.served("complete", 1.0)
    est.served("complete", 2.0)
    assert est.service_s(False) == 1.5 and est.service_s(True) is None
    for _ in range(4):
        est.started()
    assert est.rate(0.0) == pytest.approx(4 / 1.5)  # 4 calls in flight, 1.5 s each: slots free at 4 / 1.5 per s
    for t in (1.0, 2.0, 3.0, 4.0):  # a faster measured drain wins
        est.finished(t)
    assert est.inflight == 0 and est.rate(4.0) == pytest.approx(4 / 3)
    assert est.wait_s(5, 0, 4.0) == pytest.approx(6 / (4 / 3))  # 6 slots must free up
    assert DeadlineEstimates.retry_after_s(10.0, 4.0, 1.0) == 6.0
    assert DeadlineEstimates.retry_after_s(2.0, 4.0, 1.0) == 1.0  # at least retry_after_s


def _queue(decide, **kw):
    return AdmissionQueue(IngressConfig(region="us", registry=None, **kw), decide)


def test_a_newcomer_the_queue_ahead_cannot_serve_in_time_is_refused_at_once_with_retry_after():
    async def run():
        q = _queue(lambda r, w: HOLD, poll_s=0.01, retry_after_s=1.0)
        with pytest.raises(GeoHTTPError) as e:
            await q.admit(_req(1), 10.0, deadline_s=2.0, expect=lambda key: (5.0, 1.0))
        err = e.value
        assert err.status == 429 and err.type == "deadline_unreachable" and 3.9 <= err.retry_after_s <= 4.0
        assert err.response().headers["retry-after"] == "4"
        assert len(q) == 0 and q.counts["deadline_unreachable"] == 1 and q.counts["held"] == 0
        # a local slot free now, but the service alone takes longer than the time left
        q2 = _queue(lambda r, w: LOCAL)
        with pytest.raises(GeoHTTPError) as e2:
            await q2.admit(_req(2), 10.0, deadline_s=0.5, expect=lambda key: (None, 1.0))
        assert e2.value.type == "deadline_unreachable"
        # one that fits goes on; without estimates nothing is refused early
        assert await q2.admit(_req(3), 10.0, deadline_s=2.0, expect=lambda key: (None, 1.0)) is LOCAL
        assert await q2.admit(_req(4), 10.0, deadline_s=0.1, expect=lambda key: (None, None)) is LOCAL

    asyncio.run(run())


def test_a_waiting_request_is_refused_as_soon_as_it_cannot_make_it_not_when_its_deadline_passes():
    async def run():
        state = {"wait": 0.5}
        q = _queue(lambda r, w: HOLD, poll_s=0.01)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        waiting = asyncio.ensure_future(q.admit(_req(1), 30.0, deadline_s=30.0,
                                                expect=lambda key: (state["wait"], 0.5)))
        while not q.queue:
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert not waiting.done() and q.counts["held"] == 1  # it fits: it waits
        state["wait"] = 60.0  # the queue ahead slowed down: it can no longer make it
        q.kick_all()
        with pytest.raises(GeoHTTPError) as e:
            await waiting
        assert e.value.status == 429 and e.value.type == "deadline_unreachable" and e.value.retry_after_s > 1
        assert loop.time() - t0 < 1.0  # long before its 30-s deadline
        assert len(q) == 0 and q.counts["deadline_unreachable"] == 1 and q.counts["wait_timeout"] == 0

    asyncio.run(run())
