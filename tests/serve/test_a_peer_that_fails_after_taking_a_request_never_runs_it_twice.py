"""A hand-over whose outcome the origin cannot know is never run again (``serve/ingress/forward.py``,
``handovers.py``), without a cluster: two real RequestPaths wired by in-process handles (``fakes.py``).

* A forward or a steal whose peer fails after the call was made (Ray's ``ActorDiedError``: the peer's
  ingress died, maybe after it took the request) is answered 502 ``handover_lost`` with ``Retry-After``:
  not decided again, not run here, not put back in the victim's queue.
* One that Serve refused before any replica got it (``BackPressureError``) reached nothing: decided
  again, as an unreachable peer always was.
* The peer records each hand-over id before any work and refuses one it has seen.
* A thief that takes a request and then answers 429 counts it ``sent_back``, as its victim counts it
  ``returned``.
* Each model call is named after its request, and the engine counts the requests it ran to the end.
(The same faults on a real cluster, placed by crash hooks:
``test_hand_overs_between_regions_serve_each_request_once.py``.)
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes import ingress_pair

from ray_geolb.policy.region import PeerState
from ray_geolb.serve import CallTicket, request_of_call, ticket_id
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.ingress import GeoHTTPError
from ray_geolb.serve.ingress.handovers import CrashPoints, HandOverLedger
from ray_geolb.serve.ingress.openai import parse_request

OFFER = {"offer_id": 99, "thief": "eu", "slots": 1, "wait_s": 0.0, "t_p_s": 0.0}


def _ctx(cfg, i):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"question {i} " * 20}]}).encode()
    return parse_request(body, {}, "chat", cfg, origin="us", request_id=f"q{i}")


async def _until(check, bound=2.0):
    t = asyncio.get_running_loop().time()
    while not check():
        assert asyncio.get_running_loop().time() - t < bound, "condition not reached"
        await asyncio.sleep(0.005)


def _died_after_taking(ran):
    """A peer method that takes the request (records it in ``ran``) and then dies, as Ray reports it."""
    from ray.exceptions import ActorDiedError

    async def died(body, fmeta, *args, stream=False):
        ran.append(fmeta["request_id"])
        raise ActorDiedError()
    return died


def test_a_forward_whose_peer_dies_after_taking_it_is_answered_502_and_never_run_again():
    async def run():
        us, eu, log, served = ingress_pair()
        ran = []
        eu.forwarded = _died_after_taking(ran)
        us.router.update_peer(PeerState("eu", 1, 0, policy_now()))  # eu has a free replica: us forwards
        with pytest.raises(GeoHTTPError) as e:
            await asyncio.wait_for(us.process(_ctx(us.cfg, 0)), 5.0)
        assert (e.value.status, e.value.type, e.value.region) == (502, "handover_lost", "eu")
        assert e.value.retry_after_s is not None and "not run again" in e.value.message
        assert log == [("eu", "forwarded")] and ran == ["q0"]  # one hand-over, never decided again
        assert us.counts["handovers_lost"] == 1 and us.metrics.total("geolb_handovers_lost_total", "eu") == 1
        assert us.peers.circuit_open("eu") and len(us.admission) == 0  # the peer is unreachable for now

    asyncio.run(run())


def test_a_forward_serve_refused_before_any_replica_got_it_is_decided_again():
    from ray.serve.exceptions import BackPressureError

    async def run():
        us, eu, log, served = ingress_pair()

        async def refused(body, fmeta, *, stream=False):
            raise BackPressureError(num_queued_requests=4, max_queued_requests=4)

        eu.forwarded = refused
        us.router.update_peer(PeerState("eu", 1, 0, policy_now()))
        task = asyncio.ensure_future(us.process(_ctx(us.cfg, 1)))
        await _until(lambda: len(us.admission) == 1)  # decided again: eu excluded, nothing local, so held
        assert log == [("eu", "forwarded")] and us.counts["forward_failures"] == 1
        assert us.counts["handovers_lost"] == 0 and us.peers.circuit_open("eu")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert len(us.admission) == 0

    asyncio.run(run())


def test_a_steal_whose_thief_dies_after_taking_it_is_settled_taken_not_put_back():
    async def run():
        us, eu, log, served = ingress_pair()
        ran = []
        eu.stolen = _died_after_taking(ran)
        waiting = [asyncio.ensure_future(us.process(_ctx(us.cfg, i))) for i in range(2)]
        await _until(lambda: len(us.admission) == 2)
        assert us.steal_offer(OFFER)["handed"] == 1
        await _until(lambda: any(t.done() for t in waiting))
        lost = [t for t in waiting if t.done()][0]
        with pytest.raises(GeoHTTPError) as e:
            lost.result()
        assert (e.value.status, e.value.type) == (502, "handover_lost") and len(ran) == 1
        assert len(us.admission) == 1 and us.router.victim.outstanding() == 0  # not put back
        assert us.steal_counts["settled_taken"] == 1 and us.steal_counts["returned"] == 0
        for t in waiting:
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(run())


def test_a_thief_that_answers_429_after_taking_counts_it_sent_back_as_its_victim_counts_it_returned():
    async def run():
        us, eu, log, served = ingress_pair()

        async def full(ctx):  # the thief took it, then found no room: nothing ran
            raise GeoHTTPError(429, "eu: queue full", type_="queue_full", retry_after_s=1.0, region="eu")

        del eu.forwarded  # the real one (ledger, then process), not the pair's stand-in
        eu.process = full
        eu.router.thief.out["us"] = [99, policy_now() + 5.0, 1]  # an offer eu made
        waiting = [asyncio.ensure_future(us.process(_ctx(us.cfg, i))) for i in range(2)]
        await _until(lambda: len(us.admission) == 2)
        assert us.steal_offer(OFFER)["handed"] == 1
        await _until(lambda: us.steal_counts["returned"] == 1 and len(us.admission) == 2)
        assert eu.steal_counts["sent_back"] == 1 and eu.steal_counts["taken"] == 0
        assert eu.router.thief.counts["sent_back"] == 1 and eu.router.thief.counts["taken"] == 0
        assert us.steal_counts["settled_taken"] == 0 and eu.handovers.counts["accepted"] == 1
        assert eu.accounting()["handovers_running"] == 0
        for t in waiting:
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(run())


def test_the_peer_records_each_handover_before_any_work_and_refuses_one_it_has_seen():
    ledger = HandOverLedger("eu", keep=2)
    with ledger.accept("h1", "us"):
        assert ledger.status("h1") == "running" and ledger.running() == 1
        with pytest.raises(GeoHTTPError) as e:
            with ledger.accept("h1", "us"):
                pass
        assert (e.value.status, e.value.type) == (409, "duplicate_handover")
    assert ledger.status("h1") == "answered" and ledger.running() == 0
    with pytest.raises(RuntimeError):
        with ledger.accept("h2", "us"):
            raise RuntimeError("the model call failed")
    assert ledger.status("h2") == "failed"
    for bad in ("", "x" * 65, 7):
        with pytest.raises(GeoHTTPError) as e:
            with ledger.accept(bad, "us"):
                pass
        assert e.value.param == "handover_id"
    with ledger.accept("h3", "us"):
        pass
    assert ledger.status("h1") is None and ledger.status("h3") == "answered"  # a bounded window
    with ledger.accept(None, "us"):  # an origin that sends no id: served, not recorded
        pass
    assert ledger.counts == {"accepted": 3, "duplicates": 1, "without_id": 1}


def test_the_real_forwarded_path_refuses_a_repeated_handover_id():
    async def run():
        us, eu, log, served = ingress_pair()
        del eu.forwarded
        seen = []

        async def answer(ctx):
            seen.append(ctx.request_id)
            return {"region": "eu"}, {"ok": True}

        eu.process = answer
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        fmeta = {"hops": 1, "origin": "us", "max_tokens": 8, "request_id": "q9", "handover_id": "a" * 32}
        await eu.forwarded(dict(body), dict(fmeta), stream=False)
        with pytest.raises(GeoHTTPError) as e:
            await eu.forwarded(dict(body), dict(fmeta), stream=False)
        assert e.value.type == "duplicate_handover" and seen == ["q9"]

    asyncio.run(run())


def test_crash_points_are_named_and_armed_only_on_purpose():
    c = CrashPoints()
    c.reached("served_for_peer")  # disarmed: nothing happens
    with pytest.raises(ValueError, match="unknown crash point"):
        c.arm("somewhere")
    with pytest.raises(ValueError, match="after"):
        c.arm("served_for_peer", 0)
    assert c.arm("served_for_peer", 3) == {"served_for_peer": 3}
    c.reached("served_for_peer")
    c.reached("served_for_peer")  # the third would exit the process
    assert c.arm(None) == {}


def test_a_model_call_is_named_after_its_request_and_unique():
    a, b = ticket_id("req-1"), ticket_id("req-1")
    assert a != b and request_of_call(a) == request_of_call(b) == "req-1"
    assert request_of_call(ticket_id("we ird/id\n" + "x" * 100)) == ("we_ird_id_" + "x" * 100)[:64]
    plain = ticket_id()  # no request id: the random part alone, which names itself
    assert "~" not in plain and request_of_call(plain) == plain
    t = CallTicket(None, "q7")
    assert request_of_call(t) == "q7" and request_of_call(str(t)) == "q7"


def test_the_engine_counts_the_requests_it_ran_to_the_end_and_not_the_cancelled():
    from ray_geolb.serve.emulated import EmulatedEngine

    async def run():
        eng = EmulatedEngine(time_scale=0.001, output_tokens=4)
        for rid in ("r1", "r1", "r2"):
            req = eng.make_request("hello " * 20, 4, ticket_id(rid))
            async for _ in eng.generate(req):
                pass
        gen = eng.generate(eng.make_request("hello " * 20, 50, ticket_id("r3")))
        await gen.__anext__()
        await gen.aclose()  # cancelled after its first token: not run to the end
        await eng.driver.close()
        return eng.ran_request_ids()

    assert asyncio.run(run()) == {"r1": 2, "r2": 1}
