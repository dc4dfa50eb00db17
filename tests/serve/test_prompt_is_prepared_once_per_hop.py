"""One hop canonicalises and hashes a prompt once: the region ingress hands its RouteRequest to the
GeoPrefixRouter of the same process on the id its LocalSlot minted for the call (a
``ray_geolb.serve.CallTicket``, sent as the request object's ``request_id`` -- never the client's
``x-request-id``), the router's RequestBook takes it instead of extracting the prompt from the call again,
and whatever ends the call, nothing is left behind. No cluster: the router runs ``initialize_state``
only and the calls are Ray's own ``PendingRequest`` / ``RequestMetadata`` objects."""

from __future__ import annotations

import asyncio

import pytest
from fakes import offline_router, pending_request
from ray.serve.context import _set_request_context, _unset_request_context

import ray_geolb.serve as serve_pkg
from ray_geolb.policy import RouteRequest, canonical_text
from ray_geolb.serve.ingress.local_view import LocalView

BODY = {"messages": [{"role": "system", "content": "a long shared system prompt " * 50},
                     {"role": "user", "content": "and a question"}]}


class _Call:
    """The request object the ingress sends (vLLM's protocol object has ``request_id``)."""

    def __init__(self, request_id, body):
        self.request_id = request_id
        self.messages = body.get("messages")


def _pending(serve_id: str, internal_id: str, body):
    """Ray's own pending request (its future needs an event loop: built on one)."""
    async def build():
        return pending_request(body, serve_id, internal_id)

    return asyncio.run(build())


@pytest.fixture
def serve_call():
    _set_request_context(request_id="call-1")
    yield "call-1"
    _unset_request_context()
    assert serve_pkg.handed_count() == 0


def test_router_takes_the_ingress_prompt_and_its_hashes(serve_call):
    router = offline_router()
    view = LocalView("router", lambda: router)
    rreq = RouteRequest(request_id="ing-1", text=canonical_text(BODY))
    prepared = rreq.prepared_for(router.policy.index)  # the ingress priced staying: it hashed already
    slot = view.take_slot("ing-1", lambda: None, rreq)
    assert serve_pkg.handed_count() == 1
    ent = router.book.new_entry(_pending(serve_call, "internal-1", _Call(slot.call_id, {"messages": None})))
    assert router.counters["handed_over"] == 1 and router.counters["no_prompt"] == 0
    assert ent.req.text == rreq.text and ent.req.request_id == "internal-1"
    assert ent.req.prepared_for(router.policy.index) is prepared  # not hashed a second time
    assert serve_pkg.handed_count() == 0  # taken
    slot.release()


def test_a_call_the_router_never_saw_leaves_nothing(serve_call):
    router = offline_router()
    view = LocalView("router", lambda: router)
    slot = view.take_slot("ing-2", lambda: None, RouteRequest(request_id="ing-2", text="x" * 400))
    assert serve_pkg.handed_count() == 1
    slot.release()  # e.g. the client left before the handle call was routed
    slot.release()  # idempotent
    assert serve_pkg.handed_count() == 0


def test_without_a_hand_over_the_router_reads_the_call(serve_call):
    router = offline_router()
    ent = router.book.new_entry(_pending("another-call", "internal-3", BODY))
    assert ent.req.text == canonical_text(BODY) and router.counters["handed_over"] == 0


def test_two_calls_with_the_same_client_request_id_keep_their_own_prompts(serve_call):
    """The client chose the Serve request id (``x-request-id``) of both calls: the hand-over is keyed
    by the ingress's minted ids, so neither takes the other's prompt."""
    router = offline_router()
    view = LocalView("router", lambda: router)
    a, b = RouteRequest(request_id="c", text="prompt A " * 50), RouteRequest(request_id="c", text="prompt B " * 50)
    sa, sb = view.take_slot("c", lambda: None, a), view.take_slot("c", lambda: None, b)
    assert sa.call_id != sb.call_id and len(view.unrouted) == 2  # one slot each, not one id for both
    eb = router.book.new_entry(_pending(serve_call, "internal-b", _Call(sb.call_id, {"messages": None})))
    ea = router.book.new_entry(_pending(serve_call, "internal-a", _Call(sa.call_id, {"messages": None})))
    assert ea.req.text == a.text and eb.req.text == b.text and router.counters["handed_over"] == 2
    forged = router.book.new_entry(_pending(serve_call, "internal-f", _Call(serve_call, BODY)))
    assert forged.req.text == canonical_text(BODY)  # a client-chosen id matches no hand-over
    sa.release()
    sb.release()
    assert not view.unrouted


def test_share_prepared_refuses_another_prompt():
    a, b = RouteRequest(request_id="a", text="one"), RouteRequest(request_id="b", text="two")
    with pytest.raises(ValueError, match="texts differ"):
        a.share_prepared(b)
