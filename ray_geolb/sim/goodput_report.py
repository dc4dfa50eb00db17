"""What ``python -m ray_geolb goodput`` reports: each system's goodput at each SLO, its curves, and verdicts.

* **The result** (:func:`goodput_result`, ``goodput.json``): per system and SLO the goodput per seed (the
  largest multiplier that met the SLO, the first that failed above it, the bracket's relative width) and its
  spread over ``--seeds`` (and apart over ``--held-out-seeds``); the **curve** of each seed -- every
  multiplier simulated for any SLO, with its P99 TTFT / TPOT, and per SLO its attainment and whether it met
  the SLO; attainment at ``--at``.
* **Verdicts** (:func:`compare`): the first system against each other one, per SLO. Per seed, a **win** is
  a bracket wholly above the other's (the first system met the SLO at a multiplier where the other had
  already failed), a **loss** the reverse, anything else a **tie** at the search's resolution. Over
  ``n >= verdict.MIN_SEEDS`` seeds the paired ratios ``ours_s / theirs_s`` are judged as
  :func:`~ray_geolb.sim.verdict.goal` judges a goal (the mean beyond one seed-to-seed standard error of 1),
  and the margin is widened to the search's resolution (the widest final bracket of either system): a win
  needs ``mean - 1 > max(se, resolution)``, a loss ``1 - mean > max(se, resolution)``, the rest is a tie.
  With fewer seeds (held-out seeds) there is no spread to judge: a win needs a win on every seed, a loss a
  loss on every seed, and it says so.
* **Text** (:func:`format_goodput`) and a **plot** (:func:`plot_goodput`, ``goodput.png``: P99 TTFT and
  attainment against the multiplier, one row per SLO).
* **What it cost** (:func:`timing_summary`, ``timing`` in ``goodput.json`` and in ``plan``'s JSON; printed on
  stderr by :func:`format_timing`): per system the runs and the wall seconds they took where they ran,
  summed, and an estimate of the wall time on more cores (:func:`estimate_wall_s`). Wall time varies with
  the machine and its load: it is never part of the result.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .metrics import text_table

__all__ = ["spread", "goodput_result", "compare", "verdicts", "format_goodput", "plot_goodput", "estimate_wall_s",
           "timing_summary", "format_timing", "ESTIMATE_CORES"]

#: the worker counts every timing summary estimates the wall time for (the development machine has 2 cores)
ESTIMATE_CORES = (2, 16)


def spread(per_seed: Dict[int, dict], seeds: Sequence[int]) -> Dict[str, Any]:
    """min / mean / max of the goodput over ``seeds``, and the search's resolution: the largest relative
    width ``first_fail / goodput - 1`` of a seed's final bracket (None where no seed has both ends)."""
    gs = [per_seed[s]["goodput_multiplier"] for s in seeds]
    res = [per_seed[s]["resolution"] for s in seeds if per_seed[s]["resolution"] is not None]
    return {"min": min(gs), "max": max(gs), "mean": sum(gs) / len(gs), "seeds": list(seeds),
            "resolution": max(res) if res else None}


def _attainment_at(at: Dict[int, dict], k: int, seeds: Sequence[int], multiplier: float) -> Dict[str, Any]:
    figs = [at[s]["by_slo"][k] for s in seeds]
    return {"multiplier": multiplier, "seeds": list(seeds), "per_seed": [m["attainment"] for m in figs],
            "p99_ttft_s_per_seed": [m["p99_ttft_s"] for m in figs]}


