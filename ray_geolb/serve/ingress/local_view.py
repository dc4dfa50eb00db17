"""This region's local layer as the ingress sees it: :class:`LocalView`, over the snapshot the model
deployment's GeoPrefixRouter in this same process publishes (``ray_geolb.serve.router_for``: no actor
call; ``serve/router_snapshot.py``).

The view owns the ingress's share of local capacity: the requests sent to the model handle that the
router has not placed yet (``unrouted``; each held by a :class:`LocalSlot`), which it subtracts from
the router's availability. It implements :class:`~ray_geolb.policy.region.local_layer.LocalLayer`
explicitly (no ``__getattr__``), so a :class:`~ray_geolb.policy.region.router.RegionRouter` can use it
as its local layer exactly as the simulator's RegionRouter uses a policy.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import ray_geolb.serve as _serve_pkg
from ray_geolb.policy.base import Decision
from ray_geolb.serve import CallTicket
from ray_geolb.serve.router_snapshot import RouterSnapshot

__all__ = ["LocalSlot", "LocalView", "TrackerView", "geo_router_of"]


def geo_router_of(model: Any) -> Callable[[], Optional[Any]]:
    """A function returning the live GeoPrefixRouter of the model deployment behind handle ``model``
    in this process, or None (no such router yet, or ``model`` is not a deployment handle)."""
    app = getattr(model, "app_name", None)
    dep = getattr(model, "deployment_name", None)
    if app is None or dep is None:
        return lambda: None
    found: list = [None, -1]  # a weak reference to the router and the registry generation it was found at

    def router() -> Optional[Any]:
        ref, gen = found
        r = ref() if ref is not None else None
        if r is None or gen != _serve_pkg.GENERATION:  # no router yet, or a router registered since
            gen = _serve_pkg.GENERATION
            r = _serve_pkg.router_for(app, dep)  # the registry, under its lock
            found[:] = [weakref.ref(r) if r is not None else None, gen]
        return r  # otherwise two plain reads: no lock on the request path

    return router


class LocalView:
    """The local layer a :class:`RegionRouter` sees: the in-process GeoPrefixRouter's published
    :class:`~ray_geolb.serve.router_snapshot.RouterSnapshot`.

    * ``choose`` -- "is a replica of this region available now?": :meth:`local_slots` (the router's
      SP-P free slots, minus requests sent locally that it has not placed yet). The replica itself
      is picked by the GeoPrefixRouter when the request reaches the model handle, so the view only
      says *whether* the policy would place it -- which is what ``policy.choose`` returning a
      decision or None means in the simulator's RegionRouter.
    * Everything else the region layer reads -- the ``cost`` selector's stay cost and this region's
      heartbeat extras: ``targets``, ``tracker.stats/unseen/outstanding/share``, ``index``,
      ``infers_replies``, ``mean_prompt_tokens``, ``region_t_p()``, ``queued_tokens(t)`` -- is read from the
      router's last snapshot, so the selector prices staying as the simulator's RegionRouter does over its
      real local policy (a policy without a TTFT model answers None, and the selector takes its
      documented fallback). Until the router exists (it is created with the first local request)
      there are no targets: staying is not priced, and every request is local anyway.

    ``availability`` is ``IngressConfig.local_availability``: "router" reads the router; "always"
    (baselines with Ray's own routers) makes every request local-available, with no policy.
    ``geo_router`` returns the router or None (:func:`geo_router_of`).

    The router publishes a new frozen snapshot after each event, on its own thread, by one attribute
    swap; each read here takes ``router.snapshot`` once and reads only that object: nothing is read
    while Ray's loop changes it, so nothing here retries or catches. (The prefix index the snapshot
    names is the one shared structure: see ``serve/router_snapshot.py``.)
    """

    def __init__(self, availability: str, geo_router: Callable[[], Optional[Any]]):
        self.availability = availability
        self.geo_router = geo_router
        #: request ids sent to the model handle that the router has not placed yet
        self.unrouted: set = set()
        self.tracker = TrackerView(self)

    def snapshot(self) -> Optional[RouterSnapshot]:
        """The GeoPrefixRouter's last published snapshot in this process, or None (no router yet)."""
        r = self.geo_router()
        return r.snapshot if r is not None else None

    def _counted(self) -> Optional[RouterSnapshot]:
        """The snapshot whose availability and queue count here (None with ``availability="always"``)."""
        return self.snapshot() if self.availability == "router" else None

    # ------------------------------------------------------------ availability and the router's queue
    def local_available(self) -> int:
        """Available local replicas (what the heartbeat reports to peers), minus requests sent
        locally that the router has not placed yet."""
        return self._minus_unplaced(lambda s: s.available)

    def local_slots(self) -> int:
        """Requests the router may still place on its replicas (SP-P's free slots, over all of them:
        ``LoadTracker.free_slots``), minus those sent locally that it has not placed yet. Layer 1
        sends a request to the local layer while this is > 0 -- as the simulator's LB dispatches to
        the policy while a replica has a free slot -- instead of while a replica is available: with
        2 replicas that capped the requests between the ingress and the router at 2."""
        return self._minus_unplaced(lambda s: s.free_slots)

    def _minus_unplaced(self, count: Callable[[RouterSnapshot], int]) -> int:
        if self.availability == "always":
            return 1
        r = self.geo_router()
        if r is None:
            return 1  # the router is created lazily on the first request: assume available
        n = count(r.snapshot)
        if self.unrouted:  # the router writes its decision on the call's ticket when it placed it
            n -= sum(1 for ticket in self.unrouted if ticket.decision is None)
        return max(0, n)

    def router_queue_len(self) -> int:
        """Requests held in the router's queue (already sent to the model handle)."""
        s = self._counted()
        return 0 if s is None else s.queue_len

    def router_queued_tokens(self) -> float:
        """Their prompt tokens."""
        s = self._counted()
        return 0.0 if s is None else s.queued_tokens

    def router_present(self) -> bool:
        return self.geo_router() is not None

    def router_report(self) -> Optional[dict]:
        """The GeoPrefixRouter's policy and counters (None until it exists, or with Ray's routers)."""
        r = self.geo_router()
        if r is None:
            return None
        return {"policy": r.policy_name, "counters": dict(r.counters),
                "headroom_share": list(r.snapshot.share)}

    def accounting(self) -> dict:
        """What requests hold here and in the router (see :meth:`GeoPrefixRouter.accounting`)."""
        out = {"local_unrouted": len(self.unrouted), "local_available": self.local_available()}
        r = self.geo_router()
        if r is not None:
            out.update(r.accounting())
        return out

    def take_slot(self, request_id: str, on_done: Callable[[], None], route_request: Any = None) -> "LocalSlot":
        """The local slot a request sent to the model handle takes (see :class:`LocalSlot`; send the
        call with its ``call_id``). With ``route_request`` (its prompt already canonicalised here), the
        call's ticket carries it to the router of this process (``ray_geolb.serve.CallTicket``)."""
        return LocalSlot(self, request_id, on_done, route_request)

    # ------------------------------------------------------------ LocalLayer
    @property
    def targets(self):
        s = self.snapshot()
        return s.targets if s is not None else []

    @property
    def index(self):
        s = self.snapshot()
        return s.index if s is not None else None

    @property
    def mean_prompt_tokens(self):
        s = self.snapshot()
        return s.mean_prompt_tokens if s is not None else None

    @property
    def infers_replies(self):
        s = self.snapshot()
        return s.infers_replies if s is not None else False

    def region_t_p(self):
        s = self.snapshot()
        return s.t_p if s is not None else None

    def queued_tokens(self, target):
        s = self.snapshot()
        return s.engine_queued.get(target) if s is not None else None

    def choose(self, req, now, candidates=None):
        n = self.local_slots()
        return Decision("local", 0, "local_available") if n > 0 else None

    def on_dispatch(self, req, target, now):
        pass

    # ------------------------------------------------------------ inspection only (not LocalLayer)
    # The router policy's TTFT model and pooled fit, where it has them (AttributeError otherwise, as on
    # the policy itself); the region layer reads region_t_p() from the snapshot instead.
    @property
    def ttft(self):
        return self._policy().ttft

    @property
    def pooled_t_p(self):
        return self._policy().pooled_t_p

    def _policy(self):
        r = self.geo_router()
        if r is None:
            raise AttributeError("no local policy yet (the GeoPrefixRouter is created with the first request)")
        return r.policy


