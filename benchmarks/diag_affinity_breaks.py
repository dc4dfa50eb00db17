"""Why a region's routers send a request away from the replica that has most of it cached (a diagnostic, not a
comparison): every local dispatch of a GeoPrefix run in the simulator is classed against the engines' real
prefix caches at that moment, with the prompt tokens each break cost (the best replica's cached tokens less the
chosen one's):

* ``kept``: the chosen replica holds the most cached tokens of its region's replicas (ties included);
* ``best_unavailable``: the replica with the most was not available to this router when it decided (its share
  of that replica's reported headroom was used up);
* ``index_short``: it was available, but this router's prefix index matched less than ``min_match_chars`` there
  (the cost counts that as no match: e.g. a short first turn whose reply the engine cached too);
* ``priced_away``: available, matched at least ``min_match_chars``, and the cost chose another replica (its
  load terms outweighed the match);
* ``index_elsewhere``: available, and the index matched the chosen replica at least as long.

Runs the ``conversation`` workloads of ``bench_ingress_replicas.py`` (SkyLB Fig. 8's ShareGPT and WildChat
panels; ``--workloads`` names others, e.g. ``shared-context``; only local dispatches are classed), each N
with its routers sharing their inserts through the registry as Serve does.

    .venv/bin/python benchmarks/diag_affinity_breaks.py --seeds 1 --routers 1,8
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ingress_replicas as bench  # noqa: E402 - the workloads and the N-router deployment, one copy

from ray_geolb.policy.region import router as region_router  # noqa: E402
from ray_geolb.sim import region_lb  # noqa: E402
from ray_geolb.sim.deploy import deployment_for  # noqa: E402
from ray_geolb.sim.metrics import summarize  # noqa: E402
from ray_geolb.sim.run_spec import RunSpec  # noqa: E402
from ray_geolb.sim.scenarios import build_workload  # noqa: E402
from ray_geolb.sim.simulator import Simulator  # noqa: E402

CLASSES = ("kept", "best_unavailable", "index_short", "priced_away", "index_elsewhere")


def classify(run: dict) -> dict:
    """Simulate ``run`` with the decision and dispatch hooks; dispatches and lost tokens per class."""
    spec = RunSpec.model_validate({k: v for k, v in run.items() if k not in ("slo", "hour_s")})
    sim = Simulator(build_workload(spec.workload), deployment_for(spec.system, spec.replicas, **spec.deploy),
                    spec.sim)
    available_at_decision = {}
    count, lost = collections.Counter(), collections.Counter()
    decide, apply = region_router.RegionRouter.decide, region_lb.RegionLB._apply

    def hooked_decide(self, req, now, candidates=None):
        available_at_decision[id(req)] = set(self.local.tracker.available)
        return decide(self, req, now, candidates)

    def hooked_apply(self, req, d):
        if d.kind == "local":
            cached = {rep.id: rep.engine.cached_prefix_tokens(req.hashes)
                      for rep in sim.replicas.values() if rep.region == self.region}
            best = max(cached, key=cached.get)
            if cached[d.target] == cached[best]:
                cls = "kept"
            elif best not in available_at_decision.get(id(req.rreq), ()):
                cls = "best_unavailable"
            else:
                pol = self.policy
                match = pol.index.match(req.rreq.prepared_for(pol.index))
                if match.get(d.target, 0) >= match.get(best, 0):
                    cls = "index_elsewhere"
                else:
                    cls = "index_short" if match.get(best, 0) < pol.config.min_match_chars else "priced_away"
            count[cls] += 1
            lost[cls] += cached[best] - cached[d.target]
        available_at_decision.pop(id(req.rreq), None)
        return apply(self, req, d)

    region_router.RegionRouter.decide, region_lb.RegionLB._apply = hooked_decide, hooked_apply
    try:
        res = sim.run()
    finally:
        region_router.RegionRouter.decide, region_lb.RegionLB._apply = decide, apply
    return {"hit": summarize(res)["prefix_hit_rate"], "count": count, "lost": lost,
            "query_tokens": (res.ideal or {}).get("query_tokens")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--routers", default="1,8")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workloads", default="conversation", help="of bench_ingress_replicas.py's: conversation, "
                                                                "shared-context, geo-diurnal")
    for flag, default in (("--demand", "geo-diurnal-3"), ("--diurnal", "us:2,eu:2,asia:2"), ("--mean-rps", 40.0),
                          ("--day-s", 24.0), ("--profile", "llama3.1-8b-h100"), ("--slo", 1.0)):
        ap.add_argument(flag, default=default, type=type(default), help="as bench_ingress_replicas.py's")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    ns = [int(n) for n in args.routers.split(",")]
    print("| workload | seed | N | hit rate | " + " | ".join(f"{c}: dispatches / tokens lost" for c in CLASSES) + " |")
    print("|---|---|---|---|" + "---|" * len(CLASSES))
    for seed in seeds:
        for base in (b for w in args.workloads.split(",") for b in bench.workload_runs(w, seed, args)):
            for n in ns:
                r = classify(bench.with_routers(base, n, False, "registry" if n > 1 else None))
                cells = " | ".join(f"{r['count'][c]} / {r['lost'][c]}" for c in CLASSES)
                print(f"| {base['label'].split('/')[0]} | {seed} | {n} | {r['hit']:.3f} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
