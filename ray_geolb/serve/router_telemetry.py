"""What GeoPrefixRouter tells the operator: its Prometheus metrics (``serve/metrics.py``: counted on the
routing path, exported at most once a second from the live state) and its rate-limited warnings. No
routing decision depends on anything here, and nothing here may fail routing: ``_safe`` runs a step,
counts and logs what it raised, and returns.

A mixin of :class:`~ray_geolb.serve.router.GeoPrefixRouter`; it reads ``policy``, ``book``,
``replicas``, ``counters``, ``deployment_key``, ``load_signal_grace_s`` and ``queued_tokens()``.
"""

from __future__ import annotations

import logging
import time

from ray_geolb.serve.metrics import MetricSink

__all__ = ["RouterTelemetry"]

logger = logging.getLogger("ray.serve")

#: at most one warning per this many seconds per router (the rest are counted, then summarised)
ERROR_LOG_INTERVAL_S = 10.0


class RouterTelemetry:
    """See the module docstring."""

    def _init_telemetry(self, deployment: str, region: str) -> None:
        #: Prometheus metrics (serve/metrics.py): counted here, exported at most once a second
        self.metrics = MetricSink({"deployment": deployment, "region": region})
        self._evictions_seen = 0
        self._last_err_log = 0.0
        self._suppressed_errs = 0
        self._next_load_check = 0.0

    def _count_decision(self, route: str, reason: str) -> None:
        self.metrics.count("geolb_router_decisions_total", self.policy_name, route, reason)

    def _flush_metrics(self) -> None:
        """Set the gauges from the live state and export what was counted (serve/metrics.py)."""
        try:
            m, pol = self.metrics, self.policy
            m.gauge("geolb_router_held", len(self.book.held))
            m.gauge("geolb_router_queued_tokens", float(self.queued_tokens()))
            m.gauge("geolb_router_inflight", len(self.book.inflight))
            m.gauge("geolb_router_available_replicas", len(pol.tracker.available))
            index = getattr(pol, "index", None)
            if index is not None:
                m.gauge("geolb_router_index_nodes", index.num_nodes)
                ev = int(getattr(index, "evictions", 0))
                if ev > self._evictions_seen:
                    m.count("geolb_router_index_evictions_total", n=ev - self._evictions_seen)
                    self._evictions_seen = ev
            t_p = getattr(pol, "pooled_t_p", None)
            if callable(t_p):
                m.gauge("geolb_router_t_p_seconds", float(t_p()))
            m.flush()
        except Exception as e:  # noqa: BLE001 - metrics never fail routing
            self._log_error(f"metrics flush failed: {e!r}")

    def _check_load_signal(self, now: float) -> None:
        """Warn (once a second at most) about replicas that sent no load field in ``load_signal_grace_s``."""
        if now < self._next_load_check:
            return
        self._next_load_check = now + 1.0
        blind = self.replicas.find_blind(now, self.load_signal_grace_s)
        if blind:
            logger.warning(
                f"GeoPrefixRouter[{self.deployment_key[1]}]: replica(s) {sorted(blind)} sent no report with a load "
                f"field (num_waiting / num_running) in {self.load_signal_grace_s:g} s: selective pushing runs blind "
                "(every replica looks empty). A stock LLMServer reports no load; deploy vLLM with "
                "server_cls=ray_geolb.serve.stats_plugin.GeoVLLMServer (and request_routing_stats_period_s set).")

    def _safe(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"{getattr(fn, '__name__', fn)} failed: {e!r}")

    def _log_error(self, msg: str) -> None:
        now = time.monotonic()
        if now - self._last_err_log >= ERROR_LOG_INTERVAL_S:
            extra = f" ({self._suppressed_errs} similar messages suppressed)" if self._suppressed_errs else ""
            logger.warning(f"GeoPrefixRouter[{self.deployment_key[1]}]: {msg}{extra}")
            self._last_err_log = now
            self._suppressed_errs = 0
        else:
            self._suppressed_errs += 1
