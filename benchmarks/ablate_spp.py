"""GeoPrefix's selective pushing, stealing and unreported-work cap, one at a time, on the goodput yardstick.

    python benchmarks/ablate_spp.py [--at 2.83] [--seeds 0,1,2,3] [--day-s 72]

Every variant is GeoPrefix (per-region LBs, the region layer as deployed) with one availability or
region-layer setting changed; each runs the built-in open-loop day (``geo-diurnal-3``, 2 replicas per
region, ``llama3.1-8b-h100``) at one rate multiplier per seed (``sim/goodput.py``'s ``slo_run``, P99 TTFT
<= 1 s) and prints, per variant and seed, whether the run meets the SLO, its P99 TTFT and how many
requests it lost (over the SLO or never answered), then each variant's lost time split by part
(``sim/attribution.py``) summed over the seeds. Local, one process; the same bytes every time.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ray_geolb.policy.region import GEOPREFIX_COST  # noqa: E402
from ray_geolb.sim.attribution import PARTS, merge  # noqa: E402
from ray_geolb.sim.deploy import register_system  # noqa: E402
from ray_geolb.sim.goodput import SLO, slo_run, tail_s  # noqa: E402
from ray_geolb.sim.metrics import text_table  # noqa: E402
from ray_geolb.sim.plan import load_demand  # noqa: E402

STRICT = {"max_burst": 32, "pending_allowance": 0}
#: name -> (availability overrides, two-layer overrides)
VARIANTS = {
    "strict SP-P (SkyLB: nothing waiting, 32/report)": (STRICT, {}),
    "strict + stealing": (STRICT, {"steal": {"enabled": True}}),
    "strict, 8/report": ({"max_burst": 8, "pending_allowance": 0}, {}),
    "strict, 128/report": ({"max_burst": 128, "pending_allowance": 0}, {}),
    "GeoPrefix now (allowance 8, 32/report)": ({}, {}),
    "allowance 8, 128/report": ({"max_burst": 128, "pending_allowance": 8}, {}),
    "now + stealing": ({}, {"steal": {"enabled": True}}),
    "now + cap 1 report": ({"prefill_budget_reports": 1}, {}),
    "now + cap 2 reports": ({"prefill_budget_reports": 2}, {}),
    "now, no forward before saturation": (
        {}, {"remote": "cost", "cost": {**GEOPREFIX_COST.model_dump(exclude_unset=True),
                                         "forward_before_saturation": False}}),
    "blind pushing (no SP-P)": ({"mode": "bp"}, {}),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--at", type=float, default=2.83, help="rate multiplier of the day (default 2.83)")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--day-s", type=float, default=72.0)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    slo = SLO(1.0)
    demand = load_demand("geo-diurnal-3", None)
    rows = [["variant"] + [f"seed {s}: met, P99 s / lost" for s in seeds]]
    att = {}
    for i, (name, (avail, two)) in enumerate(VARIANTS.items()):
        system = f"ablate-spp-{i}"  # registered in this process only (the runs are local)
        register_system(system, "per-region", {"name": "geoprefix", "availability": avail}, name, two_layer=two)
        cells, per = [], []
        for seed in seeds:
            run = {"label": name, "system": system,
                   "replicas": {"us": 2, "eu": 2, "asia": 2},
                   "workload": {"name": "geo-diurnal", "kw": {"curves": demand.to_kw(), "day_s": args.day_s,
                                                              "multiplier": args.at, "seed": seed}},
                   "sim": {"duration_s": args.day_s + tail_s(slo), "seed": seed},
                   "deploy": {"profile": "llama3.1-8b-h100"},
                   "slo": slo.to_dict()}
            r = slo_run(run)
            a = r["attribution"]
            p99 = "inf" if r["p99_ttft_s"] is None else f"{r['p99_ttft_s']:.2f}"
            cells.append(f"{'yes' if r['meets'] else 'NO'}, {p99} / {a['lost'] + a['missed']}")
            per.append(a)
        rows.append([name] + cells)
        att[name] = merge(per)
        print(f"{name}: {' | '.join(cells)}", file=sys.stderr, flush=True)
    print(f"GeoPrefix variants at x{args.at:g} of geo-diurnal-3 (2 replicas per region, llama3.1-8b-h100, "
          f"P99 TTFT <= 1 s, day {args.day_s:g} s), seeds {args.seeds}\n")
    print(text_table(rows))
    parts = [["variant", "lost (cross-region)", "missed"] + [f"{p} s (share)" for p in PARTS]]
    for name, a in att.items():
        tot = sum(a["lost_s"].values()) or 1.0
        parts.append([name, f"{a['lost']} ({a['lost_cross_region']})", str(a["missed"])]
                     + [f"{a['lost_s'][p]:.0f} ({a['lost_s'][p] / tot:.0%})" for p in PARTS])
    print("\nwhere the lost requests' time went (summed over the seeds):\n" + text_table(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
