"""Metrics of a simulated run, deterministic JSON, and a per-system summary table.

:func:`summarize` turns a :class:`~ray_geolb.sim.simulator.SimResult` into a plain dict:

* ``throughput_rps`` / ``throughput_out_tok_s``: completed requests (output tokens) per second of the
  run (``elapsed_s``: the cut-off time, or the last completion if everything ended earlier);
* ``ttft_s`` / ``e2e_s`` / ``lb_queue_s``: ``{mean, p50, p90, p99}`` over completed requests
  (client-side: every network hop counted both ways); percentiles by linear interpolation
  (:mod:`ray_geolb.percentile`, numpy's default);
* ``prefix_hit_rate``: engine prefix-cache hit tokens / queried prompt tokens, summed over replicas
  (vLLM's ``prefix_cache_stats``; recomputation after preemption is not counted);
* ``ideal_prefix_hit_rate``: the ideal bound of the same trace (one unlimited cache that sees every
  request, :class:`~ray_geolb.sim.observe.IdealPrefixCache`);
* ``load``: engine load per replica (outstanding, running, waiting, KV usage: mean/p50/p90/max over
  samples) and the share of replica reports that said something was waiting (``sim/observe.py``);
* ``outstanding_cv`` / ``outstanding_max_over_min``: per-replica outstanding requests (engine-side:
  waiting + running), sampled every ``sample_period_s`` while anything is outstanding, time-averaged;
  max/min uses max(1, min);
* ``cross_region_share``: completed requests served by a replica outside the client's region;
* counters (sent / completed / rejected / in flight at the cut-off, forwards, holds...);
* ``faults`` (a run with region outages or partitions only): attainment and goodput through each fault
  (:func:`ray_geolb.sim.faults.fault_report`).

:func:`dumps` writes sorted keys with every float rounded to 6 decimals, so the same run gives the
same bytes.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Iterable, List, Sequence

from ray_geolb.percentile import percentile

__all__ = ["summarize", "dumps", "round_floats", "percentiles", "summary_table", "text_table", "ttft_values"]

FLOAT_DIGITS = 6


def percentiles(xs: Sequence[float]) -> Dict[str, float]:
    """``{mean, p50, p90, p99, n}`` of ``xs`` (percentiles: :func:`ray_geolb.percentile.percentile`)."""
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "n": 0}
    p50, p90, p99 = percentile(xs, (50, 90, 99))
    return {"mean": math.fsum(xs) / len(xs), "p50": p50, "p90": p90, "p99": p99, "n": len(xs)}


def _mean(xs: Iterable[float]):
    xs = list(xs)
    return math.fsum(xs) / len(xs) if xs else None


def ttft_values(result) -> List[float]:
    return [r[1] for r in result.requests]


def summarize(result) -> Dict[str, Any]:
    reqs = result.requests
    el = result.elapsed_s
    c = result.counters
    hits = sum(e.get("prefix_cache_hits", 0) for e in result.engine_stats.values())
    queries = sum(e.get("prefix_cache_queries", 0) for e in result.engine_stats.values())
    completed = c["requests_completed"]
    out_tok = sum(r[4] for r in reqs)
    by_region: Dict[str, List[tuple]] = {}
    for r in reqs:
        by_region.setdefault(r[7], []).append(r)
    per_replica: Dict[str, int] = {}
    for r in reqs:
        per_replica[r[8]] = per_replica.get(r[8], 0) + 1
    s = result.samples
    m = {
        "system": result.deployment.get("system"),
        "workload": result.workload,
        "elapsed_s": el,
        "throughput_rps": completed / el,
        "throughput_out_tok_s": out_tok / el,
        "ttft_s": percentiles([r[1] for r in reqs]),
        "e2e_s": percentiles([r[2] for r in reqs]),
        "lb_queue_s": percentiles([r[5] for r in reqs]),
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "ideal_prefix_hit_rate": (result.ideal or {}).get("hit_rate"),
        "load": result.load,
        "cross_region_share": (sum(1 for r in reqs if r[6]) / len(reqs)) if reqs else 0.0,
        "outstanding_cv": _mean(s.get("outstanding_cv", [])),
        "outstanding_max_over_min": _mean(s.get("outstanding_max_min", [])),
        "outstanding_spread": _mean(s.get("outstanding_spread", [])),
        "lb_queue_len_mean": _mean(s.get("lb_queue", [])),
        "preemptions": sum(e.get("num_preempted", 0) for e in result.engine_stats.values()),
        "counters": dict(c),
        "decisions": dict(result.decisions),
        "completed_per_replica": per_replica,
        "per_client_region": {
            reg: {"completed": len(rs), "ttft_p50_s": percentiles([r[1] for r in rs])["p50"],
                  "ttft_p90_s": percentiles([r[1] for r in rs])["p90"],
                  "cross_region_share": sum(1 for r in rs if r[6]) / len(rs)}
            for reg, rs in sorted(by_region.items())},
        "deployment": result.deployment,
        "config": result.config,
    }
    if getattr(result, "faults", None):
        from .faults import fault_report

        m["faults"] = fault_report(result)
    return m


def round_floats(x: Any, digits: int = FLOAT_DIGITS) -> Any:
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return None
        v = round(x, digits)
        return 0.0 if v == 0 else v
    if isinstance(x, dict):
        return {str(k): round_floats(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [round_floats(v, digits) for v in x]
    return x


def dumps(obj: Any) -> str:
    return json.dumps(round_floats(obj), sort_keys=True, indent=1, allow_nan=False) + "\n"


_COLS = [("system", "system", "{}"), ("req/s", "throughput_rps", "{:.2f}"), ("tok/s", "throughput_out_tok_s", "{:.0f}"),
         ("ttft p50", ("ttft_s", "p50"), "{:.3f}"), ("ttft p90", ("ttft_s", "p90"), "{:.3f}"),
         ("ttft p99", ("ttft_s", "p99"), "{:.3f}"), ("e2e p50", ("e2e_s", "p50"), "{:.2f}"),
         ("e2e p90", ("e2e_s", "p90"), "{:.2f}"), ("hit", "prefix_hit_rate", "{:.1%}"),
         ("cross", "cross_region_share", "{:.1%}"), ("out max/min", "outstanding_max_over_min", "{:.2f}"),
         ("lbq p99", ("lb_queue_s", "p99"), "{:.3f}"), ("done", ("counters", "requests_completed"), "{}")]


def _get(m, key):
    if isinstance(key, tuple):
        for k in key:
            m = m.get(k) if isinstance(m, dict) else None
        return m
    return m.get(key)


def summary_table(rows: Sequence[Dict[str, Any]], label: str = "system", header: str = "system") -> str:
    """A plain-text table, one row per run summary (``label`` = the first column's key)."""
    cols = [(header if i == 0 else h, label if i == 0 else k, f) for i, (h, k, f) in enumerate(_COLS)]
    table = [[h for h, _, _ in cols]]
    for m in rows:
        line = []
        for _, k, f in cols:
            v = _get(m, k)
            line.append("-" if v is None else f.format(v))
        table.append(line)
    return text_table(table)


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows of strings as aligned plain text: the first row is the header, underlined with dashes; the
    first column left-aligned, the others right-aligned (the simulator's, plan's and goodput's tables)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
