"""Surviving the loss of a region: :func:`survive_region_loss`, the GPUs a system needs so that its SLO
still holds with any one region down through that region's peak hour (``plan --survive-region-loss``).

**The test of one placement.** Every region R in turn goes down for R's peak hour, on the plan's day
(``faults.peak_fault_run``: R's peak hour and one hour either side, each ``hour_s`` simulated seconds;
the outage is noticed ``detect_s`` after it starts, the same delay for every system: per-region systems'
clients then fail over to the nearest region whose LB is up, a central system's to its standby LB in
the region nearest the central one -- ``sim/faults.py`` says what each does). The placement
*survives R* when the requests first sent during the outage **after it was noticed** meet the SLO's
P99 TTFT on every seed. That is the degraded SLO: the requests sent while nobody had noticed yet wait
for the failover whatever the router does, so they are reported (their number and P99) and not judged.
P99 TPOT is not judged through an outage.

**The search.** Start from the plan's placement. While some region's loss is not survived, add one
replica to the region that lowers the worst loss's P99 most (every region but the lost one tried, on
that loss alone; ties: the lowest attainment, then the region order), then test every loss again, up to
``max_replicas`` in total. The answer is a placement that survives every single-region loss -- not
proven the fewest (the greedy adds, it never moves or removes).
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

from .faults import DETECT_S, fault_report, peak_fault_run
from .goodput import SLO, simulate_run
from .metrics import text_table

__all__ = ["DEFAULT_OUTAGE_HOUR_S", "add_survive_args", "format_survival", "outage_figures",
           "survive_plan", "survive_region_loss"]

#: simulated seconds per hour of the outage run (the plan's own day compresses an hour to a few seconds,
#: shorter than the detection delay)
DEFAULT_OUTAGE_HOUR_S = 60.0


def outage_figures(run: Dict[str, Any], progress: Optional[Callable[[float], None]] = None) -> Dict[str, Any]:
    """One outage run (a ``peak_fault_run`` dict + ``"slo"``) -> the figures it is judged by: ``p99_after``
    and ``attainment_after`` (requests first sent in the outage after it was noticed; None: infinite),
    ``sent_detecting`` / ``p99_detecting`` (before), ``lost`` (requests in flight when it began). A
    module-level function of the run alone (``run_many`` may ship it to a Ray worker)."""
    spec, slos, _hours, _wl, res = simulate_run(run, progress)
    slo = slos[0].ttft_s
    w = fault_report(res, (slo,))["windows"][0]
    after, before = w["after_detect"], w["detecting"]
    return {"label": run["label"], "p99_after": after["p99_ttft_s"], "sent_after": after["sent"],
            "attainment_after": after["by_slo"][f"{slo:g}"]["attainment"], "p99_detecting": before["p99_ttft_s"],
            "sent_detecting": before["sent"], "lost": w["lost"]}


def _worst(figs: List[dict]) -> dict:
    inf = math.inf
    p99 = max(inf if f["p99_after"] is None else f["p99_after"] for f in figs)
    att = min(f["attainment_after"] if f["attainment_after"] is not None else 0.0 for f in figs)
    det = max(inf if f["p99_detecting"] is None else f["p99_detecting"] for f in figs)
    return {"p99_after_s": p99, "attainment_after": att, "p99_detecting_s": det,
            "sent_detecting": sum(f["sent_detecting"] for f in figs), "lost": sum(f["lost"] for f in figs)}


def survive_region_loss(base_run: Callable[[Dict[str, int]], dict], placement: Dict[str, int], slo: SLO,
                        seeds: Sequence[int], *, max_replicas: int = 64, hour_s: float = DEFAULT_OUTAGE_HOUR_S,
                        detect_s: float = DETECT_S, run_many: Optional[Callable[[List[dict]], List[dict]]] = None
                        ) -> Dict[str, Any]:
    """The search of the module docstring from ``placement``. ``base_run(replicas)``: the plan's run dict
    (seed 0) of that placement. Returns ``{"replicas", "gpus", "survives", "added", "losses": {region:
    worst figures over seeds}, "steps"}``."""
    from .sweep import run_many as _run_many

    many = run_many or (lambda rs: _run_many(rs, progress=False, fn=outage_figures))
    regions = list(placement)

    def runs(reps, lost):
        out = []
        for s in seeds:
            r = peak_fault_run(_with_seed(base_run(reps), s), lost, "outage", hour_s=hour_s, detect_s=detect_s)
            r["slo"] = slo.to_dict()
            r["label"] = f"{r['label']}/outage-{lost}"
            out.append(r)
        return out

    def judge(reps, losses):
        rs = [r for lost in losses for r in runs(reps, lost)]
        figs = many(rs)
        k = len(seeds)
        return {lost: _worst(figs[i * k:(i + 1) * k]) for i, lost in enumerate(losses)}

    reps, steps = dict(placement), []
    while True:
        losses = judge(reps, regions)
        steps.append({"replicas": dict(reps), "losses": losses})
        failing = [r for r in regions if losses[r]["p99_after_s"] > slo.ttft_s]
        if not failing or sum(reps.values()) >= max_replicas:
            break
        worst = max(failing, key=lambda r: (losses[r]["p99_after_s"], -losses[r]["attainment_after"]))
        cands = [r for r in regions if r != worst]
        tried = {c: judge({**reps, c: reps[c] + 1}, [worst])[worst] for c in cands}
        best = min(cands, key=lambda c: (tried[c]["p99_after_s"], -tried[c]["attainment_after"], regions.index(c)))
        reps[best] += 1
    return {"replicas": reps, "gpus": sum(reps.values()), "survives": not failing,
            "added": sum(reps.values()) - sum(placement.values()), "losses": losses, "steps": steps,
            "hour_s": hour_s, "detect_s": detect_s}


def _with_seed(run: dict, seed: int) -> dict:
    r = {**run, "workload": {**run["workload"], "kw": {**run["workload"]["kw"], "seed": seed}},
         "sim": {**run["sim"], "seed": seed}}
    r["label"] = f"{run['label']}/seed{seed}"
    return r


# ------------------------------------------------------------------------------------------------ plan's side
def add_survive_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--survive-region-loss", action="store_true",
                    help="also give the GPUs each system needs to meet the SLO with any one region down "
                         "through its peak hour (requests sent after the outage is noticed are judged)")
    sp.add_argument("--outage-hour-s", type=float, default=DEFAULT_OUTAGE_HOUR_S,
                    help=f"simulated seconds per hour of an outage run (default {DEFAULT_OUTAGE_HOUR_S:g})")
    sp.add_argument("--detect-s", type=float, default=DETECT_S,
                    help=f"seconds before every system notices an outage and fails over (default {DETECT_S:g})")


def check_survive_args(parser: argparse.ArgumentParser, args) -> None:
    for flag, v in (("--outage-hour-s", args.outage_hour_s), ("--detect-s", args.detect_s)):
        if not (math.isfinite(v) and v > 0):
            parser.error(f"{flag} must be a finite number > 0, got {v}")
    if args.detect_s >= args.outage_hour_s:
        parser.error(f"--detect-s ({args.detect_s:g}) must be shorter than an outage hour "
                     f"(--outage-hour-s {args.outage_hour_s:g}): nothing would be judged")


def survive_plan(p: Dict[str, Any], base_run_of: Callable[[str, Dict[str, int]], dict], slo: SLO,
                 seeds: Sequence[int], args) -> Dict[str, Any]:
    """:func:`survive_region_loss` for every system of plan ``p`` that met its SLO, from its planned placement."""
    out = {}
    for row in p["systems"]:
        if not row.get("met") or not row.get("replicas"):
            continue
        out[row["system"]] = survive_region_loss(
            lambda reps, s=row["system"]: base_run_of(s, reps), row["replicas"], slo, seeds,
            max_replicas=args.max_replicas, hour_s=args.outage_hour_s, detect_s=args.detect_s)
    return out


def format_survival(p: Dict[str, Any], survival: Dict[str, Any]) -> str:
    regions = p["demand"]["regions"]
    head = ["system", "planned GPUs", *regions, "GPUs to survive", "survives"] + \
        [f"{r} down: P99 after noticed s" for r in regions]
    rows = [head]
    planned = {row["system"]: row for row in p["systems"]}
    for system, s in survival.items():
        line = [system, str(planned[system]["gpus"]), *[str(s["replicas"][r]) for r in regions], str(s["gpus"]),
                "yes" if s["survives"] else "NO"]
        line += [_s(s["losses"][r]["p99_after_s"]) for r in regions]
        rows.append(line)
    any_s = next(iter(survival.values()), None)
    note = "" if any_s is None else (
        f"\n(each region down through its peak hour, {any_s['hour_s']:g} simulated s an hour, noticed after "
        f"{any_s['detect_s']:g} s; judged: P99 TTFT of the requests sent after it was noticed, worst seed)")
    return f"surviving the loss of any one region at {p['slo_text']}:\n" + text_table(rows) + note


def _s(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.3f}"
