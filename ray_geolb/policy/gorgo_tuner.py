"""GORGO v2's online weight tuner: a (1+1)-evolution strategy driven by a rolling window of TTFTs.

Re-implemented (not copied) from the authors' repository, Arcadia-Research-Team/GORGO, ``gorgo/tuner.py``
(commit b0bd45d; line numbers below counted by hand on that version, may be off by one), and described
in their rewritten paper ("GORGO: Online Tuning for Cross-Region Network-Aware LLM Serving", 2026,
``paper/v3/paper.tex`` §2.3 "GORGO Proxy Design" and §4 "Tuning and evaluation windows"). Two layers,
as theirs:

* :class:`EvolutionStrategy` -- ``GaussianESTuner`` (``tuner.py:92-174``; ``propose`` 132-144,
  ``report`` 146-165):
  one incumbent point; each candidate multiplies every tuned weight by ``exp(sigma * z)``, ``z ~ N(0, 1)``
  (a Gaussian step in log space), clipped to the weight's ``[lo, hi]`` box (paper eq. 4). A candidate
  replaces the incumbent when its score beats ``best * (1 + tol)`` (scores are "higher is better":
  minus a TTFT percentile). Rechenberg's 1/5 rule: once the last ``success_window`` outcomes are known,
  ``sigma`` is divided by ``sigma_decay`` (grows) after each report whose success share exceeds
  ``target_rate`` and multiplied by it (shrinks) when the share is below. The search stops (``propose``
  returns None) after ``max_steps`` evaluated candidates or once ``sigma < sigma_min``.
* :class:`OnlineWeightTuner` -- ``OnlineTuner.on_sample`` (``tuner.py:525-605``; the ES it drives is
  built in ``OnlineTuner.configure``, ``tuner.py:506-512``, with σ0 0.5, σ_min 0.05, 10,000 steps):
  after each completed request's TTFT sample, once ``hop_size`` samples arrived since the last step and at least
  ``window_size`` samples exist, score the trailing window, report it for the candidate that was live
  (the first report is the baseline of the starting weights), and apply the next proposal; when the ES
  stops, the best weights are applied and the tuner goes dormant.

Faithful details, kept on purpose:

* the acceptance test is theirs (``tuner.py:152``), ``score > best * (1 + tol)``; with negative scores
  (minus a latency) this accepts a candidate up to ``tol`` (0.5 %) *worse* than the incumbent;
* the objective is minus the nearest-rank percentile ``sorted(x)[round(p * (n - 1))]`` (``_percentile_of``,
  ``tuner.py:66-70``; the objectives: ``ONLINE_SCORE_FUNCTIONS``, ``tuner.py:75-82``);
* the report after a step scores the window of the last ``window_size`` samples, which (hop < window)
  still holds samples routed with the previous weights, as theirs does.

One deviation: the ES draws from ``random.Random(seed)`` (theirs is unseeded) so simulations reproduce.

Pure Python, no Ray import (``ray_geolb.policy`` never imports Ray).
"""

from __future__ import annotations

import math
import random
import sys
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple

__all__ = ["EvolutionStrategy", "OnlineWeightTuner", "OBJECTIVES", "nearest_rank_percentile"]


def nearest_rank_percentile(xs: List[float], p: float) -> float:
    """``sorted(xs)[round(p * (n - 1))]`` (clamped; 0 for no samples): the authors' ``_percentile_of``."""
    if not xs:
        return 0.0
    s = sorted(xs)
    i = int(round(p * (len(s) - 1)))
    return s[min(len(s) - 1, max(0, i))]


#: objective name -> score of a window of TTFTs (seconds), higher is better (their ``ONLINE_SCORE_FUNCTIONS``,
#: TTFT metrics only: the paper tunes on ``neg_p95_ttft``)
OBJECTIVES: Dict[str, Callable[[List[float]], float]] = {
    "neg_p50_ttft": lambda w: -nearest_rank_percentile(w, 0.50),
    "neg_p95_ttft": lambda w: -nearest_rank_percentile(w, 0.95),
    "neg_p99_ttft": lambda w: -nearest_rank_percentile(w, 0.99),
    "neg_avg_ttft": lambda w: -(sum(w) / max(1, len(w))),
}


def check_ranges(ranges: Dict[str, Tuple[float, float]]) -> Dict[str, Tuple[float, float]]:
    """Each ``[lo, hi]`` must satisfy ``0 < lo < hi`` (log-space steps); ValueError naming the weight."""
    out = {}
    for k, v in ranges.items():
        try:
            lo, hi = (float(x) for x in v)
        except (TypeError, ValueError):
            raise ValueError(f"{k}: range must be a pair [lo, hi], got {v!r}") from None
        if not lo > 0.0:
            raise ValueError(f"{k}: lower bound must be > 0 (log-space steps), got {lo!r}")
        if not lo < hi:
            raise ValueError(f"{k}: range invalid, lo ({lo!r}) must be < hi ({hi!r})")
        out[k] = (lo, hi)
    return out


#: the largest x whose exp is a finite float
_MAX_EXP_ARG = math.log(sys.float_info.max)


def _exp(x: float) -> float:
    """``exp(x)``, or infinity past the float range (``math.exp`` raises OverflowError there). The 1/5 rule
    can grow sigma without bound over a long run (the authors' 10,000 steps, success shares above 1/5);
    a step that large now lands on the weight box's edge once clipped (as with numpy's exp, which returns
    inf) instead of raising inside the router. Every step inside the float range is unchanged."""
    return math.exp(x) if x < _MAX_EXP_ARG else math.inf


