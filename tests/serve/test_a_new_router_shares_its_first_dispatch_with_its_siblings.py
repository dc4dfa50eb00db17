"""An ingress replica's GeoPrefixRouter is created with the first local request. The sibling ingress
replicas must learn that request's dispatch, too: the router keeps its dispatches' rows for them from its
first one when its process's ingress already shares inserts, not only from the ingress's next heartbeat
(a conversation's next turn at the other replica then matched nothing). A router whose process has no
ingress sharing them keeps nothing (no heartbeat would ever take the rows).

No Ray cluster: a real RequestPath and a real GeoPrefixRouter built offline (``fakes.py``), as two replicas'
worth of a region (Serve's replica context is patched to say rank 0 of 2)."""

from __future__ import annotations

import asyncio

import pytest
from fakes import fake_replica, offline_router, pending_request

pytest.importorskip("ray")

import ray_geolb.serve as serve_pkg  # noqa: E402
import ray_geolb.serve.router as router_mod  # noqa: E402


@pytest.fixture
def two_ingress_replicas(monkeypatch):
    monkeypatch.setattr(serve_pkg, "SIBLING_CHANNEL_OPEN", False)  # a fresh process
    monkeypatch.setattr(router_mod, "holder_share", lambda: (0, 2))


def _dispatch_one(router):
    from ray_geolb.serve.clock import policy_now

    reps = [fake_replica("a", {"num_waiting": 0, "num_running": 0, "max_num_seqs": 4, "timestamp": policy_now()})]
    router.metrics._export = False
    router._sync(reps)

    async def go():  # chosen, then confirmed by Ray (where the policy records the dispatch)
        pr = pending_request({"messages": [{"role": "user", "content": "a first turn " * 200}]}, "s0", "i0")
        assert router._choose(reps, pr)[0][0] is reps[0]
        router.on_request_routed(pr, reps[0].replica_id, None)

    asyncio.run(go())
    assert router.counters["routed"] == 1


def test_the_first_dispatch_of_a_router_created_after_its_ingress_reaches_the_siblings(two_ingress_replicas):
    from ray_geolb.serve.ingress import IngressConfig, RequestPath

    holder = [None]
    path = RequestPath(IngressConfig(region="us", registry=None, model_name="m").model_dump(),
                       geo_router=lambda: holder[0])
    path.siblings.replicas = lambda: 2
    router = holder[0] = offline_router(region="us")  # the first local request creates it...
    _dispatch_one(router)  # ...and is dispatched before the ingress's next heartbeat
    out = path.siblings.outgoing()  # that heartbeat
    dispatches = [row for row in out["sibling_inserts"] if row[0] == "d"]
    assert [row[1] for row in dispatches] == ["a"], out
    assert dispatches[0][2] > 1000  # the prompt's length in characters; the row carries hashes, not text


def test_a_router_whose_process_shares_nothing_keeps_no_rows(two_ingress_replicas):
    router = offline_router(region="us")  # e.g. Ray Serve LLM's OpenAI app with two replicas: no ingress
    _dispatch_one(router)
    assert router.policy.sibling_outbox is router.sibling_outbox and len(router.sibling_outbox) == 0
