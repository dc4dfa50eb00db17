"""The built-in demands' measured properties, beside their sources' (``benchmarks/RESULTS.md`` states them):

    python -m ray_geolb.sim.workloads.demand_stats [--seeds 0,1,2,3] [--day-s 144]

* the day: each region's peak UTC hour and peak hours (rate >= half its peak,
  :func:`~.demand_data.peak_window`), and per pair of regions the overlap of their days
  (:func:`~.demand_data.curve_overlap`) and the peak hours they share;
* the arrivals of one simulated day per seed: the coefficient of variation of the inter-arrival times in
  operational time (each gap in units of the curve's mean gap at that time, so the day's curve adds nothing;
  1 = Poisson),
  the index of dispersion of the count of arrivals per 100 expected ones (1 = Poisson; a renewal process tends
  to CV^2; bursts lasting many arrivals raise it), the arrivals against the curve's expected count, and the
  mean prompt and output tokens; beside the same measures of the merged Azure 2023 trace
  (:func:`~.demand_data.azure_arrivals`).
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Optional, Sequence

import numpy as np

from .demand_data import azure_arrivals, curve_overlap, peak_window
from .geo_diurnal import BUILTIN_DEMANDS, DEFAULT_DAY_S, Demand, geo_diurnal, load_demand
from .model import Workload

__all__ = ["day_stats", "arrival_stats", "trace_stats", "demand_report", "main"]

IDC_WINDOW = 100  # expected arrivals per window of the index of dispersion


def day_stats(demand: Demand, frac: float = 0.5) -> Dict[str, object]:
    """Peak UTC hour and peak hours per region; overlap and shared peak hours per pair of regions."""
    regions = demand.regions
    windows = {r: peak_window(demand.rates[r], frac) for r in regions}
    pairs = [(a, b) for i, a in enumerate(regions) for b in regions[i + 1:]]
    return {"peak_utc_hour": {r: int(np.argmax(demand.rates[r])) for r in regions},
            "peak_rps": {r: max(demand.rates[r]) for r in regions},
            "peak_hours": windows,
            "overlap": {f"{a}-{b}": curve_overlap(demand.rates[a], demand.rates[b]) for a, b in pairs},
            "shared_peak_hours": {f"{a}-{b}": len(set(windows[a]) & set(windows[b])) for a, b in pairs}}


def _dispersion(ops: np.ndarray, window: float) -> Optional[np.ndarray]:
    """Counts of points per ``window`` of operational time (whole windows only)."""
    n = int(ops.max() // window) if len(ops) else 0
    if n < 2:
        return None
    return np.bincount((ops[ops < n * window] // window).astype(int), minlength=n)


def arrival_stats(w: Workload) -> Dict[str, float]:
    """The measures of the module docstring for one :func:`geo_diurnal` workload (its meta gives the rates)."""
    meta = w.meta
    bin_s = meta["day_s"] / 24.0
    h0, h1 = meta["hours"]
    gaps, counts, expected = [], [], 0.0
    for r, curve in meta["rates"].items():
        lam = np.asarray(curve[h0:h1], dtype=float) * meta["multiplier"]
        cum = np.concatenate([[0.0], np.cumsum(lam * bin_s)])
        expected += float(cum[-1])
        t = np.array([x for x, p in w.open.arrivals if p.region == r])
        if len(t) < 2:
            continue
        i = np.minimum((t // bin_s).astype(int), len(lam) - 1)
        ops = cum[i] + (t - i * bin_s) * lam[i]  # operational time: the curve's expected arrivals so far
        gaps.append(np.diff(ops))
        c = _dispersion(ops, IDC_WINDOW)
        if c is not None:
            counts.append(c)
    g = np.concatenate(gaps)
    c = np.concatenate(counts)
    calls = [p.calls[0] for _, p in w.open.arrivals]
    return {"iat_cv": float(g.std() / g.mean()), "idc": float(c.var() / c.mean()),
            "volume": len(calls) / expected, "prompt_tokens": float(np.mean([x.input_tokens for x in calls])),
            "output_tokens": float(np.mean([x.output_tokens for x in calls])), "requests": len(calls)}


def trace_stats() -> Dict[str, float]:
    """The same measures of the merged Azure 2023 trace itself."""
    tr = azure_arrivals()
    ops = np.cumsum(tr.gaps_s) / tr.mean_gap_s
    c = _dispersion(ops, IDC_WINDOW)
    return {"iat_cv": tr.iat_cv, "idc": float(c.var() / c.mean()), "volume": 1.0,
            "prompt_tokens": float(tr.context_tokens.mean()), "output_tokens": float(tr.generated_tokens.mean()),
            "requests": len(tr.service)}


def _fmt_stats(label: str, runs: List[Dict[str, float]]) -> str:
    def span(k, f):
        xs = [x[k] for x in runs]
        return f"{f.format(np.mean(xs))}" + (f" ({f.format(min(xs))}-{f.format(max(xs))})" if len(xs) > 1 else "")

    return (f"  {label}: IAT CV {span('iat_cv', '{:.2f}')}, dispersion/{IDC_WINDOW} {span('idc', '{:.1f}')}, "
            f"volume x{span('volume', '{:.2f}')}, prompt {span('prompt_tokens', '{:.0f}')} / output "
            f"{span('output_tokens', '{:.0f}')} tokens (mean)")


def demand_report(names: Sequence[str], seeds: Sequence[int], day_s: float = DEFAULT_DAY_S) -> str:
    lines = [f"one simulated day per seed (seeds {','.join(map(str, seeds))}; day_s {day_s:g}); "
             "a span is the mean (min-max over seeds)"]
    for name in names:
        d = load_demand(name)
        s = day_stats(d)
        lines.append(f"\n{name}: day shape {d.meta.get('shape', '')}")
        if d.meta.get("arrivals"):
            lines.append(f"  arrivals: {d.meta['arrivals']}; requests: {d.meta.get('content', '')}")
        lines.append("  peak UTC hour " + ", ".join(f"{r} {h:02d} ({s['peak_rps'][r]:.1f} req/s)"
                                                   for r, h in s["peak_utc_hour"].items()))
        lines.append("  peak hours (>= half the peak) " + "; ".join(
            f"{r} {'all 24' if len(hs) == 24 else ','.join(map(str, hs))}" for r, hs in s["peak_hours"].items()))
        lines.append("  overlap of the days " + ", ".join(
            f"{p} {v:.2f} ({s['shared_peak_hours'][p]} peak hours shared)" for p, v in s["overlap"].items()))
        runs = [arrival_stats(geo_diurnal(**d.workload_kw(), day_s=day_s, seed=k)) for k in seeds]
        lines.append(_fmt_stats("measured", runs))
    lines.append("\nsource: the Azure LLM inference trace 2023, code + conv merged (azure_2023_arrivals.csv.gz)")
    lines.append(_fmt_stats("trace", [trace_stats()]))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ray_geolb.sim.workloads.demand_stats", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demands", default=",".join(BUILTIN_DEMANDS), help="comma-separated built-in demands")
    ap.add_argument("--seeds", default="0,1,2,3", help="comma-separated seeds (default 0,1,2,3)")
    ap.add_argument("--day-s", type=float, default=DEFAULT_DAY_S, help=f"simulated day (default {DEFAULT_DAY_S:g})")
    args = ap.parse_args(argv)
    names = [x.strip() for x in args.demands.split(",") if x.strip()]
    unknown = [x for x in names if x not in BUILTIN_DEMANDS]
    if unknown or not names:
        ap.error(f"--demands: unknown demand(s) {unknown}; known: {', '.join(BUILTIN_DEMANDS)}")
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seeds: not a comma-separated list of integers: {args.seeds!r}")
    if not seeds or min(seeds) < 0 or not args.day_s > 0:
        ap.error("--seeds must name seeds >= 0 and --day-s be > 0")
    print(demand_report(names, seeds, args.day_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
