"""Work stealing at the ingress without a cluster (``serve/ingress/steal.py``): the admission queue hands a
waiting request over and takes a refused one back at its old place; two real RequestPaths wired by
in-process handles run the whole exchange -- offer, pick, hand-over, take or refuse -- exactly once.
(The same exchange on a real Ray Serve cluster:
``test_hand_overs_between_regions_serve_each_request_once.py``.)"""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes import idle_view, ingress_pair

from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.region import PeerState, RegionDecision
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.ingress import AdmissionQueue, GeoHTTPError, IngressConfig, RequestPath
from ray_geolb.serve.ingress.admission import HandOver
from ray_geolb.serve.ingress.openai import parse_request

HOLD = RegionDecision("hold", reason="local_full")
STEAL = {"remote": "nearest", "steal": {"enabled": True}}


def _req(i, tokens=10):
    return RouteRequest(request_id=f"r{i}", text="x" * 40, prompt_tokens=tokens)


async def _until(check, bound=2.0):
    t = asyncio.get_running_loop().time()
    while not check():
        assert asyncio.get_running_loop().time() - t < bound, "condition not reached"
        await asyncio.sleep(0.005)


def test_a_handed_over_waiter_leaves_the_queue_and_a_refused_one_comes_back_at_its_place():
    async def run():
        q = AdmissionQueue(IngressConfig(region="us", registry=None, poll_s=0.01), lambda rreq, w: HOLD)
        tasks = [asyncio.ensure_future(q.admit(_req(i, 10 * (i + 1)))) for i in range(3)]
        await _until(lambda: len(q) == 3)
        held = list(q.held())
        assert [r.request_id for _, r in held] == ["r0", "r1", "r2"] and q.tokens == 60
        w1 = held[1][0]
        place = q.hand_over(w1, "eu", 7)
        assert len(q) == 2 and q.tokens == 40 and w1 not in q.queue
        d = await asyncio.wait_for(tasks[1], 1.0)
        assert isinstance(d, HandOver) and (d.kind, d.target, d.reason, d.offer_id, d.place) == \
               ("forward", "eu", "stolen", 7, place) and d.key is w1
        with pytest.raises(KeyError):
            q.hand_over(w1, "eu", 7)  # not waiting any more
        # the thief refused it: back at its old place, ahead of r2 (which came after it), never 429
        back = asyncio.ensure_future(q.admit(_req(1, 20), place=place))
        await _until(lambda: len(q) == 3)
        assert [r.request_id for _, r in q.held()] == ["r0", "r1", "r2"] and q.tokens == 60
        assert q.counts["held"] == 3  # a return is not a new hold
        for t in (tasks[0], tasks[2], back):
            t.cancel()
        await asyncio.gather(tasks[0], tasks[2], back, return_exceptions=True)
        assert len(q) == 0 and q.tokens == 0

    asyncio.run(run())


def _ctx(cfg, i):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"question {i} " * 20}]}).encode()
    return parse_request(body, {}, "chat", cfg, origin="us", request_id=f"q{i}")


def test_an_idle_region_steals_held_requests_and_each_is_served_once():
    async def run():
        us, eu, log, served = ingress_pair()
        waiting = [asyncio.ensure_future(us.process(_ctx(us.cfg, i))) for i in range(3)]
        await _until(lambda: len(us.admission) == 3)
        eu.router.update_peer(PeerState("us", 0, 3, policy_now()))  # the table shows us's queue
        eu.peers_changed()
        await _until(lambda: eu.steal_counts["offers_sent"] >= 1 and not eu._offer_tasks)
        handed = us.steal_counts["handed"]
        assert handed >= 1 and eu.steal_counts["taken"] == handed == len(served)
        done = [t for t in waiting if t.done()]
        assert len(done) == handed
        for t in done:
            meta, res = t.result()
            assert meta["route"] == "forwarded" and meta["forward_reason"] == "stolen" and res["hops"] == 1
        assert len(us.admission) == 3 - handed and us.router.victim.outstanding() == 0
        assert us.steal_counts["settled_taken"] == handed and us.steal_counts["returned"] == 0
        assert ("us", "steal_offer") in log and ("eu", "stolen") in log and ("eu", "forwarded") not in log
        st = eu.steal_state()
        assert st["counters"]["taken"] == handed and st["by_peer"]["us"]["offers_sent"] >= 1
        assert 0 < st["offer_bytes_max"] < 4096 and eu.metrics.total("geolb_steals_total", "taken", "us") == handed
        assert us.accounting()["steal_in_flight"] == 0
        for t in waiting:
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert len(us.admission) == 0 and len(set(served)) == len(served)

    asyncio.run(run())


