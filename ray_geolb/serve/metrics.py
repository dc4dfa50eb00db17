"""Prometheus metrics of the router and the region ingress, through ``ray.util.metrics``.

Ray exports them from every node's metrics agent (``ray start --metrics-export-port``; Ray prefixes
each name with ``ray_``), next to Ray Serve's own. Every metric is listed in :data:`METRICS` (name,
kind, tags, description) -- the README's "Observability" section and ``dashboards/geolb.json``
are written from the same list, and a test checks they agree.

The request path never calls ``ray.util.metrics`` itself: a :class:`MetricSink` counts in plain
dicts (an increment or an append, a few hundred nanoseconds) and :meth:`MetricSink.flush` hands the
sums to Ray at most every ``FLUSH_S`` -- from the router's replica updates and routed requests, and
from the ingress's once-a-second task. Outside a Ray worker (unit tests, the simulator) a sink keeps
its counts and exports nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Tuple

logger = logging.getLogger("ray_geolb.metrics")

__all__ = ["FLUSH_S", "LATENCY_BOUNDARIES_S", "METRICS", "MetricSink"]

#: most often a sink hands its counts to Ray
FLUSH_S = 1.0
#: decision-latency histogram buckets, seconds
LATENCY_BOUNDARIES_S = [2.5e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2]
#: prefix-match-ratio histogram buckets (matched characters / prompt characters)
RATIO_BOUNDARIES = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99]

#: name -> (kind, tag keys besides the sink's own, description). Router sinks carry the tags
#: ``deployment`` and ``region``; ingress sinks carry ``region``.
METRICS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    # GeoPrefixRouter (layer 2)
    "geolb_router_decision_seconds": ("histogram", ("policy",),
                                      "time inside choose_replicas per call (the policy's decision)"),
    "geolb_router_decisions_total": ("counter", ("policy", "route", "reason"),
                                     "routing outcomes: route routed (reason: the policy's) / held / fallback"),
    "geolb_router_rejections_total": ("counter", ("reason",),
                                      "requests the router refused: queue_full (429) or wait_timeout (503)"),
    "geolb_router_held": ("gauge", (), "requests held in the router's FCFS queue (selective pushing)"),
    "geolb_router_queued_tokens": ("gauge", (), "prompt tokens waiting in the router (layer 1's Q_lb)"),
    "geolb_router_inflight": ("gauge", (), "requests this router has in flight at its replicas"),
    "geolb_router_prefix_match_ratio": ("histogram", ("policy",),
                                        "matched prefix / prompt characters of each routed request"),
    "geolb_router_index_nodes": ("gauge", (), "nodes of the approximate prefix tree"),
    "geolb_router_index_evictions_total": ("counter", (), "prefix-tree entries evicted to stay in budget"),
    "geolb_router_t_p_seconds": ("gauge", (), "the learned prefill time per uncached token (cost policies)"),
    "geolb_router_available_replicas": ("gauge", (), "replicas selective pushing may send to now"),
    # RegionIngress (layer 1)
    "geolb_ingress_requests_total": ("counter", ("route", "reason"),
                                     "requests by layer-1 outcome: local / forwarded / served_for_peer / "
                                     "rejected / error (counted besides the route it was given: reason "
                                     "server_error for a 500, stream_failed for a stream that failed after "
                                     "its headers)"),
    "geolb_ingress_rejections_total": ("counter", ("reason",),
                                       "requests the ingress refused: queue_full (429), wait_timeout (503), "
                                       "bad_request (400/404/413), region_not_allowed (403), forward_failed, "
                                       "handover_lost (502), duplicate_handover (409)"),
    "geolb_forwards_total": ("counter", ("src", "dst"), "requests forwarded from region src to region dst"),
    "geolb_handovers_lost_total": ("counter", ("peer",), "forwards and steals whose peer failed after it may have "
                                                         "taken them (answered 502 handover_lost, never run again)"),
    "geolb_ingress_queue": ("gauge", (), "requests waiting at the ingress (admission queue)"),
    "geolb_steals_total": ("counter", ("event", "peer"),
                           "work stealing with a peer region: offers_sent / offers_failed / offers_received / "
                           "bad_offers, requests handed (to a thief), taken / refused (from a victim), "
                           "sent_back (taken, then answered 429: nothing ran), settled_taken / returned (a "
                           "handed request its thief took or sent back), abandoned (its client left before it "
                           "was sent)"),
    "geolb_steal_offer_bytes_total": ("counter", ("peer",), "bytes of the steal offers sent to a peer region "
                                                            "(JSON wire form)"),
    "geolb_peer_rtt_seconds": ("gauge", ("peer",), "measured round-trip time to a peer region's ingress"),
    "geolb_peer_available_replicas": ("gauge", ("peer",), "a peer region's available replicas, as last heard"),
    "geolb_peer_age_seconds": ("gauge", ("peer",), "age of the last state heard from a peer region, from when "
                                                       "the peer measured it"),
    "geolb_registry_heartbeat_age_seconds": ("gauge", (), "time since the registry last answered a heartbeat"),
}


def _make(name: str, tag_keys: Tuple[str, ...]):
    from ray.util import metrics as m

    kind, extra, desc = METRICS[name]
    keys = tuple(tag_keys) + tuple(extra)
    if kind == "counter":
        return m.Counter(name, description=desc, tag_keys=keys)
    if kind == "gauge":
        return m.Gauge(name, description=desc, tag_keys=keys)
    bounds = LATENCY_BOUNDARIES_S if name.endswith("_seconds") else RATIO_BOUNDARIES
    return m.Histogram(name, description=desc, boundaries=bounds, tag_keys=keys)


class MetricSink:
    """Counts and observations for one router or ingress, exported by :meth:`flush` (see the module
    docstring). ``tags``: this instance's own tags (``{"deployment": ..., "region": ...}``).
    ``export=False`` (or no Ray) keeps everything local."""

    def __init__(self, tags: Dict[str, str], export: bool = True):
        self.tags = {k: str(v) for k, v in tags.items()}
        self.counts: Dict[Tuple[str, Tuple[str, ...]], float] = {}
        self.totals: Dict[Tuple[str, Tuple[str, ...]], float] = {}  # every count ever (tests, state)
        self.observations: Dict[Tuple[str, Tuple[str, ...]], List[float]] = {}
        self.gauges: Dict[Tuple[str, Tuple[str, ...]], float] = {}
        self._metrics: Dict[str, object] = {}
        #: counter series to export at 0 before they first fire (:meth:`preregister`)
        self._zero: List[Tuple[str, Tuple[str, ...]]] = []
        self._export = export
        self._next_flush = 0.0
        self.flushes = 0

    # ------------------------------------------------------------ the request path (plain dicts)
    def count(self, name: str, *tags: str, n: float = 1) -> None:
        key = (name, tags)
        self.counts[key] = self.counts.get(key, 0) + n

    def preregister(self, name: str, *tags: str) -> None:
        """Export counter ``name`` with ``tags`` at 0 on the next flush, so a dashboard shows 0 rather
        than "No data" for an outcome that has not happened yet."""
        self._zero.append((name, tags))

    def observe(self, name: str, value: float, *tags: str) -> None:
        obs = self.observations.setdefault((name, tags), [])
        if len(obs) < 10_000:  # bounded between two flushes
            obs.append(value)

    def gauge(self, name: str, value: float, *tags: str) -> None:
        self.gauges[(name, tags)] = value

    # ------------------------------------------------------------ export
    def due(self, now: Optional[float] = None) -> bool:
        return (time.monotonic() if now is None else now) >= self._next_flush

    def flush(self) -> None:
        """Hand what was counted since the last flush to Ray (never raises)."""
        self._next_flush = time.monotonic() + FLUSH_S
        counts, self.counts = self.counts, {}
        obs, self.observations = self.observations, {}
        for key, n in counts.items():
            self.totals[key] = self.totals.get(key, 0) + n
        if not self._export:
            return
        try:
            zero, self._zero = self._zero, []
            for name, tags in zero:  # Counter.inc refuses 0; record the point itself (Ray 2.60's Metric._record)
                self._metric(name)._record(0.0, tags=self._tags(name, tags))
            for (name, tags), n in counts.items():
                self._metric(name).inc(n, tags=self._tags(name, tags))
            for (name, tags), values in obs.items():
                h = self._metric(name)
                t = self._tags(name, tags)
                for v in values:
                    h.observe(v, tags=t)
            for (name, tags), v in list(self.gauges.items()):
                self._metric(name).set(v, tags=self._tags(name, tags))
            self.flushes += 1
        except Exception as e:  # noqa: BLE001 - not in a Ray worker, or metrics disabled: keep counting
            self._export = False
            logger.info("metrics not exported (%r)", e)

    def _metric(self, name: str):
        m = self._metrics.get(name)
        if m is None:
            m = self._metrics[name] = _make(name, tuple(self.tags))
        return m

    def _tags(self, name: str, values: Tuple[str, ...]) -> Dict[str, str]:
        out = dict(self.tags)
        out.update(zip(METRICS[name][1], (str(v) for v in values)))
        return out

    def total(self, name: str, *tags: str) -> float:
        """Everything counted for ``name`` (and ``tags``, a prefix of its tag values), flushed or not."""
        out = 0.0
        for src in (self.totals, self.counts):
            for (n, t), v in src.items():
                if n == name and t[:len(tags)] == tags:
                    out += v
        return out
