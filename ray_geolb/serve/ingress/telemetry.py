"""What one region's ingress tells the operator: :class:`IngressTelemetry` -- its counters, its
Prometheus metrics (``serve/metrics.py``: counted on the request path, exported once a second), the
typed errors it counts (500, deadline 504), and the ``/v1/geolb/state`` payload and accounting.
No routing decision depends on anything here.

A mixin of :class:`~.request_path.RequestPath`; it reads ``cfg``, ``region``, ``router``, ``local``,
``admission``, ``peers``, ``decisions``, ``steal_state`` / ``_offer_tasks`` (``steal.py``) and
``lb_queue_len`` / ``lb_queued_tokens`` / ``heartbeat_extra``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Optional

from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.metrics import FLUSH_S, MetricSink

from .context import RequestContext
from .errors import GeoHTTPError, as_http_error

logger = logging.getLogger("ray.serve")

__all__ = ["COUNTERS", "ERROR_REASONS", "IngressTelemetry", "REJECTION_REASONS"]

#: the ingress's counters, in the order the state endpoint lists them (held, queue_full,
#: wait_timeout and deadline_unreachable are the admission queue's)
COUNTERS = ("requests", "local", "forwarded_out", "forwarded_in", "held", "queue_full", "wait_timeout", "rejected",
            "errors", "forward_failures", "bad_requests", "decide_errors", "deadline_exceeded", "retries_refused",
            "local_retries", "stream_errors", "deadline_unreachable", "handovers_lost")
#: reasons the ingress's counters are pre-registered with (exported at 0 before they first fire)
REJECTION_REASONS = ("bad_request", "too_many_requests", "queue_full", "wait_timeout", "deadline_exceeded",
                     "deadline_unreachable",
                     "stream_timeout", "region_not_allowed", "forward_failed", "server_error", "handover_lost",
                     "duplicate_handover")
ERROR_REASONS = ("server_error", "stream_failed")


class IngressTelemetry:
    """See the module docstring."""

    def _init_telemetry(self) -> None:
        self.counts = {k: 0 for k in COUNTERS if k not in self.admission.counts}
        #: Prometheus metrics (serve/metrics.py), exported once a second by :meth:`start`'s task
        self.metrics = MetricSink({"region": self.region})
        for reason in REJECTION_REASONS:
            self.metrics.preregister("geolb_ingress_rejections_total", reason)
        for reason in ERROR_REASONS:
            self.metrics.preregister("geolb_ingress_requests_total", "error", reason)
        for peer in self.cfg.peers:
            self.metrics.preregister("geolb_forwards_total", self.region, peer)
            self.metrics.preregister("geolb_handovers_lost_total", peer)

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
        m, now = self.metrics, policy_now()
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

    # ------------------------------------------------------------ the typed errors it counts
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
                            retry_after_s=self.cfg.retry_after_s, region=where)

    def _model_error(self, e: Exception) -> Optional[GeoHTTPError]:
        """The HTTP error a model call's failure maps to, or None (then it is counted in ``errors``)."""
        err = as_http_error(e, self.region)
        if err is None:
            self.counts["errors"] += 1
        return err

    # ------------------------------------------------------------ inspection
    def accounting(self) -> dict:
        """What requests hold at this LB right now, ingress and router (leak checks; a handle call,
        not HTTP). Idle: every count 0 (see :meth:`GeoPrefixRouter.accounting`)."""
        out = {"ingress_queue": len(self.admission), "ingress_queue_tokens": self.admission.tokens}
        if self.router.victim is not None:  # work stealing: held requests handed to a thief, not yet settled
            out["steal_in_flight"] = self.router.victim.outstanding()
            out["steal_offer_tasks"] = len(self._offer_tasks)
        out["handovers_running"] = self.handovers.running()  # hand-overs from peers not answered yet
        out.update(self.local.accounting())
        return out

    def available_peers(self) -> list:
        """Peer regions a request could be forwarded to now, sorted."""
        return sorted(self.router.available_peers(policy_now()))

    def state(self) -> dict:
        """The ``/v1/geolb/state`` payload (operators only): the peer table, the region layer's last
        comparison, queues, counters and the configuration (never the admin token)."""
        now = policy_now()
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
            # the peers' in-flight requests per replica that comparison priced (the in-flight term)
            "last_cost_inflight": dict(getattr(sel, "last_inflight", None) or {}),
            "last_slot_wait_s": getattr(sel, "last_slot_wait_s", None),  # the stay cost's slot wait (before q̂)
            "snapshot_nodes": router.snapshot.num_nodes,
            "snapshot_loaded_from_registry": self.peers.snapshot_loaded,
            "registry": self.peers.status(),
            "open_circuits": sorted(p for p in self.cfg.peers if self.peers.circuit_open(p)),
            "injected_faults": self.peers.latency.faults,
            "counters": self.counters,
            "router": self.local.router_report(),  # the model deployment's router here: policy, counters
            "decisions": dict(self.decisions),
            "steal": self.steal_state(),  # work stealing (steal.py); None: off
            "siblings": dict(self.siblings.counts),  # the sibling ingress replicas' inserts (siblings.py)
            "config": self.cfg.model_dump(exclude={"admin_token"}),
        }


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
