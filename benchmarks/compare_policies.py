"""Every policy side by side on the paper scenarios + GORGO's setting + the network-hard case.

One command::

    python benchmarks/compare_policies.py --out out/compare          # default size (~minutes)
    python benchmarks/compare_policies.py --full --ray --out out/full  # paper size

runs every system (``SYSTEMS`` below) on the same seeds (default 0,1) over

* ``skylb-fig8`` (four panels: conv-sharegpt, conv-wildchat, tot, mixed-tot), ``skylb-fig9`` (one
  region, ToT), ``skylb-fig10`` (diurnal skew at 6/9/12 replicas), ``ray-blog-prefix`` (1/2/4/8
  replicas, PrefixRepetition, drained),
* ``gorgo`` (GORGO's three regions, 10 in flight, Mistral-7B/A100) and ``network-hard``,

and prints markdown tables (throughput, TTFT p50/p99, prefix-hit rate, cross-region share; mean
over seeds, per-seed values in parentheses for throughput and P99) and a verdict table for
GeoPrefix (ours) against SkyLB, GORGO and the oracle. Writes ``results.json`` (every run's summary)
and one PNG per scenario to ``--out``.

Default size (fits a 2-core machine in a few minutes; ``--full`` = each scenario's paper size):
fig8 at scale 0.5 and 60 s, fig9 / fig10 at scale 1 and 60 s, ray-blog at 64 prompts per replica
(scale 0.125, drained), gorgo at scale 1 and 60 s, network-hard at scale 1 and 120 s.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ray_geolb.sim.metrics import dumps  # noqa: E402
from ray_geolb.sim.scenarios import scenario_runs  # noqa: E402
from ray_geolb.sim.sweep import run_many  # noqa: E402

SYSTEMS = ["skylb", "skylb-ch", "gorgo", "gorgo-proxy", "geoprefix", "sgl", "ch", "ll", "rr", "p2c", "ray-prefix",
           "vllm-default", "jsq-load", "br0", "flowkv", "oracle"]
# scenario -> (default scale, default duration_s); --full uses the scenario's own defaults (None)
DEFAULT_SIZE = {
    "skylb-fig8": (0.5, 60.0),
    "skylb-fig9": (1.0, 60.0),
    "skylb-fig10": (1.0, 60.0),  # scale < 1 rounds 2/3/4 per region onto the same replica counts
    "ray-blog-prefix": (0.125, None),
    "gorgo": (1.0, 60.0),
    "network-hard": (1.0, 120.0),
}
SCENARIOS = list(DEFAULT_SIZE)
# groups whose workload is multi-turn conversations (hit rate vs the oracle is judged there)
CONVERSATION_GROUPS = {"skylb-fig8": ("conv-sharegpt", "conv-wildchat"), "skylb-fig10": None, "gorgo": None,
                       "network-hard": None}  # None: every group of the scenario
OURS, SKYLB, GORGO, ORACLE = "geoprefix", "skylb", "gorgo", "oracle"


def build_runs(scenarios: List[str], systems: List[str], seeds: List[int], full: bool,
               scale: Optional[float], duration: Optional[float]) -> List[dict]:
    runs = []
    for sc in scenarios:
        ds, dd = (None, None) if full else DEFAULT_SIZE[sc]
        for seed in seeds:
            for r in scenario_runs(sc, scale=scale if scale is not None else ds,
                                   duration_s=duration if duration is not None else dd, seed=seed,
                                   systems=systems):
                r["key"] = (sc, r["group"], r["system"], seed)
                runs.append(r)
    return runs


def _v(m, path):
    for k in path:
        m = m.get(k) if isinstance(m, dict) else None
    return m


METRICS = {
    "throughput_rps": ("throughput_rps",),
    "ttft_p50_s": ("ttft_s", "p50"),
    "ttft_p99_s": ("ttft_s", "p99"),
    "prefix_hit_rate": ("prefix_hit_rate",),
    "cross_region_share": ("cross_region_share",),
}


def aggregate(results: List[dict], keys: List[tuple]) -> Dict[tuple, dict]:
    """(scenario, group, system) -> {metric: {"mean": x, "seeds": {seed: x}}}."""
    out: Dict[tuple, dict] = {}
    for m, (sc, group, system, seed) in zip(results, keys):
        a = out.setdefault((sc, group, system), {k: {"seeds": {}} for k in METRICS})
        for k, path in METRICS.items():
            a[k]["seeds"][seed] = _v(m, path)
    for a in out.values():
        for k in METRICS:
            vals = [v for v in a[k]["seeds"].values() if v is not None]
            a[k]["mean"] = sum(vals) / len(vals) if vals else None
    return out


def _f(x, fmt):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _with_seeds(a, fmt):
    seeds = a["seeds"]
    per = " / ".join(_f(seeds[s], fmt) for s in sorted(seeds))
    return f"{_f(a['mean'], fmt)} ({per})" if len(seeds) > 1 else _f(a["mean"], fmt)


def _groups(agg: Dict[tuple, dict], scenario: str) -> List[str]:
    """The groups of ``scenario`` in first-seen order."""
    return list(dict.fromkeys(g for (s, g, _sys) in agg if s == scenario))


def tables(agg: Dict[tuple, dict], scenarios: List[str]) -> str:
    lines = []
    for sc in scenarios:
        groups = _groups(agg, sc)
        for g in groups:
            lines.append(f"\n#### {sc} / {g}\n")
            lines.append("| system | req/s mean (per seed) | TTFT p50 s | TTFT p99 s mean (per seed) "
                         "| prefix hit | cross-region |")
            lines.append("|---|---|---|---|---|---|")
            for (s, gg, system), a in agg.items():
                if s != sc or gg != g:
                    continue
                name = f"**{system}**" if system == OURS else system
                lines.append(f"| {name} | {_with_seeds(a['throughput_rps'], '{:.2f}')} | "
                             f"{_f(a['ttft_p50_s']['mean'], '{:.3f}')} | {_with_seeds(a['ttft_p99_s'], '{:.3f}')} | "
                             f"{_f(a['prefix_hit_rate']['mean'], '{:.1%}')} | "
                             f"{_f(a['cross_region_share']['mean'], '{:.1%}')} |")
    return "\n".join(lines)


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def verdict(agg: Dict[tuple, dict], scenarios: List[str]) -> (str, dict):
    rows = []
    data = {}
    for sc in scenarios:
        groups = _groups(agg, sc)
        for g in groups:
            get = lambda system, k: (agg.get((sc, g, system)) or {}).get(k, {}).get("mean")  # noqa: E731
            seeds_of = lambda system, k: (agg.get((sc, g, system)) or {}).get(k, {}).get("seeds", {})  # noqa: E731
            thr = _ratio(get(OURS, "throughput_rps"), get(SKYLB, "throughput_rps"))
            thr_seeds = {s: _ratio(v, seeds_of(SKYLB, "throughput_rps").get(s))
                         for s, v in seeds_of(OURS, "throughput_rps").items()}
            p99_sky = _ratio(get(SKYLB, "ttft_p99_s"), get(OURS, "ttft_p99_s"))
            p99_gorgo = _ratio(get(GORGO, "ttft_p99_s"), get(OURS, "ttft_p99_s"))
            conv = sc in CONVERSATION_GROUPS and (CONVERSATION_GROUPS[sc] is None or g in CONVERSATION_GROUPS[sc])
            hit = _ratio(get(OURS, "prefix_hit_rate"), get(ORACLE, "prefix_hit_rate")) if conv else None
            data[f"{sc}/{g}"] = {"throughput_vs_skylb": thr, "throughput_vs_skylb_per_seed": thr_seeds,
                                 "p99_skylb_over_ours": p99_sky, "p99_gorgo_over_ours": p99_gorgo,
                                 "hit_over_oracle": hit}
            goal_thr = "met" if thr is not None and thr >= 1.0 else ("-" if thr is None else "**not met**")
            goal_hit = "-" if hit is None else ("met" if hit >= 0.95 else "**not met**")
            rows.append(f"| {sc} / {g} | {_f(thr, '{:.3f}')} "
                        f"({' / '.join(_f(thr_seeds[s], '{:.3f}') for s in sorted(thr_seeds))}) | {goal_thr} | "
                        f"{_f(p99_sky, '{:.2f}x')} | {_f(p99_gorgo, '{:.2f}x')} | {_f(hit, '{:.1%}')} | {goal_hit} |")
    head = ["| scenario / group | GeoPrefix / SkyLB throughput mean (per seed) | >= 1 | SkyLB P99 / GeoPrefix P99 | "
            "GORGO P99 / GeoPrefix P99 | GeoPrefix hit / oracle hit (conversations) | >= 95 % |",
            "|---|---|---|---|---|---|---|"]
    hard = data.get("network-hard/network-hard")
    foot = ""
    if hard:
        ok = all(x is not None and x >= 1.2 for x in (hard["p99_skylb_over_ours"], hard["p99_gorgo_over_ours"]))
        foot = (f"\nnetwork-hard P99 goal (>= 1.2x lower than both SkyLB and GORGO): "
                f"{'met' if ok else 'NOT met'} (SkyLB/ours {_f(hard['p99_skylb_over_ours'], '{:.2f}x')}, "
                f"GORGO/ours {_f(hard['p99_gorgo_over_ours'], '{:.2f}x')})\n")
    return "\n".join(head + rows) + "\n" + foot, data


def plots(agg: Dict[tuple, dict], scenarios: List[str], out: str) -> List[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover
        print(f"(no plots: {e})", file=sys.stderr)
        return []
    paths = []
    for sc in scenarios:
        groups = _groups(agg, sc)
        if not groups:
            continue
        fig, axes = plt.subplots(len(groups), 2, figsize=(14, 3.2 * len(groups)), squeeze=False)
        for i, g in enumerate(groups):
            systems = [sy for (s, gg, sy) in agg if s == sc and gg == g]
            thr = [agg[(sc, g, sy)]["throughput_rps"]["mean"] or 0 for sy in systems]
            p99 = [agg[(sc, g, sy)]["ttft_p99_s"]["mean"] or 0 for sy in systems]
            colors = ["tab:red" if sy == OURS else "tab:blue" if sy in (SKYLB, GORGO) else "tab:gray" for sy in systems]
            for ax, vals, lab in ((axes[i][0], thr, "throughput (req/s)"), (axes[i][1], p99, "TTFT p99 (s)")):
                ax.bar(range(len(systems)), vals, color=colors)
                ax.set_xticks(range(len(systems)))
                ax.set_xticklabels(systems, rotation=60, ha="right", fontsize=7)
                ax.set_title(f"{sc} / {g}: {lab}", fontsize=9)
        fig.tight_layout()
        p = os.path.join(out, f"{sc}.png")
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/compare_policies")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"subset of {','.join(SCENARIOS)}")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="subset of the systems")
    ap.add_argument("--full", action="store_true", help="each scenario's paper size (scale 1, its own duration)")
    ap.add_argument("--scale", type=float, default=None, help="override every scenario's scale")
    ap.add_argument("--duration", type=float, default=None, help="override every scenario's simulated seconds")
    ap.add_argument("--ray", action="store_true", help="run on a fresh local Ray (2 CPUs) via sweep.run_many")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    if not seeds:
        ap.error("--seeds: at least one seed")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in scenarios if s not in DEFAULT_SIZE]
    if bad:
        ap.error(f"--scenarios: unknown {bad}; known: {', '.join(SCENARIOS)}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    from ray_geolb.sim.deploy import SYSTEMS as REGISTERED

    bad = [s for s in systems if s not in REGISTERED]
    if bad:
        ap.error(f"--systems: unknown {bad}; known: {', '.join(sorted(REGISTERED))}")

    os.makedirs(args.out, exist_ok=True)
    runs = build_runs(scenarios, systems, seeds, args.full, args.scale, args.duration)
    keys = [r.pop("key") for r in runs]
    t0 = time.perf_counter()
    results = run_many(runs, ray=args.ray, progress=args.progress)
    wall = time.perf_counter() - t0
    agg = aggregate(results, keys)
    tab = tables(agg, scenarios)
    ver, vdata = verdict(agg, scenarios)
    cmd = "python benchmarks/compare_policies.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"## compare_policies\n\ncommand: `{cmd}`\n\n{len(runs)} runs, seeds {seeds}, "
            f"{sum(m['counters']['requests_completed'] for m in results)} simulated requests, {wall:.0f} s wall\n"
            f"{tab}\n\n### Verdict (GeoPrefix = ours)\n\n{ver}")
    print(text)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        f.write(dumps({"command": cmd, "seeds": seeds, "wall_s": wall,
                       "aggregate": [{"scenario": k[0], "group": k[1], "system": k[2], **v} for k, v in agg.items()],
                       "verdict": vdata,
                       "runs": [dict(m, key=list(k)) for m, k in zip(results, keys)]}))
    paths = plots(agg, scenarios, args.out)
    print(f"\nwrote {os.path.join(args.out, 'results.json')}, summary.md, "
          f"{', '.join(os.path.basename(p) for p in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