def goodput_result(ans: Dict[str, dict], inp: Dict[str, Any], args) -> Dict[str, Any]:
    """The command's JSON (module docstring) from the searches' answers (``goodput._goodput_search``)."""
    from .attribution import merge
    from .workloads.geo_diurnal import Demand

    demand, seeds, held = inp["demand"], inp["seeds"], inp["held_out"]
    out: Dict[str, Any] = {
        "demand": {"source": demand.source, "mean_rps": sum(demand.total()) / 24.0,
                   "rates_rps_by_utc_hour": demand.to_kw(), "workload": dict(demand.workload)},
        "replicas": inp["replicas"], "profile": args.profile, "slo": inp["slos"][0].to_dict(),
        "slos": [s.to_dict() for s in inp["slos"]], "slo_texts": [str(s) for s in inp["slos"]],
        "seeds": seeds, "held_out_seeds": held,
        "search": {"start": args.start, "max_doublings": inp["max_doublings"], "bisect_steps": args.bisect_steps,
                   "grid": "3 significant digits", "at": args.at},
        "compression": {"day_s": args.day_s, "factor": 86400.0 / args.day_s,
                        "note": Demand.compression_note(args.day_s)}, "systems": {}}
    for s in inp["systems"]:
        by_slo = []
        for k, g in enumerate(ans[s]["by_slo"]):
            entry = {"slo": g["slo"], "goodput": {"per_seed": g["per_seed"], **spread(g["per_seed"], seeds)},
                     "attainment_at": _attainment_at(ans[s]["at"], k, seeds + held, args.at)}
            if held:
                entry["goodput"]["held_out"] = spread(g["per_seed"], held)
            if getattr(args, "attribute", False):
                entry["attribution_at"] = merge([ans[s]["at"][x]["by_slo"][k]["attribution"] for x in seeds + held])
            by_slo.append(entry)
        out["systems"][s] = {"goodput": by_slo[0]["goodput"], "attainment_at": by_slo[0]["attainment_at"],
                             "by_slo": by_slo, "curve": ans[s]["curve"]}
        if "attribution_at" in by_slo[0]:
            out["systems"][s]["attribution_at"] = by_slo[0]["attribution_at"]
    out["verdicts"] = verdicts(out)
    return out


# ------------------------------------------------------------------------------------------------ verdicts
def _seed_verdict(a: dict, b: dict) -> str:
    """One seed: win when ``a`` met the SLO at a multiplier where ``b`` had failed, loss the reverse."""
    if b["first_fail"] is not None and a["goodput_multiplier"] > 0 and a["goodput_multiplier"] >= b["first_fail"]:
        return "win"
    if a["first_fail"] is not None and b["goodput_multiplier"] > 0 and b["goodput_multiplier"] >= a["first_fail"]:
        return "loss"
    return "tie"


def compare(a: Dict[int, dict], b: Dict[int, dict], seeds: Sequence[int]) -> Dict[str, Any]:
    """``a``'s goodput against ``b``'s over ``seeds`` (each a search's per-seed answers), module docstring."""
    from .verdict import MIN_SEEDS, goal

    per_seed = {s: _seed_verdict(a[s], b[s]) for s in seeds}
    ratios = {s: a[s]["goodput_multiplier"] / b[s]["goodput_multiplier"] for s in seeds
              if a[s]["goodput_multiplier"] > 0 and b[s]["goodput_multiplier"] > 0}
    widths = [x[s]["resolution"] for x in (a, b) for s in seeds if x[s]["resolution"] is not None]
    res = max(widths) if widths else 0.0
    st = goal(ratios.values(), 1.0)
    tally = {v: sum(1 for x in per_seed.values() if x == v) for v in ("win", "tie", "loss")}
    out = {"per_seed": per_seed, "tally": tally, "ratio_mean": st["mean"], "ratio_se": st["se"],
           "ratio_min": min(ratios.values()) if ratios else None,
           "ratio_max": max(ratios.values()) if ratios else None, "resolution": res, "seeds": list(seeds)}
    if st["n"] >= MIN_SEEDS and len(ratios) == len(seeds):
        margin = max(st["se"], res)
        m = st["mean"]
        out.update(margin=margin, verdict="win" if m - 1.0 > margin else "loss" if 1.0 - m > margin else "tie",
                   basis=f"mean paired ratio beyond max(seed se, resolution) over {len(seeds)} seeds")
    else:
        verdict = "win" if tally["win"] == len(seeds) else "loss" if tally["loss"] == len(seeds) else "tie"
        out.update(margin=None, verdict=verdict,
                   basis=f"per seed only ({len(seeds)} seeds: too few for a seed spread, or a system met no load)")
    return out


