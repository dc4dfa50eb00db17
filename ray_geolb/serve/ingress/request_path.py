"""The core request path of one region's ingress: :class:`RequestPath` -- everything except HTTP, so
the FastAPI deployment and the peer handle calls drive the same code.

For each request (a :class:`~.context.RequestContext`):

1. **Decide** with :class:`ray_geolb.policy.region.router.RegionRouter` (the same policy core and the
   same :func:`canonical_text` as the simulator): *local* while this region has an available replica
   (:class:`~.local_view.LocalView`), else *forward* to the best available peer region's ingress
   (regional snapshot: longest prefix already forwarded there, ties by measured RTT; or the 'cost'
   selector), else *hold*.
2. **Hold** in the :class:`~.admission.AdmissionQueue` (FCFS, bounded, time-limited; a request whose
   deadline the queue ahead cannot meet is refused at once, 429 ``deadline_unreachable``, priced by
   :class:`~.deadlines.DeadlineEstimates`).
3. **Run locally** on the model deployment (``local_call.py``: :class:`~.local_call.LocalCalls`, with
   its one retry before the first token), or **forward** (``forward.py``:
   :class:`~.forward.Forwarding`, at most one hop): a forwarded request arrives at the peer's
   ``forwarded`` / ``forwarded_stream`` with ``hops=1`` and is never forwarded again -- if the peer is
   full it waits in the peer's queue. A peer that nothing reached is marked unreachable
   (``RegionRouter.mark_unreachable``) and the request decided again; one that failed after it may have
   taken the request gets it answered 502 ``handover_lost``, never run again (``forward.py``,
   ``handovers.py``).

4. **Steal** (``steal.py``: :class:`~.steal.Stealing`, when ``two_layer.steal.enabled``): an idle region
   offers its free replicas to peers holding requests; a busy one hands held requests over, and a
   request its thief refuses comes back to its old place in the queue.

Counters, metrics, the typed errors they count and the state payload are in ``telemetry.py``
(:class:`~.telemetry.IngressTelemetry`).

Capacity is owned, not caught: the local slot a request takes is a :class:`~.local_view.LocalSlot`
and a streamed response is a :class:`~.streams.TokenStream` closed in the ``finally`` of whatever
consumes it, so a client leaving at any point returns everything; :meth:`RequestPath.accounting`
reads it all back.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from typing import Any, Callable, Hashable, Optional, Tuple, Union

from ray import serve

from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.canonical import canonical_text
from ray_geolb.policy.region import CostSelector, RegionDecision, RegionRouter
from ray_geolb.serve.clock import policy_now

from .admission import AdmissionQueue, HandOver
from .config import IngressConfig
from .context import RequestContext
from .deadlines import DeadlineEstimates
from .errors import ForwardFailed, GeoHTTPError
from .forward import Forwarding
from .handovers import CrashPoints, HandOverLedger
from .local_call import LocalCalls
from .local_view import LocalView, geo_router_of
from .model_client import ModelClient
from .openai import PromptBody
from .peers import PeerMesh
from .retry_budget import RetryBudget
from .siblings import SiblingChannel
from .steal import Stealing
from .streams import TokenStream
from .telemetry import COUNTERS, IngressTelemetry

logger = logging.getLogger("ray.serve")

__all__ = ["COUNTERS", "RequestPath"]

_now = policy_now  # the router's clock (serve/clock.py): ages in its tree and peers' states

#: forward attempts per request (each failed one excludes its peer until that peer's next heartbeat)
FORWARD_ATTEMPTS = 3
#: ids of the requests this ingress replica started serving locally, most recent last (chaos checks:
#: a request is served in one region once)
SERVED_LOG = 10_000


def _replica_source(region: str) -> str:
    """``region/replica id`` of this ingress replica (a random id outside a Serve replica)."""
    try:
        return f"{region}/{serve.get_replica_context().replica_id.unique_id}"
    except Exception:  # noqa: BLE001 - not in a replica
        return f"{region}/{uuid.uuid4().hex[:8]}"


class RequestPath(IngressTelemetry, LocalCalls, Forwarding, Stealing):
    """One region's ingress without HTTP (see the module docstring). Owns the RegionRouter, the
    decision counters and the three parts it drives: the local view, the admission queue and the
    peer mesh. ``model`` is the model deployment's handle; ``geo_router`` (default: that deployment's
    router in this process) returns the GeoPrefixRouter or None. Call :meth:`start` on the event loop
    to start the background work (registry, RTT probes)."""

    def __init__(self, config: Any, model: Any = None, *, geo_router: Optional[Callable[[], Any]] = None,
                 source: Optional[str] = None):
        cfg = config if isinstance(config, IngressConfig) else IngressConfig.model_validate(config or {})
        self.cfg = cfg
        self.region = cfg.region
        self.model = model
        self.llm = ModelClient(model, self.region)
        self.local = LocalView(cfg.local_availability, geo_router or geo_router_of(model))
        self.router = RegionRouter(cfg.two_layer_config(), self.local, clock=_now)
        self.admission = AdmissionQueue(cfg, self.decide, clock=_now)
        #: the region's other ingress replicas' prefix inserts (one affinity view per region; siblings.py)
        self.siblings = SiblingChannel(self.router, self.local.geo_router, enabled=cfg.share_sibling_inserts)
        self.peers = PeerMesh(cfg, source or _replica_source(self.region), self.router, self.local_report,
                              self.peers_changed, clock=_now, siblings=self.siblings)
        self._init_telemetry()
        self._init_stealing()
        self.decisions: dict = {}  # non-local region-layer decisions by kind:reason
        self.served_ids: collections.deque = collections.deque(maxlen=SERVED_LOG)
        #: the hand-overs (forwards, steals) peers sent here, by id; the drills' crash points
        self.handovers = HandOverLedger(self.region)
        self.crashes = CrashPoints()
        #: retries of forwards that could not reach their peer (retry_budget.py)
        self.retries = RetryBudget(cfg.retry_budget_ratio, cfg.retry_budget_min_per_s)
        #: the local drain rate and service times a deadline is priced with (``deadlines.py``)
        self.estimates = DeadlineEstimates()

    def start(self) -> None:
        self.peers.start()
        self._metrics_task = asyncio.get_running_loop().create_task(self._metrics_loop())

    # ------------------------------------------------------------ the region layer
    def decide(self, rreq: RouteRequest, waiting: Optional[Hashable] = None) -> RegionDecision:
        """``RegionRouter.decide`` with this LB's queue ahead set (``waiting``: the request's key in the
        admission queue; None: a newcomer). The local layer answers from the router's published
        snapshot (``local_view.py``), so there is no racing read to retry. If the region layer fails
        anyway (a bug), the failure is counted (``decide_errors``), logged, and the request is decided
        by local availability alone: never failed on the region layer's estimate."""
        try:
            sel = self.router.selector
            if sel is not None and (sel.config.forward_before_saturation or self.local.local_slots() <= 0):
                # the queue ahead only enters the stay cost: priced when the local layer has no free
                # slot, or on every decision when the selector forwards before saturation
                self.set_queue_ahead(waiting)
            d = self.router.decide(rreq, _now())
        except Exception as e:  # noqa: BLE001 - counted and logged; the request is decided below
            self.counts["decide_errors"] += 1
            logger.warning("region %s: decide failed (%r); deciding by local availability", self.region, e)
            return self._decide_by_availability(rreq)
        if d.kind != "local":
            k = f"{d.kind}:{d.reason}"
            self.decisions[k] = self.decisions.get(k, 0) + 1
        return d

    def _decide_by_availability(self, rreq: RouteRequest) -> RegionDecision:
        allowed = self.router.allowed_regions_of(rreq)  # the tenant's regions too, as decide applies them
        if allowed is not None and self.region not in allowed:
            # residency holds on the fallback too: never local outside allowed_regions; wait for a
            # decision that works (the queue's deadline answers 503 if none comes)
            return RegionDecision("hold", reason="decide_error")
        if self.local.local_slots() > 0:
            return RegionDecision("local", None, 0, "local_available")
        return RegionDecision("hold", reason="decide_error")

    def set_queue_ahead(self, waiting: Optional[Hashable]) -> None:
        """Tell the region layer what waits at this LB *ahead of* the request being decided (its
        ``Q_lb``): the router's queue (already sent to the model handle) and the requests before it in
        the admission queue (``waiting`` None: a newcomer, behind all of them). The simulator does the
        same with its single LB queue (nothing ahead of its head)."""
        n, tok = self.admission.ahead(waiting)
        self.router.set_queue(n + self.local.router_queue_len(), tok + self.local.router_queued_tokens())

    def lb_queue_len(self) -> int:
        """Requests waiting at this LB: the admission queue + the GeoPrefixRouter's queue."""
        return len(self.admission) + self.local.router_queue_len()

    def lb_queued_tokens(self) -> float:
        """Prompt tokens waiting at this LB: the admission queue + the GeoPrefixRouter's queue."""
        return float(self.admission.tokens) + self.local.router_queued_tokens()

    def heartbeat_extra(self) -> dict:
        """This region's cost-selector inputs for its peers, as the simulator's ``RegionRouter.heartbeat``
        computes them over its local policy: ``replicas``, ``inflight`` (this router's requests in
        flight), ``t_p_s`` (the pooled t_p, floor applied) and ``queued_tokens`` (this LB's queue).
        Empty until the GeoPrefixRouter exists (nothing to report). Read from its published snapshot."""
        if self.local.snapshot() is None:
            return {}
        sel = self.router.selector or CostSelector()
        return sel.heartbeat_extra(self.router, self.lb_queued_tokens())

    def local_report(self) -> dict:
        """This region's figures for its heartbeat (:meth:`PeerMesh.heartbeat`)."""
        return {"available_replicas": self.local.local_available(), "queue_len": self.lb_queue_len(),
                "extra": self.heartbeat_extra()}

    def expected_s(self, ctx: RequestContext, waiting: Optional[Hashable] = None):
        """(expected wait for a local slot, expected service), seconds (None: unknown), of ``ctx`` with key
        ``waiting`` in the admission queue (None: a newcomer): what its deadline is checked against."""
        n, _tok = self.admission.ahead(waiting)
        est = self.estimates
        wait = est.wait_s(n + self.local.router_queue_len(), self.local.local_slots(), _now())
        return wait, est.service_s(ctx.stream)

    def _local_slot_done(self) -> None:
        """A local call's slot came back (whatever ended it): the drain rate, then :meth:`local_done`."""
        self.estimates.finished(_now())
        self.local_done()

    def local_done(self) -> None:
        """A local request left its replica (done, failed or cancelled): a slot freed. Feeds the
        region layer's drain-rate estimate (``RegionRouter.on_local_complete``, as the simulator does),
        and offers the slot to peers holding requests when nothing waits here (``steal.py``)."""
        self.router.on_local_complete(_now())
        self.admission.kick()
        self.offer_steals()

    def peers_changed(self) -> None:
        """A new peer table (or a peer reachable again): every waiting request is decided again, and
        this region offers its free replicas to peers holding requests (``steal.py``)."""
        self.admission.kick_all()
        self.offer_steals()

    def local_drain_rate(self, now: Optional[float] = None) -> Optional[float]:
        """Local requests finishing per second, as the 'cost' selector measures them
        (``CostSelectorConfig.drain_window_s`` / ``drain_min_samples``; None: unknown, or no 'cost'
        selector). While the region is saturated this is the rate at which its engine slots free up."""
        sel = self.router.selector
        return None if sel is None else sel.drain.rate(_now() if now is None else now)

    def slot_wait_s(self, ahead: int, now: Optional[float] = None) -> float:
        """Expected wait for a local engine slot of a request with ``ahead`` requests before it at
        this LB: ``(ahead + 1) / drain rate`` (0 if unknown) -- the term the selector adds (times q̂)
        to staying when ``stay_slot_wait`` is on and no local replica is available."""
        rate = self.local_drain_rate(now)
        return 0.0 if not rate else (max(0, ahead) + 1) / rate

    # ------------------------------------------------------------ requests
    async def process(self, ctx: RequestContext) -> Tuple[dict, Union[dict, TokenStream]]:
        """Route and run one request. Returns ``(meta, result_dict)`` or ``(meta, TokenStream)``."""
        self.counts["requests"] += 1
        self.retries.on_request()
        if ctx.allowed is not None:
            unknown = ctx.allowed - set(self.cfg.peers) - {self.region}
            if unknown:
                raise GeoHTTPError(400, f"allowed_regions names unknown region(s) {sorted(unknown)}; "
                                        f"regions: {sorted(set(self.cfg.peers) | {self.region})}",
                                   param="allowed_regions")
        rreq = ctx.route_request()
        excluded: set = set()
        last_429: Optional[GeoHTTPError] = None
        attempts = 0
        place: Optional[int] = None  # set when a thief sent it back: it re-enters the queue there
        while attempts < FORWARD_ATTEMPTS:
            left = ctx.remaining_s()
            if left <= 0:  # a forward attempt used it up: nothing started, so 503 like a wait timeout
                self.admission.counts["wait_timeout"] += 1
                raise GeoHTTPError(503, f"region {self.region}: the request's deadline passed before it could be "
                                        f"served (request_timeout_s / x-geolb-timeout-s)",
                                   type_="wait_timeout", retry_after_s=self.cfg.retry_after_s, region=self.region)
            t0 = _now()
            d = await self.admission.admit(rreq, left if ctx.max_wait_s is None else min(ctx.max_wait_s, left),
                                           place=place, deadline_s=left,
                                           expect=lambda key: self.expected_s(ctx, key))
            place = None
            wait_ms = ctx.waited_ms + (_now() - t0) * 1000.0
            if isinstance(d, HandOver):  # a stealing peer pulled it from the queue (steal.py)
                out, place = await self._hand_over(ctx, rreq, d, wait_ms)
                if place is None:
                    return out
                continue  # refused or unreachable: back at its place (not a forward attempt)
            attempts += 1
            if d.kind == "reject":
                self.counts["rejected"] += 1
                self.note_outcome("rejected", d.reason)
                raise GeoHTTPError(403, f"region {self.region} cannot serve this request: {d.reason}",
                                   type_="region_not_allowed", param="allowed_regions", region=self.region)
            if d.kind == "local":
                self.counts["local"] += 1
                self.note_outcome("local" if ctx.hops == 0 else "served_for_peer", d.reason)
                return await self._run_local(ctx, d, wait_ms, rreq)
            self.note_outcome("forwarded", d.reason)
            self.metrics.count("geolb_forwards_total", self.region, d.target)
            try:
                return await self._forward(ctx, rreq, d, wait_ms)
            except GeoHTTPError as e:
                if e.status != 429:
                    raise
                # the peer is full (its queue or its router's): it answered, so it is not down; it is
                # unavailable until its next heartbeat, and the request is decided again (never lost)
                self.counts["forward_failures"] += 1
                logger.info("forward %s -> %s refused (429); re-deciding", self.region, d.target)
                self.router.mark_unreachable(d.target)
                excluded.add(d.target)
                last_429 = e
                continue
            except ForwardFailed as e:
                # The peer ingress is unreachable: mark it unavailable (its circuit opens: it stays so
                # past its next heartbeats, until a probe reaches it) and decide again (never lose it).
                self.counts["forward_failures"] += 1
                logger.warning("forward %s -> %s failed (%s); re-deciding", self.region, d.target, e)
                self.peers.unreachable(d.target)
                excluded.add(d.target)
                if not self.retries.try_spend():
                    self.counts["retries_refused"] += 1
                    raise GeoHTTPError(503, f"region {self.region}: region {d.target} could not be reached and "
                                            f"the retry budget is spent (many forwards are failing); retry later",
                                       type_="forward_failed", retry_after_s=self.cfg.retry_after_s,
                                       region=self.region) from None
        if last_429 is not None:
            raise last_429
        raise GeoHTTPError(503, f"region {self.region}: forwarding failed to {sorted(excluded)}",
                           type_="forward_failed", retry_after_s=self.cfg.retry_after_s, region=self.region)

    async def forwarded(self, body: dict, fmeta: dict, *, stream: bool):
        """A request forwarded by a peer region (hops >= 1: it is never forwarded again). Whatever goes
        wrong here reaches the origin as a :class:`GeoHTTPError`: this region was reached and answered,
        so the origin neither retries the request elsewhere nor marks this region unreachable (only a
        peer it cannot reach is that)."""
        self.counts["forwarded_in"] += 1
        try:
            # recorded before any work: a repeated hand-over id is refused, never run twice (handovers.py)
            with self.handovers.accept(fmeta.get("handover_id"), str(fmeta.get("origin", "?"))):
                self.crashes.reached("handover_accepted")
                body = PromptBody(body)
                ctx = RequestContext.from_wire(body, canonical_text(body), fmeta, stream=stream,
                                               max_timeout_s=self.cfg.request_timeout_s)
                return await self.process(ctx)
        except GeoHTTPError:
            raise
        except Exception as e:  # noqa: BLE001 - typed for the origin; CancelledError passes
            raise self.server_error(e) from None
