"""Stand-ins the serve tests share for what Ray would give them without a cluster: a real GeoPrefixRouter
built without Ray, Ray's replicas and pending requests, and the router view the region ingress reads.

Imported by plain name (``from fakes import ...``): pytest puts this folder on ``sys.path``. Importing it
imports nothing heavy; each helper imports Ray Serve when it is called. The module-scoped cluster
fixture is in ``conftest.py`` next to this file."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Optional, Union


def offline_router(**kwargs):
    """A real GeoPrefixRouter without Ray: Ray's ``RequestRouter.__init__`` is skipped (no deployment,
    no replica set of Ray's), only ``initialize_state(**kwargs)`` runs, with the ``request_router_kwargs``
    Serve would pass; it raises what ``initialize_state`` raises."""
    from ray_geolb.serve.router import GeoPrefixRouter

    r = GeoPrefixRouter.__new__(GeoPrefixRouter)
    r._deployment_id = None
    r.initialize_state(**kwargs)
    return r


def fake_replica(uid: str, stats: Optional[dict], region: Optional[str] = None):
    """Ray's ``RunningReplica`` as the router reads it: ``replica_id.unique_id``, ``replica_metadata``
    (``{"region": region}``, or ``{}`` without a region) and ``routing_stats`` (the replica's last report)."""
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=uid),
                           replica_metadata={} if region is None else {"region": region}, routing_stats=stats)


def pending_request(body: Any, serve_id: str, internal_id: str):
    """Ray's own ``PendingRequest`` for one call with ``body`` as its argument (``request_id`` =
    ``serve_id``, ``internal_request_id`` = ``internal_id``). Its future needs an event loop: build it
    on one."""
    from ray.serve._private.common import RequestMetadata
    from ray.serve._private.request_router.common import PendingRequest

    return PendingRequest(args=[body], kwargs={},
                          metadata=RequestMetadata(request_id=serve_id, internal_request_id=internal_id))


class _FakeRouterView(SimpleNamespace):
    """A SimpleNamespace whose ``snapshot`` is taken at each read (as if the router published after
    every change the test makes)."""

    @property
    def snapshot(self):
        from ray_geolb.serve.router_snapshot import snapshot_of

        return snapshot_of(self)


def fake_router_view(policy, slots: Union[int, Callable[[], int]] = 0, queue: int = 0, tokens: float = 0.0):
    """What the region ingress (``RequestPath(cfg, geo_router=lambda: view)``) reads from its region's
    GeoPrefixRouter: the live ``policy``, free ``slots`` (``num_available`` and ``free_slots``; a callable
    is asked at each read), the router's ``queue`` length and queued ``tokens``, and no decisions; its
    ``snapshot`` (what the ingress reads) is taken from those at each read."""
    free = slots if callable(slots) else (lambda: slots)
    return _FakeRouterView(policy=policy, num_available=free, free_slots=free, queue_len=lambda: queue,
                           queued_tokens=lambda: tokens, decision=lambda rid: None)