class EvolutionStrategy:
    """(1+1)-ES in log space with Rechenberg's 1/5 success rule (see the module docstring)."""

    def __init__(self, initial: Dict[str, float], ranges: Dict[str, Tuple[float, float]], *,
                 sigma: float = 0.5, sigma_min: float = 0.02, sigma_decay: float = 0.817,
                 success_window: int = 8, target_rate: float = 0.2, tol: float = 0.005,
                 max_steps: int = 16, seed: Optional[int] = None):
        if not ranges:
            raise ValueError("ranges: at least one weight must be tuned")
        self.ranges = check_ranges(ranges)
        self.keys = list(self.ranges)
        self.best: Dict[str, float] = {k: self._clip(k, float(initial.get(k, sum(self.ranges[k]) / 2)))
                                       for k in self.keys}
        self.best_score: Optional[float] = None
        self.sigma = float(sigma)
        self.sigma_min = float(sigma_min)
        self.sigma_decay = float(sigma_decay)
        self.success_window = int(success_window)
        self.target_rate = float(target_rate)
        self.tol = float(tol)
        self.max_steps = int(max_steps)
        self.evaluated = 0  # candidates reported after the baseline
        self._recent: Deque[bool] = deque(maxlen=self.success_window)
        self._rng = random.Random(seed)

    def _clip(self, key: str, v: float) -> float:
        lo, hi = self.ranges[key]
        return min(hi, max(lo, v))

    def done(self) -> bool:
        return self.best_score is not None and (self.evaluated >= self.max_steps or self.sigma < self.sigma_min)

    def propose(self) -> Optional[Dict[str, float]]:
        """The next candidate: the incumbent itself before the baseline is scored; None once stopped."""
        if self.best_score is None:
            return dict(self.best)
        if self.done():
            return None
        gauss = self._rng.gauss
        return {k: self._clip(k, _exp(math.log(max(self.best[k], 1e-300)) + self.sigma * gauss(0.0, 1.0)))
                for k in self.keys}

    def report(self, candidate: Dict[str, float], score: float) -> bool:
        """Score of ``candidate`` (higher is better); True if it is the incumbent now."""
        if self.best_score is None:
            self.best_score, self.best = score, dict(candidate)
            return True
        self.evaluated += 1
        accepted = score > self.best_score * (1.0 + self.tol)
        if accepted:
            self.best_score, self.best = score, dict(candidate)
        self._recent.append(accepted)
        if len(self._recent) >= self.success_window:
            rate = sum(self._recent) / len(self._recent)
            if rate > self.target_rate:
                self.sigma /= self.sigma_decay
            elif rate < self.target_rate:
                self.sigma *= self.sigma_decay
        return accepted


class OnlineWeightTuner:
    """Windowed driver of :class:`EvolutionStrategy` over per-request TTFT samples.

    ``apply(weights)`` is called with the tuned keys' new values each time the tuner writes weights.
    """

    def __init__(self, initial: Dict[str, float], ranges: Dict[str, Tuple[float, float]],
                 apply: Callable[[Dict[str, float]], None], *, objective: str = "neg_p95_ttft",
                 window_size: int = 128, hop_size: int = 32, sigma: float = 0.5, sigma_min: float = 0.05,
                 sigma_decay: float = 0.817, success_window: int = 8, target_rate: float = 0.2,
                 tol: float = 0.005, max_steps: int = 10_000, seed: Optional[int] = None):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got {objective!r}")
        if int(window_size) < 1 or int(hop_size) < 1:
            raise ValueError("window_size and hop_size must be >= 1")
        self.objective = objective
        self.window_size = int(window_size)
        self.hop_size = int(hop_size)
        self.es = EvolutionStrategy(initial, ranges, sigma=sigma, sigma_min=sigma_min, sigma_decay=sigma_decay,
                                    success_window=success_window, target_rate=target_rate, tol=tol,
                                    max_steps=max_steps, seed=seed)
        self._apply = apply
        self._samples: Deque[float] = deque(maxlen=self.window_size)
        self.enabled = True
        self.pending: Optional[Dict[str, float]] = None
        self.since_step = 0
        self.steps = 0
        self.samples_seen = 0
        self.last_score: Optional[float] = None

    def observe(self, ttft_s: float) -> Optional[Dict[str, float]]:
        """One completed request's TTFT; returns the weights written now, if any."""
        self.samples_seen += 1
        self._samples.append(float(ttft_s))
        if not self.enabled:
            return None
        self.since_step += 1
        if self.since_step < self.hop_size or len(self._samples) < self.window_size:
            return None
        es = self.es
        score = float(OBJECTIVES[self.objective](list(self._samples)))
        es.report(self.pending if self.pending is not None else dict(es.best), score)
        self.last_score = score
        proposal = es.propose()
        if proposal is None:  # stopped: pin the best weights and go dormant
            self.enabled = False
            self.pending = None
            self._apply(dict(es.best))
            return dict(es.best)
        self.pending = dict(proposal)
        self.steps += 1
        self.since_step = 0
        self._apply(dict(proposal))
        return dict(proposal)

    def state(self) -> dict:
        es = self.es
        return {"enabled": self.enabled, "steps": self.steps, "samples": self.samples_seen, "sigma": es.sigma,
                "best": dict(es.best), "best_score": es.best_score, "last_score": self.last_score,
                "pending": dict(self.pending) if self.pending is not None else None}
