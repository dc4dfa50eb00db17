"""Every policy side by side on the paper scenarios + GORGO's setting + the network-hard case.

One command::

    python benchmarks/compare_policies.py --out out/compare          # default size (minutes)
    python benchmarks/compare_policies.py --full --ray --out out/full  # paper size

runs every system (``SYSTEMS`` below) on the same seeds (default 0,1,2,3) over

* ``skylb-fig8`` (four panels: conv-sharegpt, conv-wildchat, tot, mixed-tot), ``skylb-fig9`` (one
  region, ToT), ``skylb-fig10`` (diurnal skew at 6/9/12 replicas), ``ray-blog-prefix`` (1/2/4/8
  replicas, PrefixRepetition, drained),
* ``gorgo`` (GORGO's three regions, 10 in flight, Mistral-7B/A100), ``network-hard`` and
  ``shared-context`` (long contexts shared across regions: a closed loop and a dealt trace replay;
  GeoPrefix's hit rate is judged against the oracle's there, >= 90 %),

and prints markdown tables (throughput, TTFT p50/p99, prefix-hit rate and the trace's ideal bound,
cross-region share; mean over seeds, per-seed values in parentheses for throughput and P99) and a
verdict table for GeoPrefix (ours) against SkyLB, GORGO, the best other system's hit rate and the
ideal bound. Verdicts are :mod:`ray_geolb.sim.verdict`'s: "met" needs >= 4 seeds and a mean beyond
the threshold by more than the seed-to-seed standard error; groups with one replica per region (or
one in total) are marked degenerate and not counted. Writes ``results.json`` (every run's summary)
and one PNG per scenario to ``--out``.

Baselines, as configured (``ray_geolb/sim/deploy.py``): GORGO and GORGO-proxy with GORGO's measured
constant t_p (the engine profile's batch-1 TTFT slope; ``gorgo-online`` learns it online); the central
LBs (RR, LL, CH, SGL, P2C, Ray prefix, the DP routers, FlowKV) at their documented defaults; SP-O
(Fig. 9 only) at caps 8-50 in ``paper_repro.py``.

Default size (``--full`` = each scenario's paper size): fig8 at scale 0.5 and 120 s, fig9 at scale 1
and 300 s, fig10 at scale 1 and 120 s, ray-blog at 64 prompts per replica (scale 0.125, drained),
gorgo at scale 1 and 60 s, network-hard at scale 1 and 120 s, shared-context at scale 1 and 120 s.
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
from ray_geolb.sim.verdict import degenerate, goal, paired_ratios, seed_stats  # noqa: E402

SYSTEMS = ["skylb", "skylb-ch", "gorgo", "gorgo-online", "gorgo-proxy", "geoprefix", "sgl", "ch", "ll", "rr", "p2c",
           "ray-prefix", "vllm-default", "jsq-load", "br0", "flowkv", "oracle"]
# scenario -> (default scale, default duration_s); --full uses the scenario's own defaults (None)
DEFAULT_SIZE = {
    "skylb-fig8": (0.5, 120.0),  # SkyLB's requests write up to 256 tokens: ~15 s each on an L4
    "skylb-fig9": (1.0, 300.0),
    "skylb-fig10": (1.0, 120.0),  # scale < 1 rounds 2/3/4 per region onto the same replica counts
    "ray-blog-prefix": (0.125, None),
    "gorgo": (1.0, 60.0),
    "network-hard": (1.0, 120.0),
    "shared-context": (1.0, 120.0),
}
SCENARIOS = list(DEFAULT_SIZE)
DEFAULT_SEEDS = "0,1,2,3"  # every scenario, network-hard and the conversation panels included, over 4 seeds
# groups whose workload is multi-turn conversations (the hit-rate goal is judged there)
CONVERSATION_GROUPS = {"skylb-fig8": ("conv-sharegpt", "conv-wildchat"), "skylb-fig10": None, "gorgo": None,
                       "network-hard": None}  # None: every group of the scenario
# scenario -> groups where GeoPrefix's prefix-hit rate is judged against the oracle's (the bar: >= 90 %)
HIT_VS_ORACLE = {"shared-context": None}
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
    "ideal_prefix_hit_rate": ("ideal_prefix_hit_rate",),
    "cross_region_share": ("cross_region_share",),
}


def aggregate(results: List[dict], keys: List[tuple]) -> Dict[tuple, dict]:
    """(scenario, group, system) -> {metric: {"mean": x, "seeds": {seed: x}}, "replicas": {...}}."""
    out: Dict[tuple, dict] = {}
    for m, (sc, group, system, seed) in zip(results, keys):
        a = out.setdefault((sc, group, system), {k: {"seeds": {}} for k in METRICS})
        a["replicas"] = dict(m["run"]["replicas"])
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
                         "| prefix hit | ideal hit (same trace) | cross-region |")
            lines.append("|---|---|---|---|---|---|---|")
            for (s, gg, system), a in agg.items():
                if s != sc or gg != g:
                    continue
                name = f"**{system}**" if system == OURS else system
                lines.append(f"| {name} | {_with_seeds(a['throughput_rps'], '{:.2f}')} | "
                             f"{_f(a['ttft_p50_s']['mean'], '{:.3f}')} | {_with_seeds(a['ttft_p99_s'], '{:.3f}')} | "
                             f"{_f(a['prefix_hit_rate']['mean'], '{:.1%}')} | "
                             f"{_f(a['ideal_prefix_hit_rate']['mean'], '{:.1%}')} | "
                             f"{_f(a['cross_region_share']['mean'], '{:.1%}')} |")
    return "\n".join(lines)


def _seeds(agg, sc, g, system, k) -> Dict[int, Optional[float]]:
    return ((agg.get((sc, g, system)) or {}).get(k) or {}).get("seeds", {})


def _cell(st: dict, fmt: str = "{:.3f}") -> str:
    if st.get("mean") is None:
        return "-"
    se = f" ± {st['se']:.3f}" if st.get("se") is not None else ""
    return f"{fmt.format(st['mean'])}{se}"


def _per(v: Dict[int, Optional[float]], fmt: str = "{:.3f}") -> str:
    return " / ".join(_f(v[s], fmt) for s in sorted(v))


def _best_other_hit(agg, sc, g) -> Optional[str]:
    """The system other than ours with the highest mean prefix-hit rate in this group."""
    cands = [(a["prefix_hit_rate"]["mean"], s) for (s2, g2, s), a in agg.items()
             if s2 == sc and g2 == g and s != OURS and a["prefix_hit_rate"]["mean"] is not None]
    return max(cands)[1] if cands else None


def group_verdict(agg, sc: str, g: str) -> (str, dict):
    """One verdict row: throughput vs SkyLB (goal >= 1), P99 ratios, hit vs the best other system (goal
    >= 0.95, conversation groups) and vs the trace's ideal bound; degenerate groups are marked."""
    ours = agg.get((sc, g, OURS))
    if ours is None:
        return "", {}
    why = degenerate(ours["replicas"])
    thr = paired_ratios(_seeds(agg, sc, g, OURS, "throughput_rps"), _seeds(agg, sc, g, SKYLB, "throughput_rps"))
    p99_sky = paired_ratios(_seeds(agg, sc, g, SKYLB, "ttft_p99_s"), _seeds(agg, sc, g, OURS, "ttft_p99_s"))
    p99_gorgo = paired_ratios(_seeds(agg, sc, g, GORGO, "ttft_p99_s"), _seeds(agg, sc, g, OURS, "ttft_p99_s"))
    ideal = paired_ratios(_seeds(agg, sc, g, OURS, "prefix_hit_rate"),
                          _seeds(agg, sc, g, OURS, "ideal_prefix_hit_rate"))
    conv = sc in CONVERSATION_GROUPS and (CONVERSATION_GROUPS[sc] is None or g in CONVERSATION_GROUPS[sc])
    best = _best_other_hit(agg, sc, g) if conv else None
    hit = paired_ratios(_seeds(agg, sc, g, OURS, "prefix_hit_rate"), _seeds(agg, sc, g, best, "prefix_hit_rate")) \
        if best else {}
    g_thr, g_hit = goal(thr.values(), 1.0), goal(hit.values(), 0.95) if best else None
    s_sky, s_gorgo, s_ideal = (seed_stats(v.values()) for v in (p99_sky, p99_gorgo, ideal))
    mark = f"degenerate ({why}): not counted" if why else None
    data = {"degenerate": why, "throughput_vs_skylb": dict(g_thr, per_seed=thr),
            "p99_skylb_over_ours": dict(s_sky, per_seed=p99_sky),
            "p99_gorgo_over_ours": dict(s_gorgo, per_seed=p99_gorgo),
            "hit_over_best_other": dict(g_hit, best=best, per_seed=hit) if g_hit else None,
            "hit_over_ideal": dict(s_ideal, per_seed=ideal)}
    row = (f"| {sc} / {g} | {_cell(g_thr)} ({_per(thr)}) | {mark or g_thr['verdict']} | {_cell(s_sky, '{:.2f}')}x | "
           f"{_cell(s_gorgo, '{:.2f}')}x | "
           + (f"{_cell(g_hit, '{:.1%}')} of {best} | {mark or g_hit['verdict']} | " if g_hit else "- | - | ")
           + f"{_cell(s_ideal, '{:.1%}')} |")
    return row, data


