"""GeoPrefix with and without the TTFT-SLO guard (``TwoLayerConfig.ttft_slo_s``, ``policy/region/slo_guard.py``),
side by side at fixed deployments on the planner's day, judged by the planner's own ``slo_run``.

Each cell is ``rps@slo=us:n,eu:n,asia:n``; both variants run every seed of every cell. Printed per cell and
variant: lost requests per seed (TTFT over the SLO), the worst seed's P99 TTFT, whether every seed meets
the SLO, and the forwards made before saturation (seed mean). Seeds 0-3 are the tuning seeds, 4 and 5
held out.

    .venv/bin/python benchmarks/bench_slo_guard.py --seeds 0,1,2,3,4,5 \\
        --cells "40@0.3=us:6,eu:5,asia:5;150@0.5=us:2,eu:4,asia:2"

About 20-35 s per run on an idle core of the development machine.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Tuple

from ray_geolb.sim.goodput import SLO, _judge, _tally, simulate_run
from ray_geolb.sim.plan import DEFAULT_PLAN_DAY_S, _base_run, _seeded
from ray_geolb.sim.workloads.geo_diurnal import load_demand

VARIANTS = {"shipped": None, "guard": "ttft_slo_s"}


def parse_cells(spec: str) -> List[Tuple[float, float, Dict[str, int]]]:
    """``"40@0.3=us:6,eu:5,asia:5;..."`` -> [(mean rps, SLO s, {region: replicas})]."""
    cells = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        head, _, reps = part.partition("=")
        rps, _, slo = head.partition("@")
        cells.append((float(rps), float(slo), {r: int(n) for r, n in (x.split(":") for x in reps.split(","))}))
    return cells


def run_cell(rps: float, slo_s: float, placement: Dict[str, int], seeds: List[int], demand: str, profile: str,
             variant: str) -> dict:
    slo = SLO(ttft_s=slo_s)
    deploy = {"two_layer": {"ttft_slo_s": slo_s}} if VARIANTS[variant] else None
    base = _base_run(f"slo-guard/{variant}", "geoprefix", placement, load_demand(demand, rps), DEFAULT_PLAN_DAY_S,
                     1.0, profile, slo, deploy=deploy)
    lost, p99, fbs, meets = [], [], [], []
    for s in seeds:
        spec, slos, hours_of, wl, res = simulate_run(_seeded(base, s))  # slo_run, keeping the decision counts
        m = _judge(spec, res, _tally(spec, wl, res, hours_of), slos[0])
        a = m["attribution"]
        lost.append(a["lost"] + a["missed"])
        p99.append(m["p99_ttft_s"] if m["p99_ttft_s"] is not None else float("inf"))
        meets.append(bool(m["meets"]))
        fbs.append(res.decisions.get("forward:cost_before_saturation", 0))
    return {"lost": lost, "p99_worst": max(p99), "meets_all": all(meets), "fbs_mean": sum(fbs) / len(fbs),
            "sent": m["sent"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", required=True, help="rps@slo=region:n,...;... (fixed placements)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--demand", default="geo-diurnal-3")
    ap.add_argument("--profile", default="llama3.1-8b-h100")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    print(f"demand {a.demand}, seeds {seeds}")
    print("| req/s | SLO s | GPUs | variant | lost per seed | lost, mean | worst P99 TTFT s | meets on every seed "
          "| forwards before saturation, mean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rps, slo_s, placement in parse_cells(a.cells):
        pl = "/".join(str(v) for v in placement.values())
        for variant in VARIANTS:
            c = run_cell(rps, slo_s, placement, seeds, a.demand, a.profile, variant)
            print(f"| {rps:g} | {slo_s:g} | {sum(placement.values())} ({pl}) | {variant} | "
                  f"{', '.join(str(x) for x in c['lost'])} | {sum(c['lost']) / len(seeds):.0f} of {c['sent']} | "
                  f"{c['p99_worst']:.3f} | {'yes' if c['meets_all'] else 'no'} | {c['fbs_mean']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
