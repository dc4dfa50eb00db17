"""The real data behind the built-in demands other than ``geo-diurnal-3`` (fixtures in ``ray_geolb/data``,
rebuilt from the shared data by ``ray_geolb/data/make_fixtures.py``'s ``demand_fixtures``; SOURCES.md there):

* :func:`workday_day_shape`: the day of ServeGen's working-day tenants
  (``servegen_m-large_workday_tenants_hourly.csv``: the m-large tenants whose days repeat one routine and
  put >= 75 % of their requests in local 08:00-20:00, summed; 14-day mean per local hour), the
  ``geo-workday-3`` demand's shape;
* :func:`azure_arrivals`: the Azure LLM inference trace 2023, code and conv merged in time order
  (``azure_2023_arrivals.csv.gz``: gap to the previous request, service, prompt and output tokens), which
  ``azure-bursty-3`` replays.

And the measures its tests and ``demand_stats`` state: :func:`curve_overlap` (how much two regions' days
overlap) and :func:`peak_window` (a region's peak hours).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from .datasets import fixture_path, open_text

__all__ = ["AzureArrivals", "azure_arrivals", "workday_day_shape", "curve_overlap", "peak_window"]


@lru_cache(maxsize=4)
def workday_day_shape(path: Optional[str] = None) -> tuple:
    """24 hourly factors (mean 1) of ServeGen's working-day tenants, hour 0 = local midnight."""
    p = Path(path) if path is not None else fixture_path("servegen_workday")
    with open_text(p) as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("#")) if r]
    if rows[0] != ["local_hour", "rate_rps"] or len(rows) != 25:
        raise ValueError(f"{p}: expected a header local_hour,rate_rps and 24 rows")
    rates = np.array([float(r[1]) for r in rows[1:]])
    if [int(r[0]) for r in rows[1:]] != list(range(24)) or not (rates >= 0).all() or rates.sum() <= 0:
        raise ValueError(f"{p}: local_hour must run 0..23 and rate_rps be >= 0, not all 0")
    return tuple(float(x) for x in rates / rates.mean())


@dataclass(frozen=True)
class AzureArrivals:
    """The merged Azure 2023 trace: ``gaps_s[i]`` = seconds from request i-1 to request i (``gaps_s[0]`` = 0),
    ``service[i]`` (``code`` / ``conv``), ``context_tokens[i]``, ``generated_tokens[i]``."""

    gaps_s: np.ndarray
    service: tuple
    context_tokens: np.ndarray
    generated_tokens: np.ndarray

    @property
    def mean_gap_s(self) -> float:
        return float(self.gaps_s[1:].mean())

    @property
    def iat_cv(self) -> float:
        """Coefficient of variation of the trace's inter-arrival times."""
        g = self.gaps_s[1:]
        return float(g.std() / g.mean())

    def unit_gaps(self) -> np.ndarray:
        """The gaps in units of the mean gap (a unit-rate process), the first one (the wrap from the last
        request back to the first when a replay runs past the end) set to the mean."""
        g = self.gaps_s / self.mean_gap_s
        g[0] = 1.0
        return g


@lru_cache(maxsize=4)
def azure_arrivals(path: Optional[str] = None) -> AzureArrivals:
    p = Path(path) if path is not None else fixture_path("azure_arrivals")
    with open_text(p) as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != ["gap_us", "service", "context_tokens", "generated_tokens"]:
        raise ValueError(f"{p}: expected a header gap_us,service,context_tokens,generated_tokens")
    body = [r for r in rows[1:] if r]
    try:
        gaps = np.array([int(r[0]) for r in body], dtype=float) / 1e6
        ctx = np.array([int(r[2]) for r in body])
        gen = np.array([int(r[3]) for r in body])
    except (ValueError, IndexError) as e:
        raise ValueError(f"{p}: a row is not gap_us,service,context_tokens,generated_tokens ({e})") from None
    if len(body) < 2 or (gaps < 0).any() or (ctx < 1).any() or (gen < 1).any():
        raise ValueError(f"{p}: need >= 2 rows, gaps >= 0 and token counts >= 1")
    return AzureArrivals(gaps, tuple(r[1] for r in body), ctx, gen)


def curve_overlap(a: Sequence[float], b: Sequence[float]) -> float:
    """How much two days overlap: the sum over hours of the smaller of their normalised curves (each curve's
    share of its day's requests in the hour); 1 = the same shape, 0 = never busy at the same hour."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.minimum(x / x.sum(), y / y.sum()).sum())


def peak_window(rates: Sequence[float], frac: float = 0.5) -> List[int]:
    """A region's peak hours: the hours whose rate is at least ``frac`` of its peak."""
    top = max(rates)
    return [h for h, x in enumerate(rates) if x >= frac * top]