def verdict(agg: Dict[tuple, dict], scenarios: List[str]) -> (str, dict):
    rows, data = [], {}
    for sc in scenarios:
        for g in _groups(agg, sc):
            row, d = group_verdict(agg, sc, g)
            if row:
                rows.append(row)
                data[f"{sc}/{g}"] = d
    head = ["| scenario / group | GeoPrefix / SkyLB throughput: mean ± se (per seed) | >= 1 "
            "| SkyLB P99 / GeoPrefix P99 | GORGO P99 / GeoPrefix P99 "
            "| GeoPrefix hit / best other system's hit (conversations) | >= 95 % | GeoPrefix hit / ideal bound |",
            "|---|---|---|---|---|---|---|---|"]
    counted = [d for d in data.values() if not d["degenerate"]]
    tally = {v: sum(d["throughput_vs_skylb"]["verdict"] == v for d in counted)
             for v in ("met", "within noise", "not met")}
    foot = (f"\nthroughput >= SkyLB: met on {tally['met']}, within noise on {tally['within noise']}, not met on "
            f"{tally['not met']} of {len(counted)} groups ({len(data) - len(counted)} degenerate groups not counted)\n")
    hard = data.get("network-hard/network-hard")
    if hard:
        vs = [goal(hard[k]["per_seed"].values(), 1.2) for k in ("p99_skylb_over_ours", "p99_gorgo_over_ours")]
        ok = "met" if all(v["verdict"] == "met" for v in vs) else "NOT met"
        foot += (f"\nnetwork-hard P99 goal (>= 1.2x lower than both SkyLB and GORGO, beyond the seed noise): {ok} "
                 f"(SkyLB/ours {_cell(vs[0], '{:.2f}')}x: {vs[0]['verdict']}; "
                 f"GORGO/ours {_cell(vs[1], '{:.2f}')}x: {vs[1]['verdict']})\n")
    shared = []
    for sc, only in HIT_VS_ORACLE.items():
        for g in _groups(agg, sc) if sc in scenarios else []:
            if only is not None and g not in only:
                continue
            r = goal(paired_ratios(_seeds(agg, sc, g, OURS, "prefix_hit_rate"),
                                   _seeds(agg, sc, g, ORACLE, "prefix_hit_rate")).values(), 0.9)
            if r.get("mean") is not None:
                data.setdefault(f"{sc}/{g}", {})["hit_over_oracle"] = r
                shared.append(f"{sc} / {g} {_cell(r, '{:.1%}')}: {r['verdict']}")
    if shared:
        foot += ("\nshared-prefix hit goal (GeoPrefix's prefix-hit rate >= 90% of the oracle's): "
                 + "; ".join(shared) + "\n")
    return "\n".join(head + rows) + "\n" + foot, data


