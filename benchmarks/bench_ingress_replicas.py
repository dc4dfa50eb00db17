"""Several routers per region in the simulator (``DeploymentSpec.ingress_replicas``): what a region loses
when its traffic is split over N ingress replicas, each with its own prefix tree, hold queue and a 1/N
share of every replica's reported headroom.

For each N (default 1, 2, 4, 8), on three workloads, each seed:

* ``conversation``: SkyLB Fig. 8's ShareGPT and WildChat conversation panels (``scenarios.py`` ``skylb-fig8``);
* ``shared-context``: the RAG clients and the dealt trace of ``scenarios.py`` ``shared-context``;
* ``geo-diurnal``: the planner's day (``geo-diurnal-3``, or another demand: ``--demand``) at a fixed
  deployment (``--diurnal``);
* ``held-tot``: the stealing tests' setting (Tree-of-Thoughts clients all in us, one replica per region, a
  replica granted at most 2 requests per report, forwards only at saturation): us holds requests, so with
  ``--steal`` the idle regions steal and a hand-over can reach the wrong router;

all GeoPrefix.

Printed per workload and N: the prefix-cache hit rate (tokens the engines found cached over prompt tokens),
P99 TTFT, throughput, forwards, and steal hand-overs that reached a sibling of the router that made the
offer, refused there (``--router-offers``: offers per router) or taken there (the region's offers, the
default) (0 unless ``--steal``). With ``--share``, each N > 1 also with its routers sharing their prefix
inserts at the given delays (``DeploymentSpec.sibling_inserts_s``), or as Serve does, through the registry
with the heartbeats (``--share registry``: ``DeploymentSpec.share_sibling_inserts``). With ``--goodput`` also
the SLO goodput of the geo-diurnal deployment (``sim/goodput.py``: the largest rate multiplier whose P99 TTFT
meets ``--slo`` on every seed) for N = 1 and the largest N (and the largest N sharing, with ``--share``).

    .venv/bin/python benchmarks/bench_ingress_replicas.py --seeds 0,1,2,3
    .venv/bin/python benchmarks/bench_ingress_replicas.py --seeds 0,1 --only geo-diurnal --goodput

A request reaches one of its region's routers uniformly at random (Ray's proxy picks by two random choices
on the ingress replicas' in-flight counts; not modelled).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import Dict, List, Tuple, Union

from ray_geolb.policy.region import GEOPREFIX_COST
from ray_geolb.sim.goodput import SLO, goodput_many
from ray_geolb.sim.plan import _base_run, _seeded
from ray_geolb.sim.scenarios import run_one, scenario_runs
from ray_geolb.sim.workloads.geo_diurnal import load_demand

#: --router-offers (set by main): steal offers per router, as before the region's offers
ROUTER_OFFERS = False
WORKLOADS = ("conversation", "shared-context", "geo-diurnal", "held-tot")


def parse_placement(spec: str) -> Dict[str, int]:
    return {r: int(n) for r, n in (x.split(":") for x in spec.split(","))}


def workload_runs(name: str, seed: int, args) -> List[dict]:
    """The GeoPrefix runs of one workload at one seed (labels name the sub-workload)."""
    if name == "conversation":
        return [r for r in scenario_runs("skylb-fig8", scale=args.scale, duration_s=args.duration_s, seed=seed,
                                         systems=["geoprefix"]) if r["group"].startswith("conv-")]
    if name == "shared-context":
        return [r for r in scenario_runs("shared-context", scale=args.scale, duration_s=args.duration_s, seed=seed)
                if r["system"] == "geoprefix"]
    if name == "held-tot":  # the stealing tests' setting: us holds requests, eu and asia are idle
        cost = {**GEOPREFIX_COST.model_dump(exclude_unset=True), "forward_before_saturation": False}
        return [{"label": f"held-tot/geoprefix/seed{seed}", "group": "held-tot", "system": "geoprefix",
                 "replicas": {"us": 1, "eu": 1, "asia": 1},
                 "workload": {"name": "tot", "kw": {"branching": 2, "clients": {"us": 48, "eu": 0, "asia": 0},
                                                    "seed": seed}},
                 "sim": {"duration_s": args.duration_s, "seed": seed},
                 "deploy": {"policy": {"name": "geoprefix", "availability": {"max_burst": 2}},
                            "two_layer": {"remote": "cost", "cost": cost}}}]
    return [_seeded(diurnal_run(args, f"{_demand_label(args)}/geoprefix"), seed)]


def diurnal_run(args, label: str, multiplier: float = 1.0) -> dict:
    """The geo-diurnal deployment's GeoPrefix run (unseeded) at the day's rate ``multiplier``, with ``--cost``'s
    settings if any."""
    deploy = None
    if args.cost:  # GeoPrefix's cost selector with some settings changed (a probe; the shipped ones otherwise)
        deploy = {"two_layer": {"remote": "cost",
                                "cost": {**GEOPREFIX_COST.model_dump(exclude_unset=True), **json.loads(args.cost)}}}
    return _base_run(label, "geoprefix", parse_placement(args.diurnal), load_demand(args.demand, args.mean_rps),
                     args.day_s, multiplier, args.profile, SLO(ttft_s=args.slo), deploy=deploy)


def _demand_label(args) -> str:
    return "geo-diurnal" if args.demand == "geo-diurnal-3" else args.demand


def with_routers(run: dict, n: int, steal: bool, share_s: Union[None, float, str] = None, pool: bool = False) -> dict:
    r = copy.deepcopy(run)
    dep = r.setdefault("deploy", {})
    dep["ingress_replicas"] = n
    if share_s == "registry" and n > 1:  # as Serve shares them: rows with the heartbeats, through the registry
        dep["share_sibling_inserts"] = True
    elif share_s is not None and n > 1:
        dep["sibling_inserts_s"] = share_s
    if pool and n > 1:
        dep["sibling_headroom"] = True
    if steal:
        dep.setdefault("two_layer", {})["steal"] = {"enabled": True}
    if ROUTER_OFFERS:
        dep["region_wide_offers"] = False
    return r


def _shared(share) -> str:
    return "" if share is None else ", shared via the registry" if share == "registry" else f", shared {share:g} s"


def measure(run: dict) -> dict:
    out = run_one({k: v for k, v in run.items() if k not in ("slo", "hour_s")})  # the goodput search's keys
    c = out["counters"]
    return {"hit": out["prefix_hit_rate"], "p99": out["ttft_s"]["p99"], "rps": out["throughput_rps"],
            "forwards": c.get("forwards", 0), "done": c.get("requests_completed", 0),
            "sibling_refused": out["decisions"].get("steal_refused_at_a_sibling_router", 0),
            "sibling_taken": out["decisions"].get("steal_taken_at_a_sibling_router", 0),
            "steals_handed": c.get("steals_handed", 0)}


def _ratio(x: float, base: float) -> str:
    return f"{x / base:.3f}" if base else "-"  # a demand with no prefix to share has no hit rate to compare


def _fmt(xs: List[float], nd: int = 3) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.{nd}f} [{min(xs):.{nd}f}-{max(xs):.{nd}f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routers", default="1,2,4,8", help="routers per region to compare")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--only", default=",".join(WORKLOADS), help=f"workloads, of {', '.join(WORKLOADS)}")
    ap.add_argument("--scale", type=float, default=1.0, help="the scenarios' scale (clients and replicas)")
    ap.add_argument("--duration-s", type=float, default=60.0, help="the scenarios' simulated seconds")
    ap.add_argument("--diurnal", default="us:2,eu:2,asia:2", help="the geo-diurnal deployment")
    ap.add_argument("--mean-rps", type=float, default=40.0, help="the geo-diurnal day's mean req/s")
    ap.add_argument("--day-s", type=float, default=24.0, help="the geo-diurnal day's simulated seconds")
    ap.add_argument("--profile", default="llama3.1-8b-h100")
    ap.add_argument("--slo", type=float, default=1.0, help="P99 TTFT SLO (s) of the goodput search")
    ap.add_argument("--steal", action="store_true", help="with work stealing on (TwoLayerConfig.steal)")
    ap.add_argument("--goodput", action="store_true", help="also the geo-diurnal goodput at N=1 and the largest N")
    ap.add_argument("--bisect-steps", type=int, default=5)
    ap.add_argument("--demand", default="geo-diurnal-3", help="the geo-diurnal workload's demand (sim/workloads/"
                                                              "geo_diurnal.py: geo-diurnal-3, geo-workday-3, "
                                                              "azure-bursty-3)")
    ap.add_argument("--goodput-shared-only", action="store_true", help="the goodput search without the largest N "
                                                                       "with separate trees")
    ap.add_argument("--share", default="", help="also each N > 1 with its routers sharing their prefix "
                                                "inserts: at these fixed delays (s, comma-separated; "
                                                "DeploymentSpec.sibling_inserts_s) and/or 'registry' (as Serve: "
                                                "with the heartbeats; DeploymentSpec.share_sibling_inserts)")
    ap.add_argument("--pool", action="store_true", help="also each shared variant with its routers lending each "
                                                       "other unused slots at once (DeploymentSpec.sibling_headroom)")
    ap.add_argument("--router-offers", action="store_true", help="steal offers per router, refused at a sibling "
                                                                "(DeploymentSpec.region_wide_offers=False)")
    ap.add_argument("--cost", default="", help="the geo-diurnal runs with these GeoPrefix cost-selector settings "
                                               "changed (JSON, e.g. '{\"forward_hysteresis\": 1.0}'; "
                                               "CostSelectorConfig), the shipped ones otherwise")
    ap.add_argument("--json", default=None, help="write every measurement here")
    args = ap.parse_args(argv)
    global ROUTER_OFFERS
    ROUTER_OFFERS = args.router_offers
    routers = [int(x) for x in args.routers.split(",")]
    shares = [x.strip() if x.strip() == "registry" else float(x) for x in args.share.split(",") if x.strip()]
    variants: List[Tuple[int, Union[None, float, str], bool]] = [(n, None, False) for n in routers]
    variants += [(n, d, False) for d in shares for n in routers if n > 1]
    if args.pool:
        variants += [(n, d, True) for d in shares or [None] for n in routers if n > 1]
    seeds = [int(x) for x in args.seeds.split(",")]
    names = [w for w in args.only.split(",") if w]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or any(n < 1 for n in routers):
        ap.error(f"unknown workload {bad} (known: {', '.join(WORKLOADS)}) or a router count below 1")
    rows: Dict[str, Dict[str, List[dict]]] = {}
    t0 = time.time()
    for name in names:
        for seed in seeds:
            for base in workload_runs(name, seed, args):
                for n, share, pool in variants:
                    m = measure(with_routers(base, n, args.steal, share, pool))
                    key = f"{n}" + _shared(share) + (", pooled" if pool else "")
                    rows.setdefault(base["label"].split("/seed")[0], {}).setdefault(key, []).append(m)
                    print(f"  {base['label']} N={key}: {json.dumps(m)}", file=sys.stderr, flush=True)
    print(f"routers per region {routers}, seeds {seeds}{', stealing on' if args.steal else ''} "
          f"({time.time() - t0:.0f} s)")
    print("| workload | N | hit rate (mean [min-max] over seeds) | vs N=1 | P99 TTFT s | vs N=1 | throughput req/s "
          "| forwards | hand-overs refused / taken at a sibling |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, by_n in rows.items():
        base_hit = statistics.mean(m["hit"] for m in by_n[str(routers[0])])
        base_p99 = statistics.mean(m["p99"] for m in by_n[str(routers[0])])
        for n, ms in by_n.items():
            hit = statistics.mean(m["hit"] for m in ms)
            p99 = statistics.mean(m["p99"] for m in ms)
            print(f"| {label} | {n} | {_fmt([m['hit'] for m in ms])} | {_ratio(hit, base_hit)} | "
                  f"{_fmt([m['p99'] for m in ms])} | {_ratio(p99, base_p99)} | {_fmt([m['rps'] for m in ms], 2)} | "
                  f"{statistics.mean(m['forwards'] for m in ms):.0f} | "
                  f"{sum(m['sibling_refused'] for m in ms)} / {sum(m['sibling_taken'] for m in ms)} of "
                  f"{sum(m['steals_handed'] for m in ms)} |")
    out = {"rows": rows, "args": vars(args)}
    if args.goodput:
        run = diurnal_run(args, _demand_label(args))
        runs = {f"N={n}": with_routers(run, n, args.steal)
                for n in (routers[0], routers[-1]) if n == routers[0] or not args.goodput_shared_only}
        runs.update({f"N={routers[-1]}{_shared(d)}": with_routers(run, routers[-1], args.steal, d) for d in shares})
        if args.pool:
            runs.update({f"N={routers[-1]}{_shared(d)}, pooled": with_routers(run, routers[-1], args.steal, d, True)
                         for d in shares[:1]})
        t1 = time.time()
        res = goodput_many(runs, SLO(ttft_s=args.slo), seeds, bisect_steps=args.bisect_steps)
        print(f"\ngoodput at P99 TTFT <= {args.slo} s, {args.bisect_steps} bisections ({time.time() - t1:.0f} s):")
        for label, g in res.items():
            print(f"  {label}: {json.dumps({k: g[k] for k in g if k in ('goodput', 'per_seed', 'resolution')})}")
        out["goodput"] = res
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
