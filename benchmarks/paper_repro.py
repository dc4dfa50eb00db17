"""Our simulator's ratios next to the papers' claims (SkyLB Fig. 8 / 9 / 10, Ray Serve prefix-router blog).

    python benchmarks/paper_repro.py --out out/paper_repro          # default size
    python benchmarks/paper_repro.py --full --out out/paper_repro    # paper durations

For each claim: the paper's number, ours (mean over ``--seeds``), the exact scenario command that
produces the underlying runs, and a line "reproduced / not reproduced" with the reason. Fig. 9 also
gets a load sweep (30 / 120 / 240 clients) so readers see where, if anywhere, SP-P and BP separate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ray_geolb.sim.metrics import dumps  # noqa: E402
from ray_geolb.sim.scenarios import scenario_runs  # noqa: E402
from ray_geolb.sim.sweep import run_many  # noqa: E402

DEFAULT_SIZE = {"skylb-fig8": (1.0, 60.0), "skylb-fig9": (1.0, 120.0), "skylb-fig10": (1.0, 60.0),
                "ray-blog-prefix": (0.25, None)}
FIG9_CLIENTS = (30, 120, 240)


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def collect(results: List[dict]) -> Dict[tuple, Dict[str, float]]:
    by: Dict[tuple, List[dict]] = {}
    for m in results:
        by.setdefault((m["scenario"], m["group"], m["run"]["system"]), []).append(m)
    out = {}
    for k, ms in by.items():
        out[k] = {"thr": _mean([m["throughput_rps"] for m in ms]),
                  "ttft_mean": _mean([m["ttft_s"]["mean"] for m in ms]),
                  "ttft_p50": _mean([m["ttft_s"]["p50"] for m in ms]),
                  "ttft_p90": _mean([m["ttft_s"]["p90"] for m in ms]),
                  "e2e_mean": _mean([m["e2e_s"]["mean"] for m in ms]),
                  "hit": _mean([m["prefix_hit_rate"] for m in ms])}
    return out


def _r(a, b):
    return None if a is None or not b else a / b


def _fmt(x, f="{:.2f}x"):
    return "-" if x is None else f.format(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/paper_repro")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--full", action="store_true", help="scenario defaults (paper size and durations)")
    ap.add_argument("--ray", action="store_true")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    os.makedirs(args.out, exist_ok=True)
    runs, cmds = [], {}
    for sc, (scale, dur) in DEFAULT_SIZE.items():
        sc_scale, sc_dur = (None, None) if args.full else (scale, dur)
        for seed in seeds:
            runs += scenario_runs(sc, scale=sc_scale, duration_s=sc_dur, seed=seed)
        opt = "" if args.full else f" --scale {scale}" + (f" --duration {dur:g}" if dur else "")
        cmds[sc] = f"python -m ray_geolb simulate --scenario {sc}{opt} --seeds {args.seeds}"
    # Fig. 9 load sweep
    f9_scale, f9_dur = (None, None) if args.full else DEFAULT_SIZE["skylb-fig9"]
    for n in FIG9_CLIENTS:
        for seed in seeds:
            for r in scenario_runs("skylb-fig9", scale=f9_scale, duration_s=f9_dur, seed=seed):
                r["workload"]["kw"]["clients"] = {"us": n}
                r["group"] = f"sweep {n} clients"
                r["label"] = f"{r['group']}/{r['system']}"
                runs.append(r)
    t0 = time.perf_counter()
    results = run_many(runs, ray=args.ray, progress=False)
    wall = time.perf_counter() - t0
    for m, r in zip(results, runs):
        m["group"] = r["group"]
    agg = collect(results)
    L = [f"## paper_repro ({len(runs)} runs, seeds {seeds}, {wall:.0f} s wall)\n",
         "| claim | paper | ours | verdict |", "|---|---|---|---|"]
    verdicts = {}

    # ---- SkyLB Fig. 8: throughput 1.12-2.06x, latency 1.74-6.30x lower vs the single-LB baselines
    thr_r, lat_r = [], []
    for (sc, g, s), v in agg.items():
        if sc != "skylb-fig8" or s not in ("rr", "ll", "ch", "sgl"):
            continue
        sky = agg[(sc, g, "skylb")]
        thr_r.append(_r(sky["thr"], v["thr"]))
        lat_r.append(_r(v["e2e_mean"], sky["e2e_mean"]))
    thr_r = [x for x in thr_r if x]
    lat_r = [x for x in lat_r if x]
    ok = thr_r and min(thr_r) >= 1.0 and max(thr_r) >= 1.12
    lok = lat_r and min(lat_r) >= 1.0 and max(lat_r) >= 1.74
    L.append(f"| Fig. 8 SkyLB vs RR/LL/CH/SGL (one LB in US) throughput | 1.12-2.06x | "
             f"{_fmt(min(thr_r) if thr_r else None)}-{_fmt(max(thr_r) if thr_r else None)} | "
             f"{'reproduced' if ok else 'not reproduced'} |")
    L.append(f"| Fig. 8 SkyLB vs RR/LL/CH/SGL mean latency (e2e) | 1.74-6.30x lower | "
             f"{_fmt(min(lat_r) if lat_r else None)}-{_fmt(max(lat_r) if lat_r else None)} lower | "
             f"{'reproduced' if lok else 'not reproduced'} |")
    verdicts["fig8"] = {"throughput": thr_r, "latency": lat_r}

    # ---- Fig. 9
    g9 = "tot-1region"
    spp, bp, spo = (agg.get(("skylb-fig9", g9, s)) for s in ("sp-p", "bp", "sp-o"))
    if spp and bp and spo:
        t_bp, p90_bp, t_spo = _r(spp["thr"], bp["thr"]), _r(bp["ttft_p90"], spp["ttft_p90"]), _r(spp["thr"], spo["thr"])
        L.append(f"| Fig. 9 SP-P vs BP throughput (30 clients) | 1.27x | {_fmt(t_bp)} | "
                 f"{'reproduced' if t_bp and t_bp >= 1.1 else 'not reproduced'} |")
        L.append(f"| Fig. 9 SP-P vs BP P90 TTFT | 18.47x lower | {_fmt(p90_bp)} lower | "
                 f"{'reproduced' if p90_bp and p90_bp >= 2 else 'not reproduced'} |")
        L.append(f"| Fig. 9 SP-P vs SP-O throughput | 1.4x | {_fmt(t_spo)} | "
                 f"{'reproduced' if t_spo and t_spo >= 1.2 else 'not reproduced'} |")
        verdicts["fig9"] = {"thr_sp_p_over_bp": t_bp, "p90_bp_over_sp_p": p90_bp, "thr_sp_p_over_sp_o": t_spo}
    sweep = ["\n### Fig. 9 load sweep (one region, 4 L4 replicas, ToT 2-branch)\n",
             "| clients | BP req/s | SP-O req/s | SP-P req/s | SP-P/BP thr "
             "| BP P90 TTFT s | SP-P P90 TTFT s | BP/SP-P P90 |",
             "|---|---|---|---|---|---|---|---|"]
    for n in FIG9_CLIENTS:
        g = f"sweep {n} clients"
        b, o, p = (agg.get(("skylb-fig9", g, s)) for s in ("bp", "sp-o", "sp-p"))
        if b and o and p:
            sweep.append(f"| {n} | {b['thr']:.2f} | {o['thr']:.2f} | {p['thr']:.2f} | {_fmt(_r(p['thr'], b['thr']))} | "
                         f"{b['ttft_p90']:.3f} | {p['ttft_p90']:.3f} | {_fmt(_r(b['ttft_p90'], p['ttft_p90']))} |")

    # ---- Fig. 10: 9 SkyLB replicas ~ 12 region-local
    f10 = {g: v for (sc, g, s), v in agg.items() if sc == "skylb-fig10"}
    sky9 = agg.get(("skylb-fig10", "9 replicas", "skylb"))
    loc12 = agg.get(("skylb-fig10", "12 replicas", "region-local"))
    if sky9 and loc12:
        t = _r(sky9["thr"], loc12["thr"])
        lat = _r(loc12["e2e_mean"], sky9["e2e_mean"])
        L.append(f"| Fig. 10 SkyLB @9 vs region-local @12 (25 % fewer replicas) | ~1x throughput, similar latency | "
                 f"{_fmt(t)} throughput, {_fmt(lat)} lower e2e | "
                 f"{'reproduced' if t and t >= 0.95 else 'not reproduced'} |")
        verdicts["fig10"] = {"thr_sky9_over_local12": t, "e2e_local12_over_sky9": lat, "groups": list(f10)}

    # ---- Ray blog: prefix-aware vs power of two at 8 replicas
    rp, p2 = agg.get(("ray-blog-prefix", "8 replicas", "ray-prefix")), agg.get(("ray-blog-prefix", "8 replicas", "p2c"))
    if rp and p2:
        ttft = 1 - rp["ttft_mean"] / p2["ttft_mean"] if p2["ttft_mean"] else None
        thr = _r(rp["thr"], p2["thr"])
        L.append(f"| Ray blog 8 replicas: prefix-aware vs P2C mean TTFT | ~60 % lower | "
                 f"{_fmt(ttft, '{:.0%}')} lower | {'reproduced' if ttft and ttft >= 0.4 else 'not reproduced'} |")
        L.append(f"| Ray blog 8 replicas: prefix-aware vs P2C throughput | ~40 % higher | "
                 f"{_fmt(thr - 1 if thr else None, '{:+.0%}')} | "
                 f"{'reproduced' if thr and thr >= 1.25 else 'not reproduced'} |")
        verdicts["ray_blog"] = {"ttft_reduction": ttft, "thr_ratio": thr,
                                "hit_ray_prefix": rp["hit"], "hit_p2c": p2["hit"]}

    why = [
        "\nwhy (not) reproduced:\n",
        "* Fig. 8: in our engine model a single US LB over all 12 replicas is not the bottleneck the paper measured "
        "(no LB CPU limit, no HTTP proxy overhead; cross-region RTT is paid but small next to multi-second decode), "
        "and at 60 s conversations reach few turns, so prefix reuse (SkyLB's lever) is small; ratios stay near 1.",
        "* Fig. 9: the engine reports num_waiting right after schedule (vLLM SchedulerStats) and SP-P's credits "
        "come from real headroom; calibrated L4 replicas admit up to 256 sequences and rarely build a waiting "
        "queue, even at 240 clients (sweep), so SP-P has nothing to hold back and equals BP. SP-O (a fixed "
        "outstanding cap) throttles, hence SP-P vs SP-O reproduces (larger than the paper's 1.4x).",
        "* Fig. 10: forwarding lets 9 replicas absorb the US peak, but not fully to the level of 12 region-local "
        "ones in our model (threshold for 'reproduced': >= 0.95x throughput).",
        "* Ray blog: the prefix router's gain comes from cache hits on 512-token shared prefixes; our run is 1/4 of "
        "the blog's prompts (default size), which shortens the warm phase; the direction and size are close.",
    ]
    cmd_lines = why + ["\ncommands (the runs behind each row):\n"] + [f"    {c}" for c in cmds.values()]
    text = "\n".join(L + sweep + cmd_lines)
    print(text)
    with open(os.path.join(args.out, "paper_repro.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        f.write(dumps({"verdicts": verdicts, "aggregate": [{"key": list(k), **v} for k, v in agg.items()],
                       "wall_s": wall}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
