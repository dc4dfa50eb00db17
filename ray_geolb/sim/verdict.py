"""Verdicts that mean something: a goal or a paper's claim judged over seeds, against their noise.

* **A goal** ("ours >= threshold"): over ``n >= MIN_SEEDS`` seeds, with per-seed values ``x_i`` (a ratio
  is taken per seed, paired: ``ours_s / baseline_s``), mean ``m`` and seed-to-seed standard error
  ``se = sd / sqrt(n)`` (sample sd): **met** if ``m - threshold > se``; **not met** if
  ``threshold - m > se``; else **within noise**. Fewer seeds: **too few seeds**.
* **A paper's ratio** ``P`` (an improvement, ``P > 1``, e.g. 1.27x throughput or 18.47x lower P90 as
  ``baseline / ours``): the direction is reproduced if ``m - 1 > se``; **reproduced** if moreover the
  effect ``(m - 1) / (P - 1)`` is within ``[1 / OVERSHOOT, OVERSHOOT]`` of the paper's (for a range
  ``P..P_hi``: at least ``1 / OVERSHOOT`` of the low end's effect, at most ``OVERSHOOT`` times the high
  end's); a larger effect is **flagged as an overshoot** (not "reproduced"), a smaller one is
  "direction only (weaker)";
  ``1 - m > se`` is the **opposite direction**; else **no effect beyond noise**.
* **Degenerate groups** (one replica in total, or one per region: a per-region LB then has nothing to
  choose between) are marked and not counted.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Optional

__all__ = ["MIN_SEEDS", "OVERSHOOT", "seed_stats", "goal", "paper_ratio", "paired_ratios", "degenerate"]

MIN_SEEDS = 4
OVERSHOOT = 2.0


def seed_stats(values: Iterable[Optional[float]]) -> Dict[str, Optional[float]]:
    """``{n, mean, sd, se}`` of the non-None values (sd with n - 1; se = sd / sqrt(n))."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(xs)
    if not n:
        return {"n": 0, "mean": None, "sd": None, "se": None}
    m = math.fsum(xs) / n
    sd = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else None
    return {"n": n, "mean": m, "sd": sd, "se": sd / math.sqrt(n) if sd is not None else None}


def paired_ratios(num: Dict[int, Optional[float]], den: Dict[int, Optional[float]]) -> Dict[int, Optional[float]]:
    """``num[s] / den[s]`` for every seed both have (None where either is missing or den is 0)."""
    out = {}
    for s in sorted(set(num) & set(den)):
        a, b = num[s], den[s]
        out[s] = None if a is None or not b else a / b
    return out


def goal(values: Iterable[Optional[float]], threshold: float) -> Dict[str, object]:
    """Verdict of "the mean is above ``threshold``" (module docstring) with its statistics."""
    st = seed_stats(values)
    st["threshold"] = threshold
    if st["n"] < MIN_SEEDS:
        st["verdict"] = f"too few seeds ({st['n']} < {MIN_SEEDS})"
        return st
    m, se = st["mean"], st["se"]
    st["verdict"] = "met" if m - threshold > se else ("not met" if threshold - m > se else "within noise")
    return st


def paper_ratio(values: Iterable[Optional[float]], paper: float, paper_hi: Optional[float] = None) -> Dict[str, object]:
    """Verdict of reproducing a paper's improvement ratio ``paper`` (> 1), or the range ``paper..paper_hi``,
    from per-seed ratios (module docstring; for a range the effect is judged against its ends)."""
    hi = paper if paper_hi is None else paper_hi
    st = seed_stats(values)
    st["paper"] = paper if paper_hi is None else [paper, hi]
    if st["n"] < MIN_SEEDS:
        st["verdict"] = f"too few seeds ({st['n']} < {MIN_SEEDS})"
        return st
    m, se = st["mean"], st["se"]
    lo_effect, hi_effect = (m - 1.0) / (paper - 1.0), (m - 1.0) / (hi - 1.0)
    st["effect_vs_paper"] = lo_effect if paper_hi is None else [lo_effect, hi_effect]
    if m - 1.0 > se:
        if hi_effect > OVERSHOOT:
            st["verdict"] = f"direction reproduced, effect {hi_effect:.1f}x the paper's: overshoot (flagged)"
        elif lo_effect < 1.0 / OVERSHOOT:
            st["verdict"] = f"direction only (effect {lo_effect:.2f}x the paper's)"
        else:
            st["verdict"] = "reproduced"
    elif 1.0 - m > se:
        st["verdict"] = "opposite direction"
    else:
        st["verdict"] = "no effect beyond noise"
    return st


def degenerate(replicas: Dict[str, int]) -> Optional[str]:
    """Why a group cannot show a routing difference (None if it can)."""
    counts = [n for n in replicas.values() if n > 0]
    if sum(counts) <= 1:
        return "one replica in total"
    if max(counts) == 1:
        return "one replica per region"
    return None
