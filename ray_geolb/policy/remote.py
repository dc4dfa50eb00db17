"""Pluggable peer-region selectors for :class:`~ray_geolb.policy.two_layer.RegionRouter`.

``TwoLayerConfig.remote`` = ``"prefix"`` / ``"ring"`` / ``"nearest"`` are SkyLB's choices (in
``two_layer.py``); ``"cost"`` delegates to :class:`CostSelector` here, configured by
``TwoLayerConfig.cost`` (:class:`CostSelectorConfig`). The selector runs only when the local layer
found no available replica (selective pushing) and compares, per request, an estimated TTFT of

* **staying** (holding the request in this LB's queue) —
  ``w_prefill·t_p·(L − L_hit_local) + q̂·t_p·(Q_lb + Σ_r Q_r) / n_replicas`` with ``Q_lb`` the tokens
  queued at this LB (``RegionRouter.set_queue`` / ``heartbeat(queued_tokens=)``) and ``Q_r`` each
  local replica's queued tokens (reported waiting + dispatches the report has not seen);
* **forwarding** to each available peer ``p`` (fresh heartbeat, ≥ 1 available replica, LB queue ≤ τ) —
  ``w_rtt·RTT(p) + w_prefill·t_p(p)·(L − L_hit(p)) [+ q̂·W(p)]``.

``L_hit`` is the regional snapshot's match (what this LB already forwarded there) in tokens at
``chars_per_token``; ``RTT(p)`` is an EWMA of real probe samples (:meth:`CostSelector.observe_rtt`),
else the heartbeat's RTT, else ``unknown_rtt_s``; ``t_p(p)`` is the t_p the peer advertises in its
heartbeat (``extra["t_p_s"]``), else this region's online estimate. The lowest cost wins; if staying
is cheapest the request is held (GORGO: "the request can optionally stay in the local region
depending on the queue-size estimate").

The remote queue ``W(p)`` is what distinguishes the two presets:

* ``GORGO_COST`` (``remote_queue=False``): GORGO's code leaves the peer's queue out;
* ``GEOPREFIX_COST`` (the default, ``remote_queue=True``):
  ``W(p) = t_p(p) · (Q_p + Q_fwd) · (1 + age/staleness_scale_s) / R_p`` — ``Q_p`` the tokens queued at
  the peer's LB (``extra["queued_tokens"]``, else ``queue_len ×`` mean prompt), ``Q_fwd`` the prompt
  tokens this LB forwarded there *after* the heartbeat beyond the first ``available_replicas`` of
  them (those went to the replicas the heartbeat reported free), ``R_p`` its replica count
  (``extra["replicas"]``, else ``available_replicas``), and the factor inflates an old report (a
  queue seen ``age`` seconds ago has had time to grow). Matches are discounted by their own age
  (``0.5 ** (age/match_half_life_s)``) and ignored below ``min_match_chars``.

``GEOPREFIX_COST`` also sets ``w_shared = 1``, the region-level twin of GeoPrefix's local term: a
residual prefill slows every request in flight on the replica that runs it, so each option adds
``w_shared · t_p · (L − L_hit) · n`` with ``n`` the requests in flight per replica there (the
peer's heartbeat ``extra["inflight"]`` plus forwards sent since, over its replicas; for staying,
this region's own count). A peer that reports no waiting queue but runs a large batch — what SP-P
availability cannot see — then costs what it costs. Measured on network-hard (seeds 0-3):
GeoPrefix/SkyLB throughput 0.99 -> 1.03, prefix hit 20.9 % -> 26.7 %, P99 TTFT 5.49 -> 5.16 s.

**Wait for a local slot** (``stay_slot_wait``): the selector runs only when no local replica is
available, i.e. every local engine is at its admission limit (SP-P), so a held request cannot start
before a running one finishes. The prefill-work terms above do not see that: with the replicas'
waiting queues empty (SP-P holds requests at the LB, not in the engine) the head of the queue looks
almost free to keep, although in a decode-bound engine it waits a whole request's decode time for a
slot. Measured in Ray Serve (3 regions, 2 slots per replica, 40-token decodes of ~0.35 s, RTT
10-17 ms): stay was priced at 25-40 ms against 33-47 ms for a forward, so a burst was held (and
refused with 429 past the ingress's ``max_queue``) while both peers were idle. With
``stay_slot_wait`` the cost of staying, when no local replica is available, adds

    q̂ · (ahead + 1) / drain_rate

with ``drain_rate`` the measured rate at which this LB's local requests finish (:class:`DrainRate`:
completions per second over ``drain_window_s``, fed by :meth:`RegionRouter.on_local_complete
<ray_geolb.policy.two_layer.RegionRouter.on_local_complete>`; while saturated, the rate at which
slots free) and ``ahead`` the requests waiting before this one at this LB (``RegionRouter.set_queue``'s
``queue_len``). While the rate is unknown (fewer than ``drain_min_samples`` completions in the
window) there is no term. ``GEOPREFIX_COST`` sets it; ``GORGO_COST`` does not (GORGO has no such
term). The simulator and the Serve ingress both feed the same hook. Measured in the simulator
(``benchmarks/compare_policies.py``): every table unchanged except network-hard, where it costs a
little (seeds 0-7: P99 TTFT 5.47 -> 5.82 s, GeoPrefix/SkyLB throughput 1.036 -> 1.031, still 1.71x /
1.45x below SkyLB's / GORGO's P99); kept for the Serve failure above and so that both run one code.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Deque, Dict, Hashable, List, Optional, Tuple

from pydantic import Field

from .config import _Strict
from .matching import discounted_hits, match_age  # noqa: F401  (match_age: moved, kept importable here until region/)
from .ttft_model import TtftModel, TtftModelConfig

__all__ = ["CostSelectorConfig", "CostSelector", "DrainRate", "RttTable", "match_age", "GORGO_COST", "GEOPREFIX_COST"]


class CostSelectorConfig(_Strict):
    remote_queue: bool = Field(True, description="count the peer's queue (GeoPrefix); False = GORGO")
    w_rtt: float = Field(1.0, ge=0.0)
    w_prefill: float = Field(1.0, ge=0.0)
    q_hat: float = Field(1.0, ge=0.0, description="weight of queue-wait terms (GORGO's q̂)")
    chars_per_token: float = Field(4.0, gt=0.0)
    min_match_chars: int = Field(0, ge=0, description="snapshot/local matches shorter than this are ignored")
    match_half_life_s: Optional[float] = Field(None, gt=0.0, description="discount a match by its age (None: off)")
    staleness_scale_s: Optional[float] = Field(None, gt=0.0, description="inflate a peer queue by (1 + age/scale) (None: off)")
    rtt_alpha: float = Field(0.3, gt=0.0, le=1.0, description="EWMA weight of a new RTT probe sample")
    unknown_rtt_s: float = Field(0.25, ge=0.0, description="RTT assumed for a peer never measured")
    stay_local: bool = Field(True, description="hold locally when staying is estimated cheaper than any forward")
    w_shared: float = Field(0.0, ge=0.0, description="price the residual prefill's slowdown of the requests in "
                                                     "flight per replica there (peer: heartbeat 'inflight'); 0 = off")
    stay_slot_wait: bool = Field(False, description="add q̂·(ahead+1)/drain_rate to staying when no local replica "
                                                    "is available (the wait for a local engine slot)")
    drain_window_s: float = Field(10.0, gt=0.0, allow_inf_nan=False,
                                  description="window of the local drain-rate estimate (stay_slot_wait)")
    drain_min_samples: int = Field(4, ge=2, description="completions in the window the drain rate needs (else unknown)")
    ttft: TtftModelConfig = TtftModelConfig()


GORGO_COST = {"remote_queue": False}
GEOPREFIX_COST = {"remote_queue": True, "min_match_chars": 256, "match_half_life_s": 600.0, "staleness_scale_s": 2.0,
                  "w_shared": 1.0, "stay_slot_wait": True}


class RttTable:
    """EWMA of measured RTTs per region."""

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self._v: Dict[str, float] = {}

    def observe(self, region: str, seconds: float) -> float:
        s = float(seconds)
        if not (s >= 0.0 and math.isfinite(s)):
            raise ValueError(f"RTT sample for {region!r} must be a finite number >= 0, got {seconds!r}")
        old = self._v.get(region)
        v = s if old is None else old + self.alpha * (s - old)
        self._v[region] = v
        return v

    def get(self, region: str) -> Optional[float]:
        return self._v.get(region)

    def forget(self, region: str) -> None:
        self._v.pop(region, None)


class DrainRate:
    """Local completions per second over a sliding window of ``window_s`` seconds.

    ``observe(now)`` per completion, ``rate(now)`` per query: both trim the timestamps older than the
    window from the left (amortised O(1)); at most ``max_samples`` are kept (past that the oldest go,
    and the rate is taken over the span of those kept, so it stays right). ``rate`` is
    ``n / (now - oldest)`` over the ``n`` completions in the window, None while ``n < min_samples``.
    Timestamps are kept non-decreasing (a sample older than the newest counts as the newest).
    """

    __slots__ = ("window_s", "min_samples", "_t")

    def __init__(self, window_s: float = 10.0, min_samples: int = 4, max_samples: int = 4096):
        window_s = float(window_s)
        if not (window_s > 0.0 and math.isfinite(window_s)):
            raise ValueError(f"drain_window_s must be a finite number > 0, got {window_s!r}")
        if int(min_samples) != min_samples or min_samples < 2:
            raise ValueError(f"drain_min_samples must be an integer >= 2, got {min_samples!r}")
        if int(max_samples) != max_samples or max_samples < min_samples:
            raise ValueError(f"max_samples must be an integer >= drain_min_samples, got {max_samples!r}")
        self.window_s = window_s
        self.min_samples = int(min_samples)
        self._t: Deque[float] = deque(maxlen=int(max_samples))

    def _trim(self, now: float) -> None:
        t = self._t
        lo = now - self.window_s
        while t and t[0] < lo:
            t.popleft()

    def observe(self, now: float) -> None:
        now = float(now)
        if not math.isfinite(now):
            raise ValueError(f"completion time must be finite, got {now!r}")
        t = self._t
        if t and now < t[-1]:
            now = t[-1]
        t.append(now)
        self._trim(now)

    def rate(self, now: float) -> Optional[float]:
        self._trim(now)
        t = self._t
        if len(t) < self.min_samples:
            return None
        return len(t) / max(now - t[0], 1e-3)

    def __len__(self) -> int:
        return len(self._t)


class CostSelector:
    """TTFT-cost choice among staying and the available peers (see the module docstring)."""

    def __init__(self, config: Optional[CostSelectorConfig] = None):
        if isinstance(config, dict):
            config = CostSelectorConfig.model_validate(config)
        self.config = config or CostSelectorConfig()
        self.rtt = RttTable(self.config.rtt_alpha)
        self.ttft = TtftModel(self.config.ttft)  # used when the local policy has no TTFT model
        self._fwd: Dict[str, Deque[Tuple[float, int]]] = {}
        self.drain = DrainRate(self.config.drain_window_s, self.config.drain_min_samples)
        self.last_costs: Dict[Optional[str], float] = {}
        self.last_rtts: Dict[str, float] = {}  # the RTTs the last peer comparison used
        self.last_slot_wait_s = 0.0  # the slot-wait term (before q̂) of the last stay cost

    # ------------------------------------------------------------ inputs
    def observe_rtt(self, region: str, seconds: float) -> float:
        return self.rtt.observe(region, seconds)

    def on_forward(self, req, region: str, now: float) -> None:
        q = self._fwd.get(region)
        if q is None:
            q = self._fwd[region] = deque(maxlen=4096)
        q.append((now, req.prompt_tokens))

    def on_local_complete(self, now: float) -> None:
        """A request this LB dispatched to a local replica left it (the drain-rate estimate)."""
        self.drain.observe(now)

    def forget(self, region: str) -> None:
        self._fwd.pop(region, None)
        self.rtt.forget(region)

    # ------------------------------------------------------------ estimates
    def _model(self, router) -> TtftModel:
        m = getattr(router.local, "ttft", None)
        return m if isinstance(m, TtftModel) else self.ttft

    def local_t_p(self, router) -> float:
        f = getattr(router.local, "pooled_t_p", None)  # the local policy's pooled t_p, its floor applied
        return float(f()) if callable(f) else self._model(router).t_p()

    def _mean_prompt(self, router, req) -> float:
        m = getattr(router.local, "mean_prompt_tokens", None)
        return float(m) if m else float(req.prompt_tokens)

    def rtt_of(self, router, region: str) -> float:
        v = self.rtt.get(region)
        if v is None:
            p = router.peers.get(region)
            v = p.rtt_s if p is not None and p.rtt_s is not None else self.config.unknown_rtt_s
        return v

    def peer_t_p(self, router, region: str) -> float:
        p = router.peers.get(region)
        v = p.extra.get("t_p_s") if p is not None and p.extra else None
        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            return float(v)
        return self.local_t_p(router)

    def local_queue_tokens(self, router, req) -> float:
        local = router.local
        mean = self._mean_prompt(router, req)
        q = router.queued_tokens if router.queued_tokens is not None else router.queue_len * mean
        qt = getattr(local, "queued_tokens", None)
        for t in local.targets:
            if qt is not None:
                q += qt(t)
            else:
                s = local.tracker.stats(t)
                q += (s.num_waiting if s is not None else 0) * mean + local.tracker.unseen(t) * mean
        return q

    def local_cost(self, router, req, now: float, shared: bool = True) -> Optional[float]:
        """Estimated TTFT of holding the request here; None if staying is not an option. ``shared=False``
        leaves the in-flight term out (when the peers' heartbeats carry no in-flight count, so that
        both sides of the comparison are priced alike)."""
        cfg = self.config
        allowed = req.allowed_regions
        if allowed is not None and router.region not in allowed:
            return None
        local = router.local
        n = len(local.targets)
        if n == 0:
            return None
        tp = self.local_t_p(router)
        hit = 0.0
        index = getattr(local, "index", None)
        if index is not None:
            p = local.prepared(req) if hasattr(local, "prepared") else index.prepare(req.text)
            hits = discounted_hits(index.match(p, local.targets), req.prompt_tokens, cfg.chars_per_token,
                                   cfg.min_match_chars, cfg.match_half_life_s, index, p, now)
            hit = max(hits.values(), default=0.0)
        wait = tp * self.local_queue_tokens(router, req) / n
        residual = tp * max(0.0, req.prompt_tokens - hit)
        c = cfg.w_prefill * residual + cfg.q_hat * wait
        if cfg.w_shared and shared:
            c += cfg.w_shared * residual * self._inflight(router) / n
        w = self.slot_wait_s(router, now) if cfg.stay_slot_wait and not local.tracker.available else 0.0
        self.last_slot_wait_s = w
        return c + cfg.q_hat * w if w else c

    def slot_wait_s(self, router, now: float) -> float:
        """Expected wait for a local engine slot of a request with ``router.queue_len`` requests ahead of
        it at this LB: ``(ahead + 1) / drain_rate`` (0 while the rate is unknown)."""
        rate = self.drain.rate(now)
        return (max(0, router.queue_len) + 1) / rate if rate else 0.0

    @staticmethod
    def _inflight(router) -> int:
        out = router.local.tracker.outstanding
        return sum(out(t) for t in router.local.targets)

    def remote_wait(self, router, req, region: str, now: float) -> float:
        cfg = self.config
        p = router.peers[region]
        tp = self.peer_t_p(router, region)
        ex = p.extra or {}
        qtok = ex.get("queued_tokens")
        q = float(qtok) if isinstance(qtok, (int, float)) and qtok >= 0 else p.queue_len * self._mean_prompt(router, req)
        sent = [tok for (t, tok) in self._fwd.get(region, ()) if t > p.timestamp]
        q += sum(sent[max(0, p.available_replicas):])
        reps = ex.get("replicas")
        r = reps if isinstance(reps, int) and reps > 0 else max(1, p.available_replicas)
        stale = 1.0
        if cfg.staleness_scale_s is not None:
            stale += max(0.0, now - p.timestamp) / cfg.staleness_scale_s
        return tp * q * stale / r

    def peer_inflight(self, router, region: str) -> float:
        """Requests in flight per replica at ``region``: its heartbeat's count plus what this LB forwarded
        there since, over its replica count (0 if the heartbeat carries no count)."""
        p = router.peers[region]
        ex = p.extra or {}
        n = ex.get("inflight")
        if not isinstance(n, (int, float)) or n < 0:
            return 0.0
        n = float(n) + sum(1 for (t, _) in self._fwd.get(region, ()) if t > p.timestamp)
        reps = ex.get("replicas")
        return n / (reps if isinstance(reps, int) and reps > 0 else max(1, p.available_replicas))

    def peer_costs(self, router, req, peers: List[str], now: float):
        cfg = self.config
        snap = router.snapshot
        prep = router._prepared(req)
        raw = snap.match(prep, peers)
        hits = discounted_hits(raw, req.prompt_tokens, cfg.chars_per_token, cfg.min_match_chars,
                               cfg.match_half_life_s, snap, prep, now)
        costs = {}
        rtts = self.last_rtts = {}
        for r in peers:
            tp = self.peer_t_p(router, r)
            residual = tp * max(0.0, req.prompt_tokens - hits.get(r, 0.0))
            rtt = rtts[r] = self.rtt_of(router, r)
            c = cfg.w_rtt * rtt + cfg.w_prefill * residual
            if cfg.remote_queue:
                c += cfg.q_hat * self.remote_wait(router, req, r, now)
            if cfg.w_shared:
                c += cfg.w_shared * residual * self.peer_inflight(router, r)
            costs[r] = c
        return costs, raw, hits

    # ------------------------------------------------------------ decision
    def select(self, router, req, peers: List[str], now: float):
        """(region, matched chars, reason), or (None, 0, reason) to hold the request here."""
        costs, raw, hits = self.peer_costs(router, req, peers, now)
        best = min(costs, key=lambda r: (costs[r], self.rtt_of(router, r), r))
        shared = all(isinstance((router.peers[r].extra or {}).get("inflight"), (int, float)) for r in peers)
        stay = self.local_cost(router, req, now, shared) if self.config.stay_local else None
        self.last_costs = dict(costs)
        self.last_costs[None] = stay if stay is not None else math.inf
        if stay is not None and stay <= costs[best]:
            return None, 0, "stay_cheaper"
        return best, raw.get(best, 0) if best in hits else 0, "cost"

    def heartbeat_extra(self, router, queued_tokens: Optional[float]) -> dict:
        ex = {"replicas": len(router.local.targets), "t_p_s": self.local_t_p(router), "inflight": self._inflight(router)}
        if queued_tokens is not None:
            ex["queued_tokens"] = float(queued_tokens)
        return ex