def response_kind(status, raw, stream):
    """What a chaos test's client got: "ok", "typed:<type>" (a JSON error body), "stream_error" (a stream
    ended by a typed error event) or "untyped" (anything else: what the chaos tests forbid)."""
    import json

    if status == 200 and not stream:
        return "ok" if '"choices"' in raw else "untyped"
    if status == 200:
        events = [e[len("data: "):] for e in raw.split("\n\n") if e.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return "untyped"
        return "stream_error" if any(e.startswith('{"error"') for e in events) else "ok"
    try:
        return f"typed:{json.loads(raw)['error']['type']}"
    except (ValueError, KeyError, TypeError):
        return "untyped"


async def ingress_state(client, base, region, headers):
    """The ``/v1/geolb/state`` payload of ``region``'s ingress (an httpx ``AsyncClient``), or None while it
    cannot answer (restarting, partitioned)."""
    import httpx

    try:
        r = await client.get(f"{base}/{region}/v1/geolb/state", headers=headers)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def wait_until(check, what, bound, poll_s=0.1):
    """Seconds until ``check()`` (async) is true; the test fails after ``bound`` seconds."""
    import asyncio
    import time

    t0 = time.monotonic()
    while not await check():
        assert time.monotonic() - t0 < bound, f"{what}: not within {bound:g} s"
        await asyncio.sleep(poll_s)
    return time.monotonic() - t0


def busy_view():
    """A router view of one replica with work waiting: no local slot (the ingress holds or forwards)."""
    from ray_geolb.policy import ReplicaStats, build_policy
    from ray_geolb.serve.clock import policy_now

    policy = build_policy("geoprefix", targets=["r1"])
    policy.on_stats("r1", ReplicaStats(num_waiting=3, num_running=4, timestamp=policy_now(), max_num_seqs=4))
    return _with_accounting(fake_router_view(policy))


def _with_accounting(view):
    view.accounting = lambda: {}  # the router's own share of RequestPath.accounting (none here)
    return view


def idle_view():
    """A router view of two idle replicas: two local slots."""
    from ray_geolb.policy import ReplicaStats, build_policy
    from ray_geolb.serve.clock import policy_now

    policy = build_policy("geoprefix", targets=["r1", "r2"])
    for r in ("r1", "r2"):
        policy.on_stats(r, ReplicaStats(num_waiting=0, num_running=0, timestamp=policy_now(), max_num_seqs=4))
    return _with_accounting(fake_router_view(policy, slots=2))


class InProcessHandles:
    """In-process stand-ins for the peers' ingress handles: ``steal_offer`` / ``stolen`` / ``forwarded``
    call the peer RequestPath's methods directly (a handle call's result is awaitable)."""

    def __init__(self, paths, log):
        self.paths, self.log = paths, log

    def __call__(self, region):
        path, log = self.paths[region], self.log

        class Method:
            def __init__(self, name):
                self.name = name

            def remote(self, *args):
                log.append((region, self.name))
                if self.name == "steal_offer":
                    async def answer():
                        return path.steal_offer(*args)
                    return answer()
                if self.name == "stolen":
                    return path.stolen(*args, stream=False)
                return path.forwarded(*args, stream=False)

        class Handle:
            def __getattr__(self, name):
                return Method(name)

        return Handle()


#: the region layer of :func:`ingress_pair`'s regions: the nearest peer, work stealing on
STEAL = {"remote": "nearest", "steal": {"enabled": True}}


def ingress_pair(thief_free=True):
    """Two real RequestPaths, ``us`` (busy: it holds) and ``eu`` (idle, unless ``thief_free`` is False),
    wired by :class:`InProcessHandles`. ``eu.forwarded`` answers at once and records the request's id in
    ``served``; ``us`` sees ``eu`` with no free replica (it cannot forward) at a 2 ms RTT. Returns
    ``(us, eu, log, served)``; ``log`` lists each handle call as ``(region, method)``."""
    from ray_geolb.policy.region import PeerState
    from ray_geolb.serve.clock import policy_now
    from ray_geolb.serve.ingress import IngressConfig, RequestPath

    us = RequestPath(IngressConfig(region="us", registry=None, model_name="m", peers={"eu": "geolb-eu"},
                                   two_layer=STEAL, latency={"scale": 0.0}).model_dump(),
                     geo_router=lambda: busy_view())
    eu = RequestPath(IngressConfig(region="eu", registry=None, model_name="m", peers={"us": "geolb-us"},
                                   two_layer=STEAL, latency={"scale": 0.0}).model_dump(),
                     geo_router=(lambda: idle_view()) if thief_free else (lambda: busy_view()))
    log = []
    handles = InProcessHandles({"us": us, "eu": eu}, log)
    us.peers.handle = eu.peers.handle = handles
    served = []

    async def serve_here(body, fmeta, *, stream):  # the thief's model: answer at once, record the id
        served.append(fmeta["request_id"])
        return {"region": "eu", "route": "local"}, {"id": fmeta["request_id"], "hops": fmeta["hops"]}

    eu.forwarded = serve_here
    now = policy_now()
    us.router.update_peer(PeerState("eu", 0, 0, now))  # us cannot forward: it holds
    us.router.observe_rtt("eu", 0.002)  # a near thief: moving beats waiting here (Victim.pick's gain)
    return us, eu, log, served