class TrackerView:
    """``LocalView.tracker``: availability as the ingress counts it; per-replica load from the
    router's snapshot."""

    def __init__(self, view: LocalView):
        self._view = view

    @property
    def available(self):
        return range(self._view.local_slots())

    def stats(self, target):
        s = self._view.snapshot()
        return s.stats.get(target) if s is not None else None

    def unseen(self, target):
        s = self._view.snapshot()
        return s.unseen.get(target, 0) if s is not None else 0

    def outstanding(self, target):
        s = self._view.snapshot()
        return s.outstanding.get(target, 0) if s is not None else 0

    @property
    def share(self):
        """(rank, n): the router's share of each report's headroom (n routers share the replicas)."""
        s = self._view.snapshot()
        return s.share if s is not None else (0, 1)


class LocalSlot:
    """The local capacity one model call holds: its :attr:`call_id` in the view's ``unrouted`` set
    until the router has placed it (:meth:`routed`), and the slot it frees when it leaves
    (:meth:`release`: ``on_done``, exactly once, whatever path ends the request).

    ``call_id`` is a :class:`~ray_geolb.serve.CallTicket` minted here, one per model call: the
    ingress sends it as the request object's ``request_id`` (``ModelClient``); it carries the
    ``route_request`` to the router of this process and brings the router's decision back
    (:attr:`decision`). Its id names the request (``<request id>~<random hex>``,
    :func:`~ray_geolb.serve.ticket_id`), so the engine's count of the calls it ran names the request
    too; the random part keeps it unique per call, so two concurrent requests that send the same
    ``x-request-id`` cannot swap prompts or placements. A route request the router never took is
    withdrawn on release."""

    __slots__ = ("_view", "_rid", "_on_done", "_released", "call_id")

    def __init__(self, view: LocalView, request_id: str, on_done: Callable[[], None], route_request: Any = None):
        self._view = view
        self._rid = request_id  # the request's own id (logs); the slot is keyed by call_id
        self.call_id = CallTicket(route_request, request_id)
        self._on_done = on_done
        self._released = False
        view.unrouted.add(self.call_id)

    @property
    def decision(self) -> Optional[dict]:
        """The router's placement of this call (replica, reason, matched, queue wait), or None (not
        placed yet, or placed by a router that is not this process's GeoPrefixRouter)."""
        return self.call_id.decision

    def routed(self) -> None:
        self._view.unrouted.discard(self.call_id)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._view.unrouted.discard(self.call_id)
            self.call_id.withdraw()
            self._on_done()
