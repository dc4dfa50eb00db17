"""This region's local layer as the ingress sees it: :class:`LocalView`, over the model deployment's
GeoPrefixRouter living in this same process (``ray_geolb.serve.router_for``: no actor call).

The view owns the ingress's share of local capacity: the requests sent to the model handle that the
router has not placed yet (``unrouted``; each held by a :class:`LocalSlot`), which it subtracts from
the router's availability. It implements :class:`~ray_geolb.policy.region.local_layer.LocalLayer`
explicitly (no ``__getattr__``), so a :class:`~ray_geolb.policy.region.router.RegionRouter` can use it
as its local layer exactly as the simulator's RegionRouter uses a policy.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any, Callable, Optional

import ray_geolb.serve as _serve_pkg
from ray_geolb.policy.base import Decision

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
    """The local layer a :class:`RegionRouter` sees: the in-process GeoPrefixRouter's policy.

    * ``choose`` -- "is a replica of this region available now?": :meth:`local_available` (the
      router's SP-P availability, minus requests sent locally that it has not placed yet). The
      replica itself is picked by the GeoPrefixRouter when the request reaches the model handle, so
      the view only says *whether* the policy would place it -- which is what ``policy.choose``
      returning a decision or None means in the simulator's RegionRouter.
    * Everything else the region layer reads -- the ``cost`` selector's stay cost and this region's
      heartbeat extras: ``targets``, ``tracker.stats/unseen/outstanding``, ``index``,
      ``mean_prompt_tokens``, ``region_t_p()``, ``queued_tokens(t)`` -- delegates to the live policy
      object of the model deployment's GeoPrefixRouter (no copy, no actor call), so the selector
      prices staying exactly as the simulator's RegionRouter does over its real local policy (a policy
      without a TTFT model answers None, and the selector takes its documented fallback). Until the
      router exists (it is created with the first local request) there are no targets: staying is
      not priced, and every request is local anyway.

    ``availability`` is ``IngressConfig.local_availability``: "router" reads the router; "always"
    (baselines with Ray's own routers) makes every request local-available, with no policy.
    ``geo_router`` returns the router or None (:func:`geo_router_of`).

    The policy lives on the router's event-loop thread; reads here run on the ingress's. They are
    plain attribute/dict reads; a read that races a mutation (a dict resized mid-iteration) raises,
    and the request path's ``decide`` retries the decision.
    """

    def __init__(self, availability: str, geo_router: Callable[[], Optional[Any]]):
        self.availability = availability
        self.geo_router = geo_router
        #: request ids sent to the model handle that the router has not placed yet
        self.unrouted: set = set()
        self.tracker = TrackerView(self)

    def policy(self):
        """The GeoPrefixRouter's policy in this process, or None."""
        r = self._router()
        return r.policy if r is not None else None

    def _router(self):
        """The router whose availability and queue count here (None with ``availability="always"``)."""
        return self.geo_router() if self.availability == "router" else None

    # ------------------------------------------------------------ availability and the router's queue
    def local_available(self) -> int:
        """Available local replicas (what the heartbeat reports to peers), minus requests sent
        locally that the router has not placed yet."""
        return self._minus_unplaced(lambda r: r.num_available())

    def local_slots(self) -> int:
        """Requests the router may still place on its replicas (SP-P's free slots, over all of them:
        ``LoadTracker.free_slots``), minus those sent locally that it has not placed yet. Layer 1
        sends a request to the local layer while this is > 0 -- as the simulator's LB dispatches to
        the policy while a replica has a free slot -- instead of while a replica is available: with
        2 replicas that capped the requests between the ingress and the router at 2."""
        return self._minus_unplaced(lambda r: r.free_slots())

    def _minus_unplaced(self, count) -> int:
        if self.availability == "always":
            return 1
        r = self.geo_router()
        if r is None:
            return 1  # the router is created lazily on the first request: assume available
        try:
            n = count(r)  # an int read from the router's thread: no lock, no cross-thread call
            if self.unrouted:
                n -= sum(1 for rid in self.unrouted if r.decision(rid) is None)
            return max(0, n)
        except Exception:  # noqa: BLE001 - never fail a request on a view
            return 1

    def router_queue_len(self) -> int:
        """Requests held in the router's queue (already sent to the model handle)."""
        r = self._router()
        if r is None:
            return 0
        try:
            return r.queue_len()
        except Exception:  # noqa: BLE001 - a view; never fail on it
            return 0

    def router_queued_tokens(self) -> float:
        """Their prompt tokens."""
        r = self._router()
        if r is None:
            return 0.0
        try:
            return float(r.queued_tokens())
        except Exception:  # noqa: BLE001 - a view; never fail on it
            return 0.0

    def decision(self, request_id: str) -> Optional[dict]:
        """The router's placement of a call (by its slot's ``call_id``): replica, reason, matched,
        queue wait; or None."""
        r = self.geo_router()
        if r is None:
            return None
        try:
            return r.decision(request_id)
        except Exception:  # noqa: BLE001
            return None

    def router_present(self) -> bool:
        return self.geo_router() is not None

    def router_report(self) -> Optional[dict]:
        """The GeoPrefixRouter's policy and counters (None until it exists, or with Ray's routers)."""
        r = self.geo_router()
        if r is None:
            return None
        return {"policy": r.policy_name, "counters": dict(r.counters),
                "headroom_share": list(r.policy.tracker.share)}

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
        slot also hands it over to the router of this process for the duration of the call
        (``ray_geolb.serve.hand_over``, keyed by ``call_id``)."""
        return LocalSlot(self, request_id, on_done, route_request)

    # ------------------------------------------------------------ LocalLayer
    @property
    def targets(self):
        p = self.policy()
        return p.targets if p is not None else []

    @property
    def index(self):
        p = self.policy()
        return p.index if p is not None else None

    @property
    def mean_prompt_tokens(self):
        p = self.policy()
        return p.mean_prompt_tokens if p is not None else None

    def region_t_p(self):
        p = self.policy()
        return p.region_t_p() if p is not None else None

    def queued_tokens(self, target):
        p = self.policy()
        return p.queued_tokens(target) if p is not None else None

    def choose(self, req, now, candidates=None):
        n = self.local_slots()
        return Decision("local", 0, "local_available") if n > 0 else None

    def on_dispatch(self, req, target, now):
        pass

    # ------------------------------------------------------------ inspection only (not LocalLayer)
    # The live policy's TTFT model and pooled fit, where it has them (AttributeError otherwise, as on
    # the policy itself); the region layer reads region_t_p() instead.
    @property
    def ttft(self):
        return self._live().ttft

    @property
    def pooled_t_p(self):
        return self._live().pooled_t_p

    def _live(self):
        p = self.policy()
        if p is None:
            raise AttributeError("no local policy yet (the GeoPrefixRouter is created with the first request)")
        return p


class TrackerView:
    """``LocalView.tracker``: availability as the ingress counts it; per-replica load from the
    router policy's own LoadTracker."""

    def __init__(self, view: LocalView):
        self._view = view

    def _tracker(self):
        p = self._view.policy()
        return p.tracker if p is not None else None

    @property
    def available(self):
        return range(self._view.local_slots())

    def stats(self, target):
        t = self._tracker()
        return t.stats(target) if t is not None else None

    def unseen(self, target):
        t = self._tracker()
        return t.unseen(target) if t is not None else 0

    def outstanding(self, target):
        t = self._tracker()
        return t.outstanding(target) if t is not None else 0

    @property
    def share(self):
        """(rank, n): the router's share of each report's headroom (n routers share the replicas)."""
        t = self._tracker()
        return t.share if t is not None else (0, 1)


class LocalSlot:
    """The local capacity one model call holds: its :attr:`call_id` in the view's ``unrouted`` set
    until the router has placed it (:meth:`routed`), and the slot it frees when it leaves
    (:meth:`release`: ``on_done``, exactly once, whatever path ends the request). A route request
    handed over to the router is withdrawn on release too (the router normally took it already).

    ``call_id`` is minted here, one per model call: the ingress sends it as the request object's
    ``request_id`` (``ModelClient``), the router takes the hand-over and logs its decision under it.
    It is never the client's ``x-request-id``, so two concurrent requests that send the same id
    cannot swap prompts or placements."""

    __slots__ = ("_view", "_rid", "_on_done", "_released", "_handed", "call_id")

    def __init__(self, view: LocalView, request_id: str, on_done: Callable[[], None], route_request: Any = None):
        self._view = view
        self._rid = request_id  # the request's own id (logs); the slot is keyed by call_id
        self.call_id = uuid.uuid4().hex
        self._on_done = on_done
        self._released = False
        self._handed = None
        view.unrouted.add(self.call_id)
        if route_request is not None:
            self._handed = self.call_id
            _serve_pkg.hand_over(self._handed, route_request)

    def routed(self) -> None:
        self._view.unrouted.discard(self.call_id)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._view.unrouted.discard(self.call_id)
            _serve_pkg.withdraw(self._handed)
            self._on_done()