def _central_systems() -> List[str]:
    """The deployable central LBs (one LB over every region's replicas), from the systems' recipes; the
    oracle is evaluation only and is not one."""
    from ray_geolb.sim.deploy import SYSTEMS as REGISTERED

    return [n for n, rec in REGISTERED.items() if rec.lb_kind == "central" and n != ORACLE]


def central_bar(agg: Dict[tuple, dict], scenarios: List[str]) -> (str, dict):
    """Issue 13's bar per group, on the means over the seeds: GeoPrefix's throughput >= the best central
    LB's, its TTFT p99 <= the best central LB's (lowest p99) x 1.05, its TTFT p50 <= SkyLB's x 1.05. The
    best central LB is taken per criterion (the highest throughput, the lowest p99), each at its defaults;
    degenerate groups are marked and not counted."""
    central = set(_central_systems()) & {sy for (_s, _g, sy) in agg}  # those that ran
    yes = {True: "yes", False: "NO", None: "-"}
    rows, data = [], {}
    for sc in scenarios:
        for g in _groups(agg, sc):
            ours = agg.get((sc, g, OURS))
            cs = [(sy, a) for (s, gg, sy), a in agg.items() if s == sc and gg == g and sy in central]
            if ours is None or not cs:
                continue
            why = degenerate(ours["replicas"])
            thr_sys, thr_a = max(cs, key=lambda x: x[1]["throughput_rps"]["mean"] or 0.0)
            p99_sys, p99_a = min(cs, key=lambda x: x[1]["ttft_p99_s"]["mean"] or math.inf)
            sky = agg.get((sc, g, SKYLB))
            t, t_best = ours["throughput_rps"]["mean"], thr_a["throughput_rps"]["mean"]
            p99, p99_bar = ours["ttft_p99_s"]["mean"], p99_a["ttft_p99_s"]["mean"] * 1.05
            p50 = ours["ttft_p50_s"]["mean"]
            p50_bar = sky["ttft_p50_s"]["mean"] * 1.05 if sky is not None else None
            met = {"throughput": t >= t_best, "p99": p99 <= p99_bar,
                   "p50": None if p50_bar is None else p50 <= p50_bar}
            data[f"{sc}/{g}"] = {"degenerate": why, "throughput": t, "best_central_throughput": [thr_sys, t_best],
                                 "p99": p99, "p99_bar": [p99_sys, p99_bar], "p50": p50, "p50_bar": p50_bar,
                                 "met": met}
            rows.append(f"| {sc} / {g} | {t:.2f} | {t_best:.2f} ({thr_sys}) | {t / t_best:.3f} | {p99:.2f} | "
                        f"{p99_bar:.2f} ({p99_sys}) | {p50:.3f} | {_f(p50_bar, '{:.3f}')} | "
                        + (f"degenerate ({why}): not counted |" if why else
                           f"{yes[met['throughput']]} / {yes[met['p99']]} / {yes[met['p50']]} |"))
    head = ["| scenario / group | GeoPrefix req/s | best central req/s | ratio | GeoPrefix P99 s "
            "| bar: best central P99 x 1.05 | GeoPrefix p50 s | bar: SkyLB p50 x 1.05 | met (req/s / P99 / p50) |",
            "|---|---|---|---|---|---|---|---|---|"]
    counted = [d for d in data.values() if not d["degenerate"]]
    tally = {k: sum(bool(d["met"][k]) for d in counted) for k in ("throughput", "p99", "p50")}
    every = sum(all(d["met"].values()) for d in counted)
    foot = (f"\nthe central-LB bar over {len(counted)} counted groups "
            f"({len(data) - len(counted)} degenerate not counted; central LBs: {', '.join(sorted(central))}): "
            f"throughput met on {tally['throughput']}, P99 on "
            f"{tally['p99']}, p50 on {tally['p50']}, all three on {every}\n")
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


