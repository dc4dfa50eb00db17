"""GeoPrefix's residual-prefill price with and without the cached context's attention (issue 26 item 3).

One command::

    python benchmarks/bench_prefill_pricing.py                 # ~2 min on 2 cores
    python benchmarks/bench_prefill_pricing.py --seeds 0,1 --duration 60 --profile llama3.1-8b-h100

runs GeoPrefix twice on the same seeds -- ``linear`` (``price_cached_context=False``: ``t_p·R``, t_p fitted on
steps, prefill and decode tokens, q = 0) and ``attn`` (the default: ``t_p·R + q·R·(c + R/2)`` with t_p and q
fitted online on the engines' ``prefill_pairs`` as well) -- on the long-context scenarios: ``shared-context``
(its closed-loop ``rag`` group and the dealt ``trace-dealt`` replay) and the conversation traces (``gorgo``,
``network-hard`` and skylb-fig8's ``conv-sharegpt`` / ``conv-wildchat`` panels), at compare_policies.py's
default sizes unless ``--duration`` / ``--scale`` say otherwise. Prints one markdown table: prefix-hit rate,
throughput, TTFT and end-to-end latency P50/P99 per scenario group and variant (mean over seeds), the t_p and
q the LBs hold at the end of the run (mean over regions and seeds; t_p with GeoPrefix's floor at the prior),
and the attn/linear ratio of throughput and P99 TTFT (mean of the per-seed ratios ± their standard error).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ray_geolb.sim.deploy import deployment_for  # noqa: E402
from ray_geolb.sim.metrics import summarize  # noqa: E402
from ray_geolb.sim.run_spec import RunSpec  # noqa: E402
from ray_geolb.sim.scenarios import build_workload, scenario_runs  # noqa: E402
from ray_geolb.sim.simulator import Simulator  # noqa: E402

# scenario -> (scale, duration_s, groups kept (None: all)): compare_policies.py's default sizes
SCENARIOS = {
    "shared-context": (1.0, 120.0, None),
    "gorgo": (1.0, 60.0, None),
    "network-hard": (1.0, 120.0, None),
    "skylb-fig8": (0.5, 120.0, ("conv-sharegpt", "conv-wildchat")),
}
VARIANTS = {"linear": False, "attn": True}  # label -> GeoPrefix's price_cached_context


def build_runs(seeds: List[int], duration: Optional[float], scale: Optional[float],
               profile: Optional[str]) -> List[dict]:
    runs = []
    for sc, (sc_scale, sc_dur, groups) in SCENARIOS.items():
        for seed in seeds:
            for r in scenario_runs(sc, scale=scale if scale is not None else sc_scale,
                                   duration_s=duration if duration is not None else sc_dur, seed=seed,
                                   systems=["geoprefix"], profile=profile):
                if groups is not None and r["group"] not in groups:
                    continue
                for variant, price in VARIANTS.items():
                    v = dict(r, label=f"{r['label']}/{variant}/s{seed}")
                    v["deploy"] = dict(r.get("deploy") or {},
                                       policy={"name": "geoprefix", "price_cached_context": price})
                    v["key"] = (sc, r["group"], variant, seed)
                    runs.append(v)
    return runs


def _one(run: dict) -> dict:
    """``scenarios.run_one`` without the CDF, keeping the simulator to read what the LBs learned."""
    key = run.pop("key")
    spec = RunSpec.model_validate(run)
    sim = Simulator(build_workload(spec.workload), deployment_for(spec.system, spec.replicas, **spec.deploy),
                    spec.sim)
    m = summarize(sim.run())
    pols = [lb.policy for lb in sim.lbs.values() if hasattr(lb.policy, "pair_coef")]
    return {"key": key, "hit": m["prefix_hit_rate"], "rps": m["throughput_rps"],
            "ttft50": m["ttft_s"]["p50"], "ttft99": m["ttft_s"]["p99"],
            "e2e50": m["e2e_s"]["p50"], "e2e99": m["e2e_s"]["p99"], "n": m["counters"]["requests_completed"],
            # at the end of the run, mean over the regions' LBs: the pooled t_p (floor applied) and q
            "tp_us": _mean([p.pooled_t_p() * 1e6 for p in pols]), "q_ns": _mean([p.pair_coef() * 1e9 for p in pols])}


def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def _ratio(rows: Dict[tuple, dict], sc, g, seeds, k) -> str:
    rs = [rows[(sc, g, "attn", s)][k] / rows[(sc, g, "linear", s)][k] for s in seeds
          if rows[(sc, g, "linear", s)][k]]
    if not rs:
        return "-"
    m = _mean(rs)
    se = (math.sqrt(sum((r - m) ** 2 for r in rs) / (len(rs) - 1) / len(rs)) if len(rs) > 1 else float("nan"))
    return f"{m:.3f} ± {se:.3f}"


def table(results: List[dict], seeds: List[int]) -> str:
    rows = {r["key"]: r for r in results}
    groups = []
    for (sc, g, _v, _s) in rows:
        if (sc, g) not in groups:
            groups.append((sc, g))
    out = ["| scenario / group | pricing | hit rate | req/s | TTFT p50 (s) | TTFT p99 (s) | e2e p50 (s) | "
           "e2e p99 (s) | t_p (us/token) | q (ns/pair) | attn/linear req/s | attn/linear TTFT p99 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sc, g in groups:
        for variant in VARIANTS:
            rs = [rows[(sc, g, variant, s)] for s in seeds]
            cells = [f"{_mean([r[k] for r in rs]):.3f}" for k in ("hit", "rps", "ttft50", "ttft99", "e2e50", "e2e99")]
            cells += [f"{_mean([r['tp_us'] for r in rs]):.2f}", f"{_mean([r['q_ns'] for r in rs]):.3f}"]
            extra = ([_ratio(rows, sc, g, seeds, "rps"), _ratio(rows, sc, g, seeds, "ttft99")]
                     if variant == "attn" else ["", ""])
            out.append(f"| {sc} / {g} | {variant} | " + " | ".join(cells + extra) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3", help="comma-separated seeds (default 0,1,2,3)")
    ap.add_argument("--duration", type=float, default=None, help="simulated seconds per run (default: per scenario)")
    ap.add_argument("--scale", type=float, default=None, help="scenario size factor (default: per scenario)")
    ap.add_argument("--profile", default=None, help="engine profile (default: each scenario's own)")
    ap.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    runs = build_runs(seeds, a.duration, a.scale, a.profile)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, a.workers)) as ex:
        results = list(ex.map(_one, runs))
    print(f"GeoPrefix residual-prefill pricing: linear (price_cached_context=False) vs attn (True); "
          f"{len(runs)} runs, seeds {a.seeds}, profile {a.profile or 'per scenario'}, "
          f"{time.perf_counter() - t0:.0f} s wall\n")
    print(table(results, seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