def verdicts(out: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per SLO: the first system against each other one, on ``--seeds`` and apart on the held-out seeds."""
    systems = list(out["systems"])
    res = []
    for k, slo in enumerate(out["slos"]):
        a = out["systems"][systems[0]]["by_slo"][k]["goodput"]["per_seed"]
        vs = {}
        for other in systems[1:]:
            b = out["systems"][other]["by_slo"][k]["goodput"]["per_seed"]
            vs[other] = {"seeds": compare(a, b, out["seeds"])}
            if out["held_out_seeds"]:
                vs[other]["held_out"] = compare(a, b, out["held_out_seeds"])
        res.append({"slo": slo, "system": systems[0], "vs": vs})
    return res


# ------------------------------------------------------------------------------------------------ text
def _g(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def _verdict_cell(c: Dict[str, Any]) -> str:
    t = c["tally"]
    ratio = "" if c["ratio_mean"] is None else f", ratio {c['ratio_mean']:.3f}"
    rng = "" if c["ratio_min"] is None else f" ({c['ratio_min']:.3f}-{c['ratio_max']:.3f})"
    return f"{c['verdict']}{ratio}{rng}, seeds {t['win']}/{t['tie']}/{t['loss']}"


def _slo_table(out: Dict[str, Any], k: int) -> str:
    at = out["search"]["at"]
    mean_rps = out["demand"]["mean_rps"]
    held = out["held_out_seeds"]
    head = ["system", "goodput x (min / mean / max)", "resolution", "req/s at mean"]
    head += [f"held-out x ({','.join(map(str, held))})"] if held else []
    rows = [head + [f"attainment at x{at:g}", f"P99 TTFT at x{at:g}"]]
    for s, sysd in out["systems"].items():
        e = sysd["by_slo"][k]
        g, a = e["goodput"], e["attainment_at"]
        res = g["resolution"]
        row = [s, f"{g['min']:g} / {g['mean']:.3g} / {g['max']:g}", "-" if res is None else f"{res:.1%}",
               f"{g['mean'] * mean_rps:.1f}"]
        if held:
            row.append(" / ".join(f"{g['per_seed'][x]['goodput_multiplier']:g}" for x in held))
        p99 = a["p99_ttft_s_per_seed"]
        row += [f"{min(a['per_seed']):.2%}-{max(a['per_seed']):.2%}",
                "inf" if any(v is None for v in p99) else f"{max(p99):.3f} (worst seed)"]
        rows.append(row)
    return text_table(rows)


def _verdict_table(out: Dict[str, Any], k: int) -> str:
    v = out["verdicts"][k]
    held = out["held_out_seeds"]
    rows = [["against", f"seeds {','.join(map(str, out['seeds']))}", "se", "margin"]
            + ([f"held-out {','.join(map(str, held))}"] if held else [])]
    for other, c in v["vs"].items():
        m = c["seeds"]
        rows.append([other, _verdict_cell(m), _g(m["ratio_se"]), _g(m["margin"])]
                    + ([_verdict_cell(c["held_out"])] if held else []))
    return (f"{v['system']} against each (goodput ratio {v['system']} / other, paired by seed; seeds w/t/l: the "
            f"seeds whose brackets are apart, win / tie / loss; a verdict over >= 4 seeds needs the mean ratio "
            f"beyond max(se, resolution), over fewer a win or loss on every seed):\n" + text_table(rows))


def _curve_table(sysd: Dict[str, Any], k: int, seeds: Sequence[int], at: float) -> str:
    ms = sorted({float(m) for s in seeds for m in sysd["by_slo"][k]["goodput"]["per_seed"][s]["tried"]} | {at})
    pts = {s: {p["multiplier"]: p for p in sysd["curve"][s]} for s in seeds}
    rows = [["x"] + [f"seed {s}" for s in seeds]]
    for m in ms:
        row = [f"{m:g}"]
        for s in seeds:
            p = pts[s].get(m)
            if p is None:
                row.append("-")
                continue
            p99, att = p["p99_ttft_s"], p["attainment"][k]
            row.append(("inf" if p99 is None else f"{p99:.3f}") + f" {att:.2%}" + ("" if p["meets"][k] else " x"))
        rows.append(row)
    return text_table(rows)


def format_goodput(out: Dict[str, Any], attribute: bool = False) -> str:
    seeds = out["seeds"] + out["held_out_seeds"]
    held = f" (held out: {','.join(map(str, out['held_out_seeds']))})" if out["held_out_seeds"] else ""
    sr = out["search"]
    text = (f"goodput: demand {out['demand']['source']} (mean {out['demand']['mean_rps']:.1f} req/s at x1), replicas "
            f"{','.join(f'{r}={n}' for r, n in out['replicas'].items())}, {out['profile']}, "
            f"{' | '.join(out['slo_texts'])}, seeds {','.join(map(str, out['seeds']))}{held}\n"
            f"{out['compression']['note']}\nsearch per seed and SLO: x{sr['start']:g}, doubled (or halved) to a "
            f"bracket, then {sr['bisect_steps']} bisections on a 3-digit grid; resolution: the widest final "
            f"bracket, first fail / goodput - 1")
    for k, slo_text in enumerate(out["slo_texts"]):
        text += f"\n\n== {slo_text} ==\n{_slo_table(out, k)}"
        if len(out["systems"]) > 1:
            text += "\n\n" + _verdict_table(out, k)
        if attribute:
            from .attribution import attribution_rows

            att = {s: d["by_slo"][k]["attribution_at"] for s, d in out["systems"].items()}
            text += (f"\n\nwhere the requests lost at x{sr['at']:g} spent their TTFT (summed over seeds; lost: TTFT "
                     "over the SLO, missed: no first token by the cut-off; answered: first token came, "
                     "decoding ones included; sim/attribution.py):\n")
            text += text_table(attribution_rows(att))
    if len(out["slos"]) > 1:
        rows = [["system"] + out["slo_texts"]]
        for s, d in out["systems"].items():
            rows.append([s] + [("none" if e["goodput"]["max"] == 0 else
                                f"{e['goodput']['mean']:.3g} ({e['goodput']['min']:g}-{e['goodput']['max']:g})")
                               for e in d["by_slo"]])
        text += f"\n\ngoodput x per system per SLO (mean (min-max) over seeds {','.join(map(str, out['seeds']))}):\n"
        text += text_table(rows)
    for k, slo_text in enumerate(out["slo_texts"]):
        text += (f"\n\ncurves at {slo_text}: P99 TTFT (s) and attainment per seed at each multiplier its search "
                 f"ran (x: misses the SLO, over all requests or one region's; -: not run on that seed)")
        for s, d in out["systems"].items():
            text += f"\n{s}:\n{_curve_table(d, k, seeds, sr['at'])}"
    return text


# ------------------------------------------------------------------------------------------------ plot
def plot_goodput(out: Dict[str, Any], path: str) -> str:
    """P99 TTFT (log) and attainment against the multiplier, per SLO (rows), per system (colours), per seed
    (one line each; held-out seeds dashed); the SLO as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(out["slos"])
    fig, axes = plt.subplots(n, 2, figsize=(11, 3.3 * n), squeeze=False)
    held = set(out["held_out_seeds"])
    for k, slo in enumerate(out["slos"]):
        ax_p, ax_a = axes[k]
        for i, (s, d) in enumerate(out["systems"].items()):
            for j, (seed, pts) in enumerate(sorted(d["curve"].items())):
                xs = [p["multiplier"] for p in pts]
                ls = "--" if seed in held else "-"
                label = s if j == 0 else None
                ax_p.plot(xs, [p["p99_ttft_s"] if p["p99_ttft_s"] is not None else float("nan") for p in pts],
                          ls=ls, marker=".", color=f"C{i}", lw=0.9, alpha=0.8, label=label)
                ax_a.plot(xs, [p["attainment"][k] for p in pts], ls=ls, marker=".", color=f"C{i}", lw=0.9,
                          alpha=0.8, label=label)
        ax_p.axhline(slo["ttft_s"], color="k", lw=0.8, ls=":")
        ax_p.set_yscale("log")
        ax_p.set_ylabel("P99 TTFT (s)")
        ax_a.set_ylabel(f"attainment at {out['slo_texts'][k]}")
        for ax in (ax_p, ax_a):
            ax.set_xlabel("load multiplier")
            ax.grid(alpha=0.3)
        ax_p.set_title(out["slo_texts"][k], fontsize=9)
        ax_p.legend(fontsize=7)
    fig.suptitle(f"goodput curves: {out['demand']['source']}, replicas "
                 f"{','.join(f'{r}={c}' for r, c in out['replicas'].items())}; "
                 f"{out['compression']['note']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ timing
def estimate_wall_s(rounds: Sequence[dict], cores: int) -> float:
    """The wall time a lockstep search of these rounds (``goodput.run_lockstep``'s ``timing["rounds"]``)
    would take on ``cores`` workers (``--ray`` / ``--address``): each round waits for its last run, so it
    lasts at least its longest run and at least its runs' seconds spread over the cores; the estimate is
    the sum over rounds of the larger. It ignores Ray's start-up and scheduling and assumes each run takes
    as long there as it did where it was measured (on a loaded machine, longer than on an idle one)."""
    return sum(max(r["longest_run_s"], r["run_s"] / cores) for r in rounds)


def _sum_searches(per: Dict[str, dict], names: Sequence[str]) -> Dict[str, Any]:
    got = [per[n] for n in names if n in per]
    return {"runs": sum(g["runs"] for g in got), "run_s": sum(g["run_s"] for g in got)}


def timing_summary(timing: Dict[str, Any], per_system: Dict[str, Dict[str, Sequence[str]]],
                   shared: Optional[Dict[str, Sequence[str]]] = None) -> Dict[str, Any]:
    """The JSON of what a command cost, from a ``run_lockstep`` ``timing`` dict. ``per_system``: per system,
    named parts (``{"search": [search names], ...}``), each summed to its runs and run seconds;
    ``shared``: the searches no single system owns (one replica's capacity, the sum-of-peaks reference)."""
    import os

    per, rounds = timing.get("searches", {}), timing.get("rounds", [])
    return {
        "note": "wall seconds (vary with the machine and its load; not part of the result): run_s sums each "
                "run's own wall clock where it ran; estimate_wall_s: the sum over lockstep rounds of the longer "
                "of the round's longest run and its run seconds / cores, Ray's overhead left out",
        "wall_s": timing.get("wall_s"), "cores_here": os.cpu_count(), "rounds": len(rounds),
        "runs": sum(r["runs"] for r in rounds), "run_s": sum(r["run_s"] for r in rounds),
        "estimate_wall_s": {str(c): estimate_wall_s(rounds, c) for c in ESTIMATE_CORES},
        "per_system": {s: {part: _sum_searches(per, names) for part, names in parts.items()}
                       for s, parts in per_system.items()},
        "shared": {k: _sum_searches(per, names) for k, names in (shared or {}).items()},
    }


def _parts(d: Dict[str, dict]) -> str:
    return ", ".join(f"{k} {v['run_s']:.1f} s in {v['runs']} runs" for k, v in d.items())


def format_timing(t: Dict[str, Any], head: str) -> str:
    """Lines for stderr: ``head``, the wall time, each system's parts, the shared searches and the estimates."""
    lines = [f"{head}: {t['wall_s']:.1f} s wall on {t['cores_here']} cores, {t['runs']} runs in {t['rounds']} "
             f"rounds ({t['run_s']:.1f} s of runs); wall per system (its runs' own wall clock, summed):"]
    width = max([len(s) for s in t["per_system"]] + [6])
    lines += [f"  {s:<{width}}  {_parts(d)}" for s, d in t["per_system"].items()]
    if t["shared"]:
        lines.append(f"  {'shared':<{width}}  {_parts(t['shared'])}")
    est = ", ".join(f"{c} cores about {v:.1f} s" for c, v in t["estimate_wall_s"].items())
    lines.append(f"  estimated wall through --ray/--address: {est} (per round the longer of its longest run and "
                 "its run seconds / cores)")
    return "\n".join(lines)