def bar_from(path: str, ours: str, ap) -> int:
    """The central-LB bar with ``ours`` in GeoPrefix's place, from a saved ``results.json`` (a GeoPrefix
    variant run beside the others, e.g. ``geoprefix-steal``), printed as the run prints its own."""
    import json

    rows = []
    for one in path.split(","):  # several runs' results (e.g. a variant run later) are merged
        try:
            with open(one) as f:
                rows += json.load(f).get("aggregate", [])
        except (OSError, ValueError) as e:
            ap.error(f"--bar-from: cannot read {one!r}: {e}")
    agg = {}
    for a in rows:
        a = dict(a)
        sc, g, system = a.pop("scenario"), a.pop("group"), a.pop("system")
        if system == OURS and ours != OURS:
            continue
        agg[(sc, g, OURS if system == ours else system)] = a
    if not any(k[2] == OURS for k in agg):
        ap.error(f"--ours: {ours!r} is not in {path}")
    scenarios = [s for s in SCENARIOS if any(k[0] == s for k in agg)]
    bar, _ = central_bar(agg, scenarios)
    print(f"central-LB bar with {ours} as GeoPrefix (from {path}):\n\n{bar}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/compare_policies")
    ap.add_argument("--seeds", default=DEFAULT_SEEDS,
                    help=f"comma-separated seeds (default {DEFAULT_SEEDS}; verdicts need >= 4)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"subset of {','.join(SCENARIOS)}")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="subset of the systems")
    ap.add_argument("--full", action="store_true", help="each scenario's paper size (scale 1, its own duration)")
    ap.add_argument("--scale", type=float, default=None, help="override every scenario's scale")
    ap.add_argument("--duration", type=float, default=None, help="override every scenario's simulated seconds")
    ap.add_argument("--region-layer", default=None, metavar="FIELD=VALUE[,...]",
                    help="change REGION_LAYER fields of the per-region LBs, as `simulate --region-layer` (an "
                         "ablation, e.g. peer_selectors.geoprefix.cost.peer_summary=false)")
    ap.add_argument("--ray", action="store_true", help="run on a fresh local Ray (2 CPUs) via sweep.run_many")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--bar-from", default=None, metavar="RESULTS_JSON",
                    help="run nothing: print the central-LB bar of --ours from results.json files this command wrote "
                         "(comma-separated: merged)")
    ap.add_argument("--ours", default=OURS, help=f"with --bar-from: the system judged as GeoPrefix (default {OURS})")
    args = ap.parse_args(argv)
    if args.bar_from:
        return bar_from(args.bar_from, args.ours, ap)
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
    if args.region_layer:
        from ray_geolb.sim.cli import _region_layer

        layer = _region_layer(args, ap)
        for r in runs:
            r["deploy"]["region_layer"] = layer
    keys = [r.pop("key") for r in runs]
    t0 = time.perf_counter()
    results = run_many(runs, ray=args.ray, progress=args.progress)
    wall = time.perf_counter() - t0
    agg = aggregate(results, keys)
    tab = tables(agg, scenarios)
    ver, vdata = verdict(agg, scenarios)
    bar, bdata = central_bar(agg, scenarios)
    cmd = "python benchmarks/compare_policies.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"## compare_policies\n\ncommand: `{cmd}`\n\n{len(runs)} runs, seeds {seeds}, "
            f"{sum(m['counters']['requests_completed'] for m in results)} simulated requests, {wall:.0f} s wall\n"
            f"{tab}\n\n### Verdict (GeoPrefix = ours)\n\n{ver}"
            f"\n### Issue 13's bar: GeoPrefix against the best central LB\n\n{bar}")
    print(text)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        f.write(dumps({"command": cmd, "seeds": seeds, "wall_s": wall,
                       "aggregate": [{"scenario": k[0], "group": k[1], "system": k[2], **v} for k, v in agg.items()],
                       "verdict": vdata, "central_bar": bdata,
                       "runs": [dict(m, key=list(k)) for m, k in zip(results, keys)]}))
    paths = plots(agg, scenarios, args.out)
    print(f"\nwrote {os.path.join(args.out, 'results.json')}, summary.md, "
          f"{', '.join(os.path.basename(p) for p in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
