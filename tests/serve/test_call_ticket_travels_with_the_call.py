"""The request and its decision travel with the model call: the id the ingress mints for a call is a
``CallTicket`` (``ray_geolb.serve``) sent as the request object's ``request_id``; the router of the
same process gets that very object from Ray and reads the ingress's RouteRequest from it, then writes
its decision on it. Pickled for the replica, the request object carries the plain id: nothing of the
ingress (no ticket class, no RouteRequest, no decision) leaves the process. No cluster."""

from __future__ import annotations

import pickle

from ray import cloudpickle

import ray_geolb.serve as serve_pkg
from ray_geolb.policy import RouteRequest
from ray_geolb.serve import CallTicket

MARKER = "a prompt only the ingress's RouteRequest holds " * 4


def _chat(ticket):
    from ray_geolb.serve.llm_server import llm_protocol

    req = llm_protocol().ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    req.request_id = ticket  # what ModelClient does with LocalSlot.call_id
    return req


def test_a_pickled_call_carries_the_plain_id_and_nothing_of_the_ingress():
    ticket = CallTicket(RouteRequest(request_id="x", text=MARKER))
    ticket.decision = {"replica": "secret-replica", "reason": "prefix"}
    req = _chat(ticket)
    assert req.request_id is ticket  # in this process: the same object (what the router reads)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        raw = dumps(req)
        for leak in (b"CallTicket", b"ray_geolb", b"secret-replica", MARKER[:20].encode()):
            assert leak not in raw, (dumps, leak)
        back = pickle.loads(raw)
        assert type(back.request_id) is str and back.request_id == str(ticket)
    ticket.withdraw()


def test_a_ticket_hands_its_request_over_once_and_is_never_a_client_string():
    before = serve_pkg.handed_count()
    rreq = RouteRequest(request_id="x", text="p")
    a, b = CallTicket(rreq), CallTicket(rreq)
    assert a != b and isinstance(a, str) and len(a) == 32  # minted: random hex, one per call
    assert serve_pkg.handed_count() == before + 2
    assert a.take() is rreq and a.take() is None  # taken once: a re-routed call reads its prompt again
    b.withdraw()
    b.withdraw()  # idempotent
    assert serve_pkg.handed_count() == before and b.take() is None
    assert not isinstance(str(a), CallTicket)  # a client's x-request-id equal to it is still no ticket
    assert CallTicket().take() is None and serve_pkg.handed_count() == before  # no request: nothing handed
