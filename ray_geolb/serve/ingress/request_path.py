"""The core request path of one region's ingress: :class:`RequestPath` -- everything except HTTP, so
the FastAPI deployment and the peer handle calls drive the same code.

For each request (a :class:`~.context.RequestContext`):

1. **Decide** with :class:`ray_geolb.policy.region.router.RegionRouter` (the same policy core and the
   same :func:`canonical_text` as the simulator): *local* while this region has an available replica
   (:class:`~.local_view.LocalView`), else *forward* to the best available peer region's ingress
   (regional snapshot: longest prefix already forwarded there, ties by measured RTT; or the 'cost'
   selector), else *hold*.
2. **Hold** in the :class:`~.admission.AdmissionQueue` (FCFS, bounded, time-limited).
3. **Run locally** on the model deployment, or **forward** (at most one hop): a forwarded request
   arrives at the peer's ``forwarded`` / ``forwarded_stream`` with ``hops=1`` and is never forwarded
   again -- if the peer is full it waits in the peer's queue. The forward is recorded in this
   region's snapshot (mirrored to the registry by the :class:`~.peers.PeerMesh`). Inter-region
   latency is injected around the hop (``latency.py``). An unreachable peer is marked so
   (``RegionRouter.mark_unreachable``) and the request decided again.

Capacity is owned, not caught: the local slot a request takes is a :class:`~.local_view.LocalSlot`
and a streamed response is a :class:`~.streams.TokenStream` closed in the ``finally`` of whatever
consumes it, so a client leaving at any point returns everything; :meth:`RequestPath.accounting`
reads it all back.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import uuid
from typing import Any, Callable, Hashable, Optional

from ray import serve
from ray.exceptions import RayActorError

from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.canonical import canonical_text
from ray_geolb.policy.region import CostSelector, RegionDecision, RegionRouter
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.metrics import FLUSH_S, MetricSink

from .admission import AdmissionQueue
from .config import IngressConfig
from .context import RequestContext
from .errors import ForwardFailed, GeoHTTPError, as_http_error
from .local_view import LocalView, geo_router_of
from .model_client import ModelClient, error_in
from .openai import PromptBody
from .peers import PeerMesh
from .retry_budget import RetryBudget
from .streams import NO_TOKEN, TokenStream, aclose_quietly, cancel_quietly

logger = logging.getLogger("ray.serve")

__all__ = ["COUNTERS", "RequestPath"]

_now = policy_now  # the router's clock (serve/clock.py): ages in its tree and peers' states

#: the ingress's counters, in the order the state endpoint lists them (held, queue_full and
#: wait_timeout are the admission queue's)
COUNTERS = ("requests", "local", "forwarded_out", "forwarded_in", "held", "queue_full", "wait_timeout", "rejected",
            "errors", "forward_failures", "bad_requests", "decide_errors", "deadline_exceeded", "retries_refused",
            "local_retries", "stream_errors")
#: attempts of a local call whose replica died before anything reached the client (a retry goes to
#: whichever replica the router picks; it spends the retry budget and the request's deadline)
LOCAL_ATTEMPTS = 2
#: reasons the ingress's counters are pre-registered with (exported at 0 before they first fire)
REJECTION_REASONS = ("bad_request", "too_many_requests", "queue_full", "wait_timeout", "deadline_exceeded",
                     "stream_timeout", "region_not_allowed", "forward_failed", "server_error")
ERROR_REASONS = ("server_error", "stream_failed")
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


class RequestPath:
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
        self.peers = PeerMesh(cfg, source or _replica_source(self.region), self.router, self.local_report,
                              self.admission.kick_all, clock=_now)
        self.counts = {k: 0 for k in COUNTERS if k not in self.admission.counts}
        #: Prometheus metrics (serve/metrics.py), exported once a second by :meth:`start`'s task
        self.metrics = MetricSink({"region": self.region})
        for reason in REJECTION_REASONS:
            self.metrics.preregister("geolb_ingress_rejections_total", reason)
        for reason in ERROR_REASONS:
            self.metrics.preregister("geolb_ingress_requests_total", "error", reason)
        for peer in cfg.peers:
            self.metrics.preregister("geolb_forwards_total", self.region, peer)
        self.decisions: dict = {}  # non-local region-layer decisions by kind:reason
        self.served_ids: collections.deque = collections.deque(maxlen=SERVED_LOG)
        #: retries of forwards that could not reach their peer (retry_budget.py)
        self.retries = RetryBudget(cfg.retry_budget_ratio, cfg.retry_budget_min_per_s)

    def start(self) -> None:
        self.peers.start()
        self._metrics_task = asyncio.get_running_loop().create_task(self._metrics_loop())

    async def _metrics_loop(self) -> None:
        """Once a second: the gauges from the live state, and the counts exported (serve/metrics.py)."""
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                self.update_gauges()
                self.metrics.flush()
            except Exception as e:  # noqa: BLE001 - metrics never stop the ingress
                logger.debug("region %s: metrics: %r", self.region, e)

    def update_gauges(self) -> None:
        m, now = self.metrics, _now()
        m.gauge("geolb_ingress_queue", len(self.admission))
        for peer, ps in self.router.peers.items():
            m.gauge("geolb_peer_available_replicas", ps.available_replicas, peer)
            if math.isfinite(ps.timestamp):
                m.gauge("geolb_peer_age_seconds", max(0.0, now - ps.timestamp), peer)
        for peer, rtt in self.router.measured_rtts().items():
            m.gauge("geolb_peer_rtt_seconds", rtt, peer)
        reg = self.peers.registry
        if reg is not None and reg.last_ok is not None:
            m.gauge("geolb_registry_heartbeat_age_seconds", max(0.0, now - reg.last_ok))

    def note_outcome(self, route: str, reason: str) -> None:
        """One request's layer-1 outcome, for the metrics (``geolb_ingress_requests_total``)."""
        self.metrics.count("geolb_ingress_requests_total", route, reason or "")

    def note_rejection(self, err: GeoHTTPError) -> None:
        """A request answered with an error status (``geolb_ingress_rejections_total`` by its type)."""
        if err.status in (400, 404, 413):
            reason = "bad_request"
        else:
            reason = err.type or str(err.status)
        self.metrics.count("geolb_ingress_rejections_total", reason)

    def note_error(self, reason: str) -> None:
        """A request that failed after it was routed: answered with a 500 (``server_error``) or, after
        its response had started, ended by an error event (``stream_failed``). Counted as
        ``geolb_ingress_requests_total{route="error"}`` (besides the route it was given)."""
        if reason == "stream_failed":
            self.counts["stream_errors"] += 1
        self.metrics.count("geolb_ingress_requests_total", "error", reason)

    @property
    def counters(self) -> dict:
        """Every counter of this ingress (a copy; the admission queue keeps its own)."""
        both = {**self.counts, **self.admission.counts}
        return {k: both[k] for k in COUNTERS}

    def note_bad_request(self) -> None:
        self.counts["bad_requests"] += 1

    # ------------------------------------------------------------ the region layer
    def decide(self, rreq: RouteRequest, waiting: Optional[Hashable] = None) -> RegionDecision:
        """``RegionRouter.decide`` with this LB's queue ahead set (``waiting``: the request's key in the
        admission queue; None: a newcomer). The local policy is read live from the router's thread: a
        read racing a mutation raises (e.g. a dict resized during iteration), so retry; if it keeps
        failing, decide by local availability alone (never fail the request on the region layer's
        estimate)."""
        err = None
        for _ in range(3):
            try:
                sel = self.router.selector
                if sel is not None and (sel.config.forward_before_saturation or self.local.local_slots() <= 0):
                    # the queue ahead only enters the stay cost: priced when the local layer has no free
                    # slot, or on every decision when the selector forwards before saturation
                    self.set_queue_ahead(waiting)
                d = self.router.decide(rreq, _now())
                if d.kind != "local":
                    k = f"{d.kind}:{d.reason}"
                    self.decisions[k] = self.decisions.get(k, 0) + 1
                return d
            except Exception as e:  # noqa: BLE001
                err = e
        self.counts["decide_errors"] += 1
        logger.warning("region %s: decide failed 3 times (%r); deciding by local availability", self.region, err)
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
        computes them over the live local policy: ``replicas``, ``inflight`` (this router's requests in
        flight), ``t_p_s`` (the pooled t_p, floor applied) and ``queued_tokens`` (this LB's queue).
        Empty until the GeoPrefixRouter exists (nothing to report)."""
        if self.local.policy() is None:
            return {}
        sel = self.router.selector or CostSelector()
        for _ in range(3):
            try:
                return sel.heartbeat_extra(self.router, self.lb_queued_tokens())
            except Exception:  # noqa: BLE001 - a racing read: try again, else send none this time
                continue
        return {}

    def local_report(self) -> dict:
        """This region's figures for its heartbeat (:meth:`PeerMesh.heartbeat`)."""
        return {"available_replicas": self.local.local_available(), "queue_len": self.lb_queue_len(),
                "extra": self.heartbeat_extra()}

    def local_done(self) -> None:
        """A local request left its replica (done, failed or cancelled): a slot freed. Feeds the
        region layer's drain-rate estimate (``RegionRouter.on_local_complete``, as the simulator does)."""
        self.router.on_local_complete(_now())
        self.admission.kick()

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
    async def process(self, ctx: RequestContext):
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
        for _ in range(FORWARD_ATTEMPTS):
            left = ctx.remaining_s()
            if left <= 0:  # a forward attempt used it up: nothing started, so 503 like a wait timeout
                self.admission.counts["wait_timeout"] += 1
                raise GeoHTTPError(503, f"region {self.region}: the request's deadline passed before it could be "
                                        f"served (request_timeout_s / x-geolb-timeout-s)",
                                   type_="wait_timeout", retry_after_s=self.cfg.retry_after_s, region=self.region)
            t0 = _now()
            d = await self.admission.admit(rreq, left if ctx.max_wait_s is None else min(ctx.max_wait_s, left))
            wait_ms = ctx.waited_ms + (_now() - t0) * 1000.0
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
            body = PromptBody(body)
            ctx = RequestContext.from_wire(body, canonical_text(body), fmeta, stream=stream,
                                           max_timeout_s=self.cfg.request_timeout_s)
            return await self.process(ctx)
        except GeoHTTPError:
            raise
        except Exception as e:  # noqa: BLE001 - typed for the origin; CancelledError passes
            raise self.server_error(e) from None

    def server_error(self, e: Exception) -> GeoHTTPError:
        """An unexpected failure while serving a request, as the typed 500 the client gets (the cause
        is logged here, not sent: it may quote the prompt)."""
        logger.warning("region %s: request failed: %s", self.region, type(e).__name__, exc_info=e)
        self.note_error("server_error")
        return GeoHTTPError(500, f"region {self.region} failed to serve the request ({type(e).__name__})",
                            type_="server_error", region=self.region)

    def _deadline_exceeded(self, ctx: RequestContext, where: str, per_try_s: float = math.inf) -> GeoHTTPError:
        """The 504 of a request whose response had not started when its deadline (or a forward
        attempt's ``forward_timeout_s``) passed; the work on it was cancelled."""
        if per_try_s < math.inf and ctx.remaining_s() > 0:
            why = f"region {where} did not answer within forward_timeout_s ({per_try_s:g} s)"
        else:
            why = f"the request's deadline passed while region {where} was serving it"
        self.counts["deadline_exceeded"] += 1
        return GeoHTTPError(504, f"{why} (request_timeout_s / x-geolb-timeout-s)", type_="deadline_exceeded",
                            region=where)

    def _model_error(self, e: Exception) -> Optional[GeoHTTPError]:
        """The HTTP error a model call's failure maps to, or None (then it is counted in ``errors``)."""
        err = as_http_error(e, self.region)
        if err is None:
            self.counts["errors"] += 1
        return err

    async def _run_local(self, ctx: RequestContext, d: RegionDecision, wait_ms: float,
                         rreq: Optional[RouteRequest] = None):
        """Run a request on this region's model deployment. The local slot each call takes (its minted
        ``call_id`` in the view's ``unrouted`` set until the router places it, then :meth:`local_done`
        when it leaves) is owned by a :class:`LocalSlot` and returned on every path, cancellation
        included. ``rreq`` (the prompt canonicalised, maybe hashed, here) is handed over to the router
        for the call, under the slot's ``call_id``.

        A replica that dies before anything reached the client (a Ray actor error before the first
        token, or before a non-streamed response) is retried once on whichever replica the router
        picks (:data:`LOCAL_ATTEMPTS`), within the request's deadline and the retry budget; after the
        first token a failure ends the stream with an error event instead (never retried: the
        client has part of an answer)."""
        attempt = 0
        while True:
            attempt += 1
            slot = self.local.take_slot(ctx.request_id, self.local_done, rreq)
            try:
                if ctx.stream:
                    return await self._run_local_stream(ctx, d, wait_ms, slot)
                return await self._run_local_call(ctx, d, wait_ms, slot)
            except GeoHTTPError:
                raise
            except Exception as e:
                if (replica_died(e) and attempt < LOCAL_ATTEMPTS and ctx.remaining_s() > 0
                        and self.retries.try_spend()):
                    self.counts["local_retries"] += 1
                    logger.info("region %s: the replica died before the first token (%s); retrying on "
                                "another replica", self.region, type(_root(e)).__name__)
                    continue
                err = self._model_error(e)
                if err is not None:
                    raise err from None
                raise

    async def _run_local_call(self, ctx: RequestContext, d: RegionDecision, wait_ms: float, slot):
        try:
            res = await asyncio.wait_for(self.llm.complete(ctx, slot.call_id), _bound(ctx.remaining_s()))
        except asyncio.TimeoutError:  # the call is cancelled (complete() cancels its stream)
            raise self._deadline_exceeded(ctx, self.region) from None
        finally:
            slot.release()
        self.served_ids.append(ctx.request_id)
        return self._local_meta(ctx, d, wait_ms, slot.call_id), res

    async def _run_local_stream(self, ctx: RequestContext, d: RegionDecision, wait_ms: float, slot):
        gen = None
        try:
            gen = self.llm.stream(ctx, slot.call_id)
            left = ctx.remaining_s()
            try:
                first = await asyncio.wait_for(gen.__anext__(), _bound(min(self.cfg.first_token_timeout_s, left)))
            except StopAsyncIteration:
                first = NO_TOKEN
            except asyncio.TimeoutError:
                if left < self.cfg.first_token_timeout_s:
                    raise self._deadline_exceeded(ctx, self.region) from None
                raise GeoHTTPError(504, f"region {self.region}: no first token within "
                                        f"{self.cfg.first_token_timeout_s:g} s (first_token_timeout_s)",
                                   type_="stream_timeout", region=self.region) from None
            err = error_in(first, self.region)  # the server refused it (an ErrorResponse first)
            if err is not None:
                raise err
        except BaseException:  # CancelledError too: the client left before the first token
            cancel_quietly(gen)
            slot.release()
            raise
        slot.routed()
        self.served_ids.append(ctx.request_id)
        try:
            meta = self._local_meta(ctx, d, wait_ms, slot.call_id)
        except BaseException:
            cancel_quietly(gen)
            slot.release()
            raise
        return meta, TokenStream(gen, first, on_close=slot.release, idle_timeout_s=self.cfg.stream_idle_timeout_s,
                                 where=f"region {self.region}")

    def _local_meta(self, ctx: RequestContext, d: RegionDecision, wait_ms: float, call_id: str) -> dict:
        info = self.local.decision(call_id)
        meta = {"region": self.region, "route": "local" if ctx.hops == 0 else "forwarded", "origin": ctx.origin,
                "replica": None, "reason": d.reason, "matched_prefix": 0, "queue_wait_ms": wait_ms, "hops": ctx.hops}
        if info:
            meta["replica"] = info.get("replica")
            meta["reason"] = info.get("reason") or d.reason
            meta["matched_prefix"] = int(info.get("matched") or 0)
            meta["queue_wait_ms"] = wait_ms + 1000.0 * float(info.get("queue_wait_s") or 0.0)
        return meta

    async def _forward(self, ctx: RequestContext, rreq: RouteRequest, d: RegionDecision, wait_ms: float):
        """Send the request to peer ``d.target``'s ingress (one hop). Raises :class:`ForwardFailed` if the
        peer cannot be reached, or the peer's :class:`GeoHTTPError`."""
        peer = d.target
        self.router.on_forward(rreq, peer, _now())
        self.peers.snapshot_changed()
        # optimistic: count the forward in the peer's LB queue until its next heartbeat, so a burst
        # stops going to a peer after ~tau forwards per heartbeat period instead of herding there
        self.router.note_forward(peer)
        self.counts["forwarded_out"] += 1
        try:
            h = self.peers.handle(peer)
        except Exception as e:  # noqa: BLE001
            raise ForwardFailed(str(e)) from None
        latency = self.peers.latency
        try:
            await latency.hop(self.region, peer)
        except ConnectionError as e:  # dropped on the way (an injected partition): nothing reached the peer
            raise ForwardFailed(str(e)) from None
        fmeta = ctx.wire(wait_ms, d)  # after the hop: the deadline it carries is the time left on arrival
        if ctx.stream:
            return await self._forward_stream(h, peer, ctx, fmeta, d)
        resp = h.forwarded.remote(dict(ctx.body), fmeta)
        try:
            meta, res = await asyncio.wait_for(resp, _bound(min(self.cfg.forward_timeout_s, ctx.remaining_s())))
        except asyncio.TimeoutError:
            # reached and working on it, or silent: typed, never retried elsewhere (no double serving)
            cancel_quietly(resp)
            raise self._deadline_exceeded(ctx, peer, self.cfg.forward_timeout_s) from None
        except Exception as e:
            await latency.hop(peer, self.region)
            err = as_http_error(e, peer)
            if err is not None:
                raise err from None
            raise ForwardFailed(f"{type(e).__name__}: {e}") from None
        await latency.hop(peer, self.region)
        return _forward_meta(meta, d), res

    async def _forward_stream(self, h, peer: str, ctx: RequestContext, fmeta: dict, d: RegionDecision):
        gen = h.options(stream=True).forwarded_stream.remote(dict(ctx.body), fmeta)
        relay = self.peers.latency.relay(gen, peer, self.region)
        left = ctx.remaining_s()
        try:
            meta = await asyncio.wait_for(relay.__anext__(), _bound(min(self.cfg.first_token_timeout_s, left)))
        except BaseException as e:  # CancelledError too: the peer must stop working on it
            await aclose_quietly(relay)
            cancel_quietly(gen)
            if not isinstance(e, Exception):
                raise
            if isinstance(e, asyncio.TimeoutError) and left < self.cfg.first_token_timeout_s:
                raise self._deadline_exceeded(ctx, peer) from None
            if isinstance(e, asyncio.TimeoutError):  # reached but silent: typed, not "unreachable"
                raise GeoHTTPError(504, f"region {peer} did not start the stream within "
                                        f"{self.cfg.first_token_timeout_s:g} s (first_token_timeout_s)",
                                   type_="stream_timeout", region=peer) from None
            err = as_http_error(e, peer)
            if err is not None:
                raise err from None
            raise ForwardFailed(f"{type(e).__name__}: {e}") from None

        async def close():
            cancel_quietly(gen)
            await aclose_quietly(relay)

        idle = self.cfg.stream_idle_timeout_s
        return _forward_meta(meta, d), TokenStream(relay, NO_TOKEN, on_close=close, idle_timeout_s=idle,
                                                   where=f"region {peer}")

    # ------------------------------------------------------------ inspection
    def accounting(self) -> dict:
        """What requests hold at this LB right now, ingress and router (leak checks; a handle call,
        not HTTP). Idle: every count 0 (see :meth:`GeoPrefixRouter.accounting`)."""
        out = {"ingress_queue": len(self.admission), "ingress_queue_tokens": self.admission.tokens}
        out.update(self.local.accounting())
        return out

    def available_peers(self) -> list:
        """Peer regions a request could be forwarded to now, sorted."""
        return sorted(self.router.available_peers(_now()))

    def state(self) -> dict:
        """The ``/v1/geolb/state`` payload (operators only): the peer table, the region layer's last
        comparison, queues, counters and the configuration (never the admin token)."""
        now = _now()
        router, sel = self.router, self.router.selector
        costs = None
        if sel is not None:
            costs = {("stay" if k is None else k): (v if math.isfinite(v) else None) for k, v in sel.last_costs.items()}
        used_rtt = getattr(sel, "last_rtts", None)
        return {
            "region": self.region,
            "source": self.peers.source,
            "local_available": self.local.local_available(),
            "router_present": self.local.router_present(),
            "queue_len": len(self.admission),
            "lb_queue_len": self.lb_queue_len(),
            "available_peers": self.available_peers(),
            "peers": {r: _peer_state(ps, now) for r, ps in router.peers.items()},
            "measured_rtt_ms": {p: round(v * 1000, 2) for p, v in router.measured_rtts().items()},
            "remote": router.config.remote,
            "lb_queued_tokens": self.lb_queued_tokens(),
            "heartbeat_extra": self.heartbeat_extra(),
            "last_costs_s": costs,  # the 'cost' selector's last comparison (stay = hold here)
            "last_cost_rtts_ms": None if used_rtt is None else {p: round(v * 1000, 2) for p, v in used_rtt.items()},
            "last_slot_wait_s": getattr(sel, "last_slot_wait_s", None),  # the stay cost's slot wait (before q̂)
            "snapshot_nodes": router.snapshot.num_nodes,
            "snapshot_loaded_from_registry": self.peers.snapshot_loaded,
            "registry": self.peers.status(),
            "open_circuits": sorted(p for p in self.cfg.peers if self.peers.circuit_open(p)),
            "injected_faults": self.peers.latency.faults,
            "counters": self.counters,
            "router": self.local.router_report(),  # the model deployment's router here: policy, counters
            "decisions": dict(self.decisions),
            "config": self.cfg.model_dump(exclude={"admin_token"}),
        }


def _root(e: BaseException) -> BaseException:
    """The exception inside Ray's wrappers (``RayTaskError.cause``), else ``e``."""
    for _ in range(5):
        c = getattr(e, "cause", None)
        if not isinstance(c, BaseException):
            break
        e = c
    return e


def replica_died(e: BaseException) -> bool:
    """True if ``e`` says the replica serving a call died or became unreachable (a Ray actor error):
    the call's work is lost, so one that had sent nothing to the client may be retried."""
    return isinstance(e, RayActorError) or isinstance(_root(e), RayActorError)


def _bound(seconds: float) -> Optional[float]:
    """An ``asyncio.wait_for`` timeout: None for no bound (inf), else at least 0."""
    return None if math.isinf(seconds) else max(0.0, seconds)


def _forward_meta(meta: dict, d: RegionDecision) -> dict:
    meta = dict(meta)
    meta["route"] = "forwarded"
    meta["forward_reason"] = d.reason
    return meta


def _peer_state(ps, now: float) -> dict:
    """A peer's row in the state payload."""
    age = now - ps.timestamp
    return {"available_replicas": ps.available_replicas, "queue_len": ps.queue_len,
            "age_s": None if math.isinf(age) else round(age, 3),
            "rtt_ms": None if ps.rtt_s is None else round(ps.rtt_s * 1000, 2),
            "extra": {k: v for k, v in (ps.extra or {}).items() if isinstance(v, (int, float)) and math.isfinite(v)},
            "prefix_summary": None if ps.prefix_summary is None else
            {"keys": ps.prefix_summary.n, "bytes": ps.prefix_summary.wire_bytes(),
             "false_positive_rate": round(ps.prefix_summary.false_positive_rate(), 5)}}
