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
bounded (rates change with batch composition, GORGO §6). Under heavy queueing that is not enough:
the fitted slope then measures queueing (4-8x the prefill slope on the engine model), and even the
per-request prefill interval (vLLM's first SCHEDULED -> first token) does not identify it, because a
budget-filled step takes as long whatever the request's own share. With ``source='engine_steps'`` the
slope is fitted instead on the engines' own work between two reports (``observe_work``: busy time over
steps, prefill tokens and decode tokens, by least squares; reports carry the cumulative counters as
``engine_work``): prefill time, not TTFT.

**Prefill attention** (``TtftModel(fit_pairs=True)``, GeoPrefix with ``price_cached_context``). A prefill
chunk of ``P`` new tokens after ``c`` cached or computed ones attends to ``P·(c + P/2)`` (new, attended)
token pairs, so ``R`` uncached tokens after a prefix hit of ``c`` cost ``t_p·R + q·R·(c + R/2)``: more
than ``R`` tokens from zero, and a long cached context saves more than ``t_p`` per cached token. When the
reports carry ``prefill_pairs`` (the cumulative sum of ``P·(c + P/2)`` over prefill chunks) the work fit
gains that column -- ``busy_s = a·steps + t_p·prefill + t_d·decode + q·prefill_pairs``, ``q >= 0`` -- and
learns the per-pair coefficient ``q`` online, with no profile constant (:func:`work_fit_pairs`). Without
the column (older replicas), or when it is degenerate (every prompt alike: pairs ∝ prefill tokens), the
3-term fit stands and ``q = 0``: the linear price.

**Work accounting.** :class:`WorkTracker` keeps, per target, the requests this router dispatched
and has not seen complete — dispatch time, prompt tokens, estimated uncached tokens and expected
output tokens — so a policy can tell which work a replica's last stats report had not yet seen
("unseen" = dispatched after the report's timestamp).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Hashable, Iterator, List, Literal, Optional, Tuple

import numpy as np
from pydantic import Field

from .config import _Strict

__all__ = ["TtftModelConfig", "TtftModel", "theil_sen", "work_fit", "work_fit_pairs", "WorkTracker", "WorkItem",
           "POOLED", "prefill_pairs"]

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
    source: Literal["ttft", "engine_steps"] = Field(
        "ttft", description="what the online t_p is fitted on: 'ttft' = (uncached tokens, TTFT) samples (queueing "
                            "included); 'engine_steps' = the engines' busy time over their steps, prefill and "
                            "decode tokens between two reports (observe_work): prefill time, not TTFT")
    pair_min_t: float = Field(
        3.0, ge=0.0, description="with the prefill-attention fit (TtftModel(fit_pairs=True)): the t-statistic the "
                                 "per-pair coefficient q needs in the 4-term work fit; below it q = 0 and the "
                                 "3-term fit stands (short prompts: attention is noise in the busy time)")


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


def work_fit(rows: List[Tuple[float, float, float, float]]) -> Optional[Tuple[float, float, float]]:
    """Least squares ``busy_s = a·steps + t_p·prefill_tokens + t_d·decode_tokens`` over ``rows`` of
    ``(steps, prefill, decode, busy_s)``: ``(a, t_p, t_d)``, or None without three independent columns.
    The engine's step time is linear in exactly these (``engine/profiles.py``: base + per prefill token +
    per decode + attention, the attention of a prefill chunk growing with its own tokens), so the prefill
    coefficient is the per-token prefill time whatever queue stood in front of the requests."""
    if len(rows) < 3:
        return None
    a = np.asarray(rows, dtype=float)
    x, y = a[:, :3], a[:, 3]
    scale = x.max(axis=0)
    if (scale <= 0).any():
        return None
    coef, _res, rank, _sv = np.linalg.lstsq(x / scale, y, rcond=None)
    if rank < 3:
        return None
    coef = coef / scale
    return float(coef[0]), float(coef[1]), float(coef[2])


def prefill_pairs(uncached: float, cached: float) -> float:
    """Prefill-attention pairs of ``uncached`` new tokens after ``cached`` ones: ``R·(c + R/2)`` (the sum of
    ``P·(c + P/2)`` over the chunks of one prompt, however it is chunked)."""
    return uncached * (cached + 0.5 * uncached) if uncached > 0.0 else 0.0


#: a column counts as independent when its scaled design keeps at least this relative singular value
_PAIRS_RCOND = 1e-6


def work_fit_pairs(rows: List[Tuple[float, float, float, float, float]],
                   min_t: float = 3.0) -> Optional[Tuple[float, float, float, float]]:
    """Least squares ``busy_s = a·steps + t_p·prefill_tokens + t_d·decode_tokens + q·prefill_pairs`` with
    ``q >= 0`` over ``rows`` of ``(steps, prefill, decode, busy_s, prefill_pairs)``: ``(a, t_p, t_d, q)``.

    The 4-term fit when the pairs column is present (non-zero somewhere), independent of the others, gives
    ``q >= 0`` and ``t_p > 0``, and identifies ``q``: its t-statistic (``q`` over its standard error from the
    residuals) at least ``min_t``. Otherwise the 3-term :func:`work_fit` with ``q = 0`` (with one bounded
    coefficient, a negative unconstrained ``q`` puts the constrained optimum on ``q = 0``: the 3-term fit).
    The t-test matters on short prompts: attention is then ~1-3 % of the busy time, and what the columns
    leave out (each decode's context read, the per-chunk launches) moves ``q`` by several times its value
    (the simulator's ToT workload on the H100 profile: 8x, t = 2.4); with long contexts t is 12-120.
    None when neither fits."""
    n = len(rows)
    if n >= 5:
        a = np.asarray(rows, dtype=float)
        x = a[:, (0, 1, 2, 4)]
        y = a[:, 3]
        scale = x.max(axis=0)
        if (scale > 0).all():
            xs = x / scale
            cs, _res, rank, _sv = np.linalg.lstsq(xs, y, rcond=_PAIRS_RCOND)
            if rank == 4:
                coef = cs / scale
                if coef[3] >= 0.0 and coef[1] > 0.0:
                    r = y - xs @ cs
                    var_q = float(r @ r) / (n - 4) * float(np.linalg.pinv(xs.T @ xs)[3, 3])
                    if cs[3] * cs[3] >= min_t * min_t * var_q:
                        return float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3])
    f = work_fit([r[:4] for r in rows])
    return None if f is None else (f[0], f[1], f[2], 0.0)


