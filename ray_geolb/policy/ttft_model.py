"""Online TTFT model (GORGO §3.4, Table 1) and per-target work accounting for cost-based policies.

**TTFT regression.** GORGO converts prefix overlap into time with a per-token prefill rate ``t_p``
measured offline (Table 1: ``TTFT = 150.72 ms + 0.0938 ms/token × input tokens``, R² high). Here
``t_p`` and the base latency are learned *online*: every completed request contributes a sample
``(x = uncached prompt tokens estimated at dispatch, y = observed TTFT)`` to a bounded window per key
(a replica or a region) and to a pooled window. The line is fitted by **Theil–Sen** (slope = median
of pairwise slopes, intercept = median of ``y - slope·x``): breakdown point ≈ 29 %, so queueing
spikes and stragglers in the window do not drag the fit. Until a key has ``min_samples`` samples
with enough spread in ``x``, the pooled fit is used, and until the pool has them, the prior (GORGO
Table 1). The slope is clamped to ``[0, max_tp_s]`` and the intercept to ``>= 0``. With
``online=False`` the prior line is used as is: GORGO's own setting (a constant measured offline).

Observed TTFTs also contain queueing; that is what the robust fit is for, and why the window is
bounded (rates change with batch composition, GORGO §6).

**Work accounting.** :class:`WorkTracker` keeps, per target, the requests this router dispatched
and has not seen complete — dispatch time, prompt tokens, estimated uncached tokens and expected
output tokens — so a policy can tell which work a replica's last stats report had not yet seen
("unseen" = dispatched after the report's timestamp).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Hashable, Iterator, List, Optional, Tuple

import numpy as np
from pydantic import Field

from .config import _Strict

__all__ = ["TtftModelConfig", "TtftModel", "theil_sen", "WorkTracker", "WorkItem", "POOLED"]

POOLED = "__pooled__"


class TtftModelConfig(_Strict):
    """Online ``TTFT = base + t_p × uncached tokens`` regression (seconds, tokens)."""

    prior_base_s: float = Field(0.15072, ge=0.0, description="prior base latency (GORGO Table 1: 150.72 ms)")
    prior_tp_s: float = Field(0.0938e-3, gt=0.0,
                              description="prior prefill seconds per token (GORGO Table 1: 0.0938 ms)")
    window: int = Field(64, ge=4, le=4096, description="samples kept per key (bounded: Theil-Sen is O(window^2))")
    min_samples: int = Field(8, ge=3, description="samples a key needs before its own fit replaces the fallback")
    min_spread_tokens: int = Field(64, ge=1,
                                   description="max-min of x a fit needs (a slope needs distinct prompt lengths)")
    max_tp_s: float = Field(0.05, gt=0.0, description="upper clamp on a fitted t_p")
    max_pairs: int = Field(4096, ge=16, description="pairwise slopes evaluated per fit (evenly strided beyond this)")
    refit_every: int = Field(4, ge=1, description="refit a key after this many new samples (a fit is O(window^2))")
    online: bool = Field(True, description="learn the line from observed TTFTs; False: always the prior line "
                                           "(GORGO §4.2: t_p measured offline and kept constant)")


_TRIU: Dict[int, Tuple["np.ndarray", "np.ndarray"]] = {}


def theil_sen(xs: List[float], ys: List[float], max_pairs: int = 4096) -> Optional[Tuple[float, float]]:
    """(intercept, slope) of the Theil–Sen line, or None if no two samples differ in x.

    Vectorised over all pairs (evenly strided beyond ``max_pairs``), so a refit on the routing path
    stays cheap."""
    n = len(xs)
    if n < 2:
        return None
    idx = _TRIU.get(n)
    if idx is None:
        idx = _TRIU[n] = np.triu_indices(n, 1)
    i, j = idx
    stride = max(1, len(i) // max_pairs)
    if stride > 1:
        i, j = i[::stride], j[::stride]
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        return None
    slope = float(np.median((y[j] - y[i])[ok] / dx[ok]))
    intercept = float(np.median(y - slope * x))
    return intercept, slope


class _Window:
    __slots__ = ("xs", "ys", "fit", "dirty", "fitted")

    def __init__(self, n: int):
        self.xs: Deque[float] = deque(maxlen=n)
        self.ys: Deque[float] = deque(maxlen=n)
        self.fit: Optional[Tuple[float, float]] = None
        self.dirty = 0  # samples added since the last fit
        self.fitted = False  # a fit was attempted with enough samples


class TtftModel:
    """Per-key (replica or region) online TTFT lines with pooled and prior fallbacks."""

    def __init__(self, config: Optional[TtftModelConfig] = None):
        if isinstance(config, dict):
            config = TtftModelConfig.model_validate(config)
        self.config = config or TtftModelConfig()
        self._w: Dict[Hashable, _Window] = {}

    def observe(self, key: Hashable, uncached_tokens: float, ttft_s: float) -> bool:
        """Add a sample; False (ignored) if it is not a finite non-negative pair, or the model is not online."""
        if not self.config.online:
            return False
        try:
            x, y = float(uncached_tokens), float(ttft_s)
        except (TypeError, ValueError):
            return False
        if not (x >= 0.0 and y >= 0.0) or x == float("inf") or y == float("inf"):
            return False
        for k in (key, POOLED):
            w = self._w.get(k)
            if w is None:
                w = self._w[k] = _Window(self.config.window)
            w.xs.append(x)
            w.ys.append(y)
            w.dirty += 1
        return True

    def forget(self, key: Hashable) -> None:
        if key != POOLED:
            self._w.pop(key, None)

    def samples(self, key: Hashable = POOLED) -> int:
        w = self._w.get(key)
        return len(w.xs) if w is not None else 0

    def _fit(self, key: Hashable) -> Optional[Tuple[float, float]]:
        w = self._w.get(key)
        if w is None:
            return None
        cfg = self.config
        if w.dirty and (w.dirty >= cfg.refit_every or not w.fitted or w.fit is None):
            w.dirty = 0
            w.fit = None
            if len(w.xs) >= cfg.min_samples and max(w.xs) - min(w.xs) >= cfg.min_spread_tokens:
                f = theil_sen(list(w.xs), list(w.ys), cfg.max_pairs)
                if f is not None:
                    b, s = f
                    s = min(max(s, 0.0), cfg.max_tp_s)
                    # re-centre the intercept on the clamped slope
                    b = float(np.median(np.asarray(w.ys) - s * np.asarray(w.xs))) if s != f[1] else b
                    w.fit = (max(0.0, b), s)
                    w.fitted = True
        return w.fit

    def line(self, key: Hashable = POOLED) -> Tuple[float, float, str]:
        """(base_s, t_p_s, source) where source is 'key', 'pooled' or 'prior'."""
        if not self.config.online:
            return self.config.prior_base_s, self.config.prior_tp_s, "prior"
        f = self._fit(key) if key != POOLED else None
        if f is not None:
            return f[0], f[1], "key"
        f = self._fit(POOLED)
        if f is not None:
            return f[0], f[1], "pooled"
        return self.config.prior_base_s, self.config.prior_tp_s, "prior"

    def t_p(self, key: Hashable = POOLED) -> float:
        return self.line(key)[1]

    def base(self, key: Hashable = POOLED) -> float:
        return self.line(key)[0]

    def predict(self, key: Hashable, uncached_tokens: float) -> float:
        b, s, _ = self.line(key)
        return b + s * max(0.0, uncached_tokens)


@dataclass(slots=True)
class WorkItem:
    request_id: Hashable
    target: Hashable
    t: float
    prompt_tokens: int
    uncached_tokens: float
    output_tokens: int


class WorkTracker:
    """Requests this router dispatched and has not seen complete, per target."""

    def __init__(self):
        self._by_target: Dict[Hashable, Dict[Hashable, WorkItem]] = {}
        self._req: Dict[Hashable, WorkItem] = {}
        self._uncached_memo: Dict[Hashable, Tuple[Optional[float], float]] = {}  # target -> (since, sum)

    def add(self, item: WorkItem) -> None:
        if item.request_id in self._req:
            return
        self._req[item.request_id] = item
        self._by_target.setdefault(item.target, {})[item.request_id] = item
        self._uncached_memo.pop(item.target, None)

    def pop(self, request_id: Hashable) -> Optional[WorkItem]:
        item = self._req.pop(request_id, None)
        if item is not None:
            d = self._by_target.get(item.target)
            if d is not None:
                d.pop(request_id, None)
            self._uncached_memo.pop(item.target, None)
        return item

    def remove_target(self, target: Hashable) -> None:
        for rid in self._by_target.pop(target, {}):
            self._req.pop(rid, None)
        self._uncached_memo.pop(target, None)

    def unseen_uncached(self, target: Hashable, since: Optional[float]) -> float:
        """``unseen(target, since)[2]`` (the same sum, in the same order), memoised per target until
        that target's work or ``since`` (its latest report's timestamp) changes: a decision prices
        every replica, but between two decisions only the one or two that dispatched or completed
        a request changed."""
        m = self._uncached_memo.get(target)
        if m is not None and m[0] == since:
            return m[1]
        u = 0.0
        for it in self._by_target.get(target, {}).values():
            if since is None or it.t > since:
                u += it.uncached_tokens
        self._uncached_memo[target] = (since, u)
        return u

    def items(self, target: Hashable) -> Iterator[WorkItem]:
        return iter(self._by_target.get(target, {}).values())

    def count(self, target: Hashable) -> int:
        return len(self._by_target.get(target, ()))

    def unseen(self, target: Hashable, since: Optional[float]) -> Tuple[int, int, float]:
        """(count, prompt tokens, uncached tokens) of requests dispatched after ``since`` (all if None)."""
        n, p, u = 0, 0, 0.0
        for it in self._by_target.get(target, {}).values():
            if since is None or it.t > since:
                n += 1
                p += it.prompt_tokens
                u += it.uncached_tokens
        return n, p, u