def test_a_refused_steal_goes_back_to_its_place_and_is_decided_again_there():
    async def run():
        us, eu, log, served = ingress_pair()
        waiting = [asyncio.ensure_future(us.process(_ctx(us.cfg, i))) for i in range(3)]
        await _until(lambda: len(us.admission) == 3)
        order = [r.request_id for _, r in us.admission.held()]
        # an offer eu never made (its Thief has none out): whatever us hands over, eu refuses before any work
        wire = {"offer_id": 12345, "thief": "eu", "slots": 2, "wait_s": 0.0, "t_p_s": 0.0}
        ans = us.steal_offer(wire)
        assert ans["handed"] >= 1
        await _until(lambda: us.steal_counts["returned"] == ans["handed"])
        await _until(lambda: len(us.admission) == 3)
        assert [r.request_id for _, r in us.admission.held()] == order  # each back at its old place
        assert eu.steal_counts["refused"] == ans["handed"] and eu.steal_counts["taken"] == 0 and served == []
        assert us.router.victim.outstanding() == 0 and not any(t.done() for t in waiting)
        for t in waiting:
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert len(us.admission) == 0

    asyncio.run(run())


def test_an_unreachable_thief_is_a_refusal_and_a_thief_that_took_it_settles_it_for_good():
    async def run():
        us, eu, log, served = ingress_pair()
        waiting = [asyncio.ensure_future(us.process(_ctx(us.cfg, i))) for i in range(2)]
        await _until(lambda: len(us.admission) == 2)
        us.peers.latency.set_faults({"eu": {"drop": 1.0}})  # the hand-over is dropped on the way
        wire = {"offer_id": 1, "thief": "eu", "slots": 1, "wait_s": 0.0, "t_p_s": 0.0}
        assert us.steal_offer(wire)["handed"] == 1
        await _until(lambda: us.steal_counts["returned"] == 1 and len(us.admission) == 2)
        assert us.peers.circuit_open("eu") and served == []
        us.peers.latency.set_faults(None)
        assert us.steal_offer({**wire, "offer_id": 2})["handed"] == 0  # nothing for a thief us cannot reach
        us.peers.reachable("eu")  # a probe reached it: its circuit closes

        async def failing(body, fmeta, *, stream):  # the thief took it and failed: typed, never retried
            raise GeoHTTPError(500, "boom", type_="server_error", region="eu")

        eu.forwarded = failing
        eu.router.thief.out["us"] = [99, policy_now() + 5.0, 1]  # an offer eu made
        assert us.steal_offer({**wire, "offer_id": 99})["handed"] == 1
        await _until(lambda: any(t.done() for t in waiting))
        failed = [t for t in waiting if t.done()][0]
        with pytest.raises(GeoHTTPError) as e:
            failed.result()
        assert e.value.type == "server_error" and len(us.admission) == 1  # not put back: no double serving
        assert us.steal_counts["settled_taken"] == 1 and us.router.victim.outstanding() == 0
        for t in waiting:
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(run())


@pytest.mark.parametrize("wire, field", [
    ({"offer_id": -1, "thief": "eu", "slots": 1, "wait_s": 0, "t_p_s": 0}, "offer.offer_id"),
    ({"offer_id": 1, "thief": "eu", "slots": 0, "wait_s": 0, "t_p_s": 0}, "offer.slots"),
    ({"offer_id": 1, "thief": "eu", "slots": 1, "wait_s": float("nan"), "t_p_s": 0}, "offer.wait_s"),
    ({"offer_id": 1, "thief": "mars", "slots": 1, "wait_s": 0, "t_p_s": 0}, "offer.thief"),
    ("not an offer", "offer"),
])
def test_a_malformed_offer_gets_a_typed_answer_naming_the_field(wire, field):
    us, eu, log, served = ingress_pair()
    ans = us.steal_offer(wire)
    assert ans["error"]["type"] == "bad_steal_offer" and ans["error"]["param"] == field
    assert us.steal_counts["bad_offers"] == 1 and us.steal_counts["handed"] == 0


def test_stealing_is_off_by_default_and_a_busy_region_makes_no_offer():
    plain = RequestPath(IngressConfig(region="us", registry=None, model_name="m").model_dump(),
                        geo_router=lambda: idle_view())
    assert plain.router.thief is None and plain.steal_state() is None and "steal_in_flight" not in \
        plain.accounting()
    ans = plain.steal_offer({"offer_id": 1, "thief": "eu", "slots": 1, "wait_s": 0, "t_p_s": 0})
    assert ans["error"]["param"] == "offer.thief"  # no peers at all

    async def run():
        us, eu, log, served = ingress_pair(thief_free=False)
        eu.router.update_peer(PeerState("us", 0, 3, policy_now()))
        eu.peers_changed()  # eu has no available replica: nothing to offer
        await asyncio.sleep(0.01)
        assert eu.steal_counts["offers_sent"] == 0 and log == []

    asyncio.run(run())


def test_a_request_whose_client_leaves_as_it_is_handed_over_is_settled_not_leaked():
    async def run():
        us, eu, log, served = ingress_pair()
        waiting = [asyncio.ensure_future(us.process(_ctx(us.cfg, i))) for i in range(2)]
        await _until(lambda: len(us.admission) == 2)
        eu.router.thief.out["us"] = [5, policy_now() + 5.0, 1]
        assert us.steal_offer({"offer_id": 5, "thief": "eu", "slots": 1, "wait_s": 0.0, "t_p_s": 0.0})["handed"] == 1
        for t in waiting:  # the clients leave before the woken request could run: nothing was sent
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert us.router.victim.outstanding() == 0 and us.steal_counts["abandoned"] == 1 and len(us.admission) == 0
        assert served == [] and ("eu", "stolen") not in log

    asyncio.run(run())
