"""``python -m ray_geolb simulate``: run the multi-region simulator from the command line.

Examples::

    python -m ray_geolb simulate --workload tot --policy skylb,ll,sgl --regions us=4,eu=4,asia=4 \\
        --duration 120 --out out/tot
    python -m ray_geolb simulate --scenario skylb-fig9 --out out/fig9
    python -m ray_geolb simulate --scenario skylb-fig8 --scale 0.5 --duration 60 --ray --out out/fig8
    python -m ray_geolb simulate --workload trace:ray_geolb/data/azure_conv_2000.csv --policy skylb,p2c --out out/trace

Writes ``DIR/results.json`` (sorted keys, rounded floats: byte-identical for the same seed),
``DIR/summary.txt`` (the table printed on stdout) and ``DIR/<name>.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List

from .sweep import add_runner_args, parse_seeds

__all__ = ["add_simulate_parser", "run_simulate", "main"]


def _names_help() -> str:
    from .deploy import system_names

    return ", ".join(system_names())


def add_simulate_parser(subparsers) -> argparse.ArgumentParser:
    from .scenarios import scenario_names
    from .workloads import WORKLOAD_NAMES

    sp = subparsers.add_parser(
        "simulate", help="multi-region discrete-event simulator (policies x workloads x scenarios)",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--scenario", choices=scenario_names(), default=None,
                    help="a named experiment (overrides --workload/--policy/--regions)")
    sp.add_argument("--systems", default=None,
                    help="with --scenario: comma-separated systems to run instead of the scenario's own")
    sp.add_argument("--workload", default="tot", help=f"workload: {', '.join(WORKLOAD_NAMES)} (default tot)")
    sp.add_argument("--policy", default="skylb",
                    help=f"comma-separated systems ({_names_help()}) or policy names (run on per-region LBs)")
    sp.add_argument("--regions", default="us=4,eu=4,asia=4", help="replicas per region, e.g. us=4,eu=4,asia=4")
    sp.add_argument("--region-by", choices=("row", "session", "prefix"), default=None,
                    help="--workload trace:PATH / shared-context-trace: map rows onto the regions with replicas by "
                         "row (dealt round-robin, the default), by session key or by the first distinct prefix block")
    sp.add_argument("--clients", default=None,
                    help="clients per region for closed-loop workloads, e.g. us=40,eu=20,asia=20")
    sp.add_argument("--seed", type=int, default=0, help="random seed (workload + simulator)")
    sp.add_argument("--seeds", default=None, help="comma-separated seeds (a sweep; overrides --seed)")
    sp.add_argument("--duration", type=float, default=None,
                    help="simulated seconds per run (default 120; scenarios have their own)")
    sp.add_argument("--max-programs", type=int, default=None, help="stop starting programs after this many")
    sp.add_argument("--drain", action="store_true", help="finish requests in flight at the end instead of cutting off")
    sp.add_argument("--warmup", type=float, default=None,
                    help="seconds the control plane (replica reports, heartbeats, RTT probes) runs before the first "
                         "request (default 5: SimConfig.warmup_s; 0 = a cold start)")
    sp.add_argument("--scale", type=float, default=None,
                    help="scenario size factor (clients and replicas); 1 = paper size")
    sp.add_argument("--profile", default=None, help="engine profile (default: the scenario's; SkyLB's Fig. 8/9/10 "
                                                     "run llama3.1-8b-l4-sglang; otherwise llama3.1-8b-l4)")
    sp.add_argument("--stats-period", type=float, default=None, help="replica stats period (s, default 0.5)")
    sp.add_argument("--stats-lag", type=float, default=None, help="replica stats delivery lag (s, default 0.3)")
    sp.add_argument("--heartbeat", type=float, default=None,
                    help="per-region LBs' heartbeat period through the registry (s, default 0.25: "
                         "REGION_LAYER.heartbeat_period_s)")
    sp.add_argument("--region-layer", default=None, metavar="FIELD=VALUE[,...]",
                    help="change REGION_LAYER fields for the per-region LBs, e.g. note_forwards=false,max_queue=64 "
                         "or a dotted path into a dict field: peer_selectors.geoprefix.cost.margin_s=0.1 "
                         "(policy/region/config.py: RegionLayerSettings)")
    sp.add_argument("--data-dir", default=None, help="directory with full data files (sharegpt / wildchat / gsm8k)")
    sp.add_argument("--out", default=None, help="output directory (results.json, summary.txt, PNG)")
    add_runner_args(sp)
    sp.set_defaults(func=run_simulate, _simulate_parser=sp)
    return sp


def _parse_counts(parser, flag: str, spec: str):
    from .deploy import parse_regions

    try:
        return parse_regions(spec)
    except ValueError as e:
        parser.error(f"{flag}: {e}")


def _build_runs(args, parser) -> List[dict]:
    """The run dicts the command line asks for (a named scenario, or systems x seeds on one workload);
    every bad argument is an argparse error naming the flag."""
    _check_numbers(args, parser)
    seeds = _seeds(args, parser)
    deploy_over = {k: v for k, v in (("profile", args.profile), ("stats_period_s", args.stats_period),
                                     ("stats_lag_s", args.stats_lag))
                   if v is not None and (k != "profile" or v)}
    layer = _region_layer(args, parser)
    if args.heartbeat is not None:  # the region layer's registry heartbeat (REGION_LAYER.heartbeat_period_s)
        layer["heartbeat_period_s"] = args.heartbeat
    if layer:
        deploy_over["region_layer"] = layer
    if args.scenario:
        return _scenario_runs(args, parser, seeds, deploy_over)
    return _workload_runs(args, parser, seeds, deploy_over)


def _region_layer(args, parser) -> dict:
    """``--region-layer f=v,...`` as RegionLayerSettings changes (values read as JSON: true, 64, 0.5;
    else a string); an unknown field or a bad value is an argparse error."""
    from ray_geolb.policy.region.config import REGION_LAYER, RegionLayerSettings, TwoLayerConfig

    out: dict = {}
    base = REGION_LAYER.model_dump()
    for part in (args.region_layer or "").split(","):
        if not part.strip():
            continue
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            parser.error(f"--region-layer: {part!r} is not FIELD=VALUE")
        try:
            val = json.loads(v)
        except ValueError:
            val = v.strip()
        path = k.strip().split(".")
        if len(path) == 1:
            out[path[0]] = val
            continue
        # a dotted path into a dict field, e.g. peer_selectors.geoprefix.cost.forwards_cap_peers=false
        node = out.setdefault(path[0], base.get(path[0]))
        if not isinstance(node, dict):
            parser.error(f"--region-layer: {path[0]!r} is not a dict field")
        for key in path[1:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                parser.error(f"--region-layer: {k.strip()!r} does not name a dict entry")
        node[path[-1]] = val
    try:
        settings = RegionLayerSettings.model_validate({**REGION_LAYER.model_dump(), **out})
        for policy in settings.peer_selectors:  # each selector's fields, as the LBs will build them
            TwoLayerConfig.model_validate({"region": "x", **settings.two_layer(policy)})
    except Exception as e:  # pydantic's message names the field
        parser.error(f"--region-layer: {e}")
    return out


def _check_numbers(args, parser) -> None:
    from ray_geolb.engine.profiles import PROFILES

    if args.duration is not None and not args.duration > 0:
        parser.error(f"--duration must be > 0, got {args.duration}")
    if args.max_programs is not None and args.max_programs < 1:
        parser.error(f"--max-programs must be >= 1, got {args.max_programs}")
    if args.profile is not None and args.profile not in PROFILES:
        parser.error(f"--profile: unknown engine profile {args.profile!r}; known: {', '.join(sorted(PROFILES))}")
    if args.scale is not None and not args.scale > 0:
        parser.error(f"--scale must be > 0, got {args.scale}")
    for flag, v in (("--stats-period", args.stats_period), ("--heartbeat", args.heartbeat)):
        if v is not None and not v > 0:
            parser.error(f"{flag} must be > 0, got {v}")
    if args.stats_lag is not None and args.stats_lag < 0:
        parser.error(f"--stats-lag must be >= 0, got {args.stats_lag}")
    if args.warmup is not None and not 0 <= args.warmup < float("inf"):
        parser.error(f"--warmup must be a finite number >= 0, got {args.warmup}")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        parser.error(f"--data-dir {args.data_dir!r} is not a directory")


def _seeds(args, parser) -> List[int]:
    if not args.seeds:
        return [args.seed]
    return parse_seeds(parser, args.seeds)


def _scenario_runs(args, parser, seeds: List[int], deploy_over: dict) -> List[dict]:
    from .scenarios import scenario_runs

    runs = []
    for seed in seeds:
        try:
            systems = [s.strip() for s in args.systems.split(",") if s.strip()] if args.systems else None
            rs = scenario_runs(args.scenario, scale=args.scale, duration_s=args.duration, seed=seed,
                               profile=args.profile, data_dir=args.data_dir, systems=systems)
        except ValueError as e:
            parser.error(f"--scenario {args.scenario}: {e}")
        for r in rs:
            r["deploy"].update(deploy_over)
            if args.max_programs:
                r["sim"]["max_programs"] = args.max_programs
            if args.drain:
                r["sim"]["drain"] = True
            if args.warmup is not None:
                r["sim"]["warmup_s"] = args.warmup
            if len(seeds) > 1:
                r["label"] = f"seed{seed}/{r['label']}"
        runs.extend(rs)
    return runs


def _systems(args, parser) -> List[str]:
    from ray_geolb.policy.factory import policy_names

    from .deploy import SYSTEMS

    systems = [s.strip() for s in args.policy.split(",") if s.strip()]
    if not systems:
        parser.error("--policy: no system given")
    known_pol = set(policy_names())
    for s in systems:
        if s not in SYSTEMS and s not in known_pol:
            parser.error(f"--policy: unknown system or policy {s!r}; systems: {_names_help()}; "
                         f"policies: {', '.join(sorted(known_pol))}")
    return systems


def _workload_kwargs(args, parser, replicas: dict, net_regions) -> dict:
    kw = {}
    wname = args.workload
    if args.clients:
        clients = _parse_counts(parser, "--clients", args.clients)
        bad = [r for r in clients if r not in net_regions]
        if bad:
            parser.error(f"--clients: unknown region(s) {bad}; the default network has {net_regions}")
        kw["clients"] = clients
    if wname.startswith("trace:"):
        path = wname.partition(":")[2]
        if not path or not os.path.exists(path):
            parser.error(f"--workload trace:PATH: file {path!r} not found")
        kw.pop("clients", None)
        kw["region_of"] = [r for r, n in replicas.items() if n > 0]
        if args.region_by:
            kw["region_by"] = args.region_by
    elif wname == "shared-context-trace":
        if "clients" in kw:
            parser.error("--clients does not apply to shared-context-trace (an open-loop trace)")
        kw["region_of"] = [r for r, n in replicas.items() if n > 0]
        if args.region_by:
            kw["region_by"] = args.region_by
    elif args.region_by:
        parser.error("--region-by applies to --workload trace:PATH and shared-context-trace only")
    if wname in ("prefix-repetition", "prefix_repetition"):
        kw.setdefault("num_replicas", sum(replicas.values()))
        if "clients" in kw:
            parser.error("--clients does not apply to prefix-repetition (its concurrency is 32 per replica)")
    return kw


def _workload_runs(args, parser, seeds: List[int], deploy_over: dict) -> List[dict]:
    from ray_geolb.engine.network import RegionNetwork

    from .scenarios import build_workload

    systems = _systems(args, parser)
    replicas = _parse_counts(parser, "--regions", args.regions)
    net_regions = RegionNetwork.default().regions
    bad = [r for r in replicas if r not in net_regions]
    if bad:
        parser.error(f"--regions: unknown region(s) {bad}; the default network has {net_regions}")
    kw = _workload_kwargs(args, parser, replicas, net_regions)
    wname = args.workload
    runs = []
    duration = args.duration if args.duration is not None else 120.0
    for seed in seeds:
        wspec = {"name": wname, "kw": dict(kw, seed=seed)}
        if args.data_dir:
            wspec["data_dir"] = args.data_dir
        try:  # validate the workload once, here, so a bad name is an argparse error
            if seed == seeds[0]:
                build_workload(wspec)
        except (ValueError, TypeError, OSError) as e:
            parser.error(f"--workload {wname!r}: {e}")
        for s in systems:
            runs.append({"label": (f"seed{seed}/{s}" if len(seeds) > 1 else s), "group": wname, "system": s,
                         "replicas": replicas, "workload": wspec,
                         "sim": {"duration_s": duration, "seed": seed, "max_programs": args.max_programs,
                                 "drain": bool(args.drain),
                                 **({} if args.warmup is None else {"warmup_s": args.warmup})},
                         "deploy": dict(deploy_over), "scenario": "simulate"})
    return runs


def run_simulate(args) -> int:
    from .metrics import dumps, summary_table
    from .sweep import run_many

    parser = getattr(args, "_simulate_parser", None) or argparse.ArgumentParser(prog="simulate")
    runs = _build_runs(args, parser)
    t0 = time.perf_counter()
    try:
        results = run_many(runs, ray=args.ray, address=args.address, progress=args.progress)
    except ValueError as e:  # a bad combination discovered while building a deployment
        parser.error(str(e))
    wall = time.perf_counter() - t0
    name = args.scenario or "simulate"
    tables = []
    groups: dict = {}
    for m in results:
        groups.setdefault(m.get("group", ""), []).append(m)
    for g, ms in groups.items():
        for m in ms:
            m["_row"] = m["label"].rsplit("/", 1)[-1]
        tables.append(f"== {name}: {g}\n" + summary_table(ms, label="_row"))
    for m in results:
        m.pop("_row", None)
    text = "\n\n".join(tables)
    print(text)
    sim_req = sum(m["counters"]["requests_completed"] for m in results)
    print(f"\n{len(results)} runs, {sim_req} simulated requests completed, {wall:.1f} s wall", file=sys.stderr)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            f.write(dumps({"scenario": name, "runs": results}))
        with open(os.path.join(args.out, "summary.txt"), "w") as f:
            f.write(text + "\n")
        try:
            from .plots import plot_summaries

            png = plot_summaries(results, os.path.join(args.out, f"{name}.png"), title=name)
            print(f"wrote {os.path.join(args.out, 'results.json')}, {png}", file=sys.stderr)
        except ImportError as e:  # matplotlib missing: results are still written
            print(f"no plot ({e})", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ray_geolb.sim.cli")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_simulate_parser(sub)
    args = ap.parse_args(["simulate", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