class _WorkWindow:
    """Step-work intervals of one key: those with prefill (``rows``, the window) and, apart, a few without
    (``idle``: decode-only intervals pin the base and decode terms; kept apart so that a long decode-only
    stretch does not push every prefill out of the window). A row is ``(steps, prefill, decode, busy_s,
    prefill_pairs)``, the last NaN when the report had no ``prefill_pairs``; ``fit`` is ``(base, t_p, q)``."""

    __slots__ = ("rows", "idle", "fit", "dirty")

    def __init__(self, n: int):
        self.rows: Deque[Tuple[float, float, float, float, float]] = deque(maxlen=n)
        self.idle: Deque[Tuple[float, float, float, float, float]] = deque(maxlen=max(4, n // 4))
        self.fit: Optional[Tuple[float, float, float]] = None
        self.dirty = 0


class TtftModel:
    """Per-key (replica or region) online TTFT lines with pooled and prior fallbacks."""

    def __init__(self, config: Optional[TtftModelConfig] = None, fit_pairs: bool = False):
        """``fit_pairs``: with ``source='engine_steps'``, also learn the per-pair prefill-attention coefficient
        ``q`` (:meth:`pair_coef`) from reports that carry ``prefill_pairs``; then ``t_p`` is the per-token
        term net of attention. False: the 3-term fit, ``q = 0`` (the linear price)."""
        if isinstance(config, dict):
            config = TtftModelConfig.model_validate(config)
        self.config = config or TtftModelConfig()
        self.fit_pairs = bool(fit_pairs)
        self._w: Dict[Hashable, _Window] = {}
        self._work: Dict[Hashable, _WorkWindow] = {}

    def observe_work(self, key: Hashable, steps: float, prefill_tokens: float, decode_tokens: float,
                     busy_s: float, prefill_pairs: Optional[float] = None) -> bool:
        """Step work an engine did between two of its reports (differences of ``engine_work``;
        ``prefill_pairs`` None when the reports lack it). Used when ``source='engine_steps'``; False
        (ignored) otherwise, or for an empty or invalid interval (a bad ``prefill_pairs`` alone is dropped:
        the interval still counts for the 3-term fit)."""
        cfg = self.config
        if not cfg.online or cfg.source != "engine_steps":
            return False
        try:
            row = (float(steps), float(prefill_tokens), float(decode_tokens), float(busy_s))
        except (TypeError, ValueError):
            return False
        if not all(v >= 0.0 and v != float("inf") for v in row) or row[0] <= 0:
            return False
        pairs = math.nan
        if prefill_pairs is not None:
            try:
                pp = float(prefill_pairs)
            except (TypeError, ValueError):
                pp = math.nan
            if 0.0 <= pp < math.inf:
                pairs = pp
        row = row + (pairs,)
        for k in (key, POOLED):
            w = self._work.get(k)
            if w is None:
                w = self._work[k] = _WorkWindow(cfg.window)
            (w.rows if row[1] > 0 else w.idle).append(row)
            w.dirty += 1
        return True

    def _fit_work(self, key: Hashable) -> Optional[Tuple[float, float, float]]:
        w = self._work.get(key)
        if w is None:
            return None
        cfg = self.config
        if w.dirty and (w.dirty >= cfg.refit_every or w.fit is None):
            w.dirty = 0
            if len(w.rows) >= cfg.min_samples:  # a failed refit (collinear window) keeps the last fit
                f = None
                if self.fit_pairs:  # on the intervals whose reports carried prefill_pairs, if enough do
                    known = [r for r in w.rows if r[4] == r[4]]
                    if len(known) >= cfg.min_samples:
                        f = work_fit_pairs(known + [r for r in w.idle if r[4] == r[4]], cfg.pair_min_t)
                if f is None:
                    f3 = work_fit([r[:4] for r in w.rows] + [r[:4] for r in w.idle])
                    f = None if f3 is None else (f3[0], f3[1], f3[2], 0.0)
                if f is not None and f[1] > 0:
                    w.fit = (cfg.prior_base_s, min(f[1], cfg.max_tp_s), f[3])
        return w.fit

    def pair_coef(self, key: Hashable = POOLED) -> float:
        """Seconds per prefill-attention pair (``q``) of ``key``'s step-work fit, with the same key / pooled
        fallback as :meth:`line`; 0 without a fit (``fit_pairs`` off, another source, no ``prefill_pairs`` in
        the reports, or too few intervals yet): the linear price."""
        if not self.fit_pairs or not self.config.online or self.config.source != "engine_steps":
            return 0.0
        f = self._fit_work(key) if key != POOLED else None
        if f is None:
            f = self._fit_work(POOLED)
        return f[2] if f is not None else 0.0

    def observe(self, key: Hashable, uncached_tokens: float, ttft_s: float) -> bool:
        """Add a sample; False (ignored) if it is not a finite non-negative pair, or the model is not online
        (or fits engine steps: ``source='engine_steps'``)."""
        if not self.config.online or self.config.source != "ttft":
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
            self._work.pop(key, None)

    def samples(self, key: Hashable = POOLED) -> int:
        """Samples the fit of ``key`` holds: TTFT samples, or step-work intervals (``source='engine_steps'``)."""
        if self.config.source == "engine_steps":
            ww = self._work.get(key)
            return len(ww.rows) if ww is not None else 0  # intervals with prefill (what min_samples counts)
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
        fit = self._fit_work if self.config.source == "engine_steps" else self._fit
        f = fit(key) if key != POOLED else None
        if f is not None:
            return f[0], f[1], "key"
        f = fit(POOLED)
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
    #: prefill-attention pairs of its residual prefill (:func:`prefill_pairs`; 0 when not priced)
    pairs: float = 0.0


class WorkTracker:
    """Requests this router dispatched and has not seen complete, per target."""

    def __init__(self):
        self._by_target: Dict[Hashable, Dict[Hashable, WorkItem]] = {}
        self._req: Dict[Hashable, WorkItem] = {}
        # target -> (since, sum of uncached tokens, sum of pairs) of its unseen work
        self._uncached_memo: Dict[Hashable, Tuple[Optional[float], float, float]] = {}

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
        return self._unseen_sums(target, since)[1]

    def unseen_sums(self, target: Hashable, since: Optional[float]) -> Tuple[Optional[float], float, float]:
        """``(since, uncached tokens, prefill-attention pairs)`` of the requests dispatched to ``target`` after
        ``since``: the memo itself (no new tuple on a hit), for the cost loop."""
        m = self._uncached_memo.get(target)
        if m is not None and m[0] == since:
            return m
        return self._unseen_sums(target, since)

    def _unseen_sums(self, target: Hashable, since: Optional[float]) -> Tuple[Optional[float], float, float]:
        u = 0.0
        p = 0.0
        for it in self._by_target.get(target, {}).values():
            if since is None or it.t > since:
                u += it.uncached_tokens
                p += it.pairs
        m = self._uncached_memo[target] = (since, u, p)
        return m

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
