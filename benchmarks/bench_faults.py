"""Attainment and goodput through a region outage and a partition, per system, on the built-in demand.

    python benchmarks/bench_faults.py [--systems geoprefix,region-local,sgl,ray-prefix] [--seeds 0,1,2,3]
        [--held-out-seeds 4,5] [--replicas us=2,eu=2,asia=2] [--hour-s 60] [--detect-s 10] [--slo 1]
        [--workers 2] [--registry-standbys eu] [--connect-failover-s 1] [--out benchmarks/results/faults]

Demand ``geo-diurnal-3`` (48 req/s mean, ``load_demand``), engine ``llama3.1-8b-h100``, the same replicas for every
system. Each scenario simulates one region's peak hour and the hour either side (``faults.peak_fault_run``: each
hour ``--hour-s`` simulated seconds, then a 20 s tail): the region down for its whole peak hour (an outage), or
cut off from the others for it (a partition), or nothing (the baseline of the same hours). Regions: ``eu`` (the
largest: peak 27.9 req/s at UTC 22) and ``us`` (home of the central LBs and of the per-region systems'
registry: peak 19.9 req/s at UTC 4). Every system notices a failure after the same ``--detect-s`` (clients
fail over to another region's LB, a central system to its standby in ``eu``; ``sim/faults.py``).
``--registry-standbys`` gives the per-region systems standby registries in those regions beside the primary
in us (``RegionLayerSettings.registry_standbys``; the header says so); by default they have the one registry.
``--connect-failover-s`` gives every system's clients a failover on a failed connect: a client that cannot reach
its LB tries the next one (the standby, or the nearest reachable region's LB) that long after its first failed
send -- a connect timeout, or an edge proxy that retries a failed connect elsewhere -- instead of waiting for the
health check (``Fault.connect_failover_s``; the header says so); by default none does.

Per (system, scenario, seed), for the requests first sent inside the fault hour: attainment at the TTFT SLO
``--slo`` (served within it / sent), the requests that missed it (sent - served within it), goodput (served
within it per simulated second), the attainment over the hour's last ``--steady-s`` seconds (what the system
settles to with the region gone), the fault region's own clients' attainment, the requests lost and the
sends that waited for a failover.

The clock is compressed (an hour is ``--hour-s`` s) but what follows a failure is not: the detection delay
and the drain of the requests that waited for it last as long in a real hour. So the "real hour" column
keeps the hour's first ``hour_s - steady_s`` seconds as simulated and stretches its last ``steady_s`` seconds
to the rest of a real hour: 1 - (missed in the first part + the steady part's miss rate x the hour's request
rate x (3600 - (hour_s - steady_s))) / (the hour's request rate x 3600). It assumes the transient is over by
the steady part (the timelines checked on seed 0 settle about 20 s after the fault began).

Verdicts: GeoPrefix against each other system on each scenario, per seed set -- a win or a loss when the
seeds' ranges (min..max) do not overlap, else a tie. Writes ``faults.json`` and ``faults.txt`` to ``--out``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from typing import Any, Dict, List

from ray_geolb.sim.deploy import SYSTEMS, parse_regions
from ray_geolb.sim.faults import peak_fault_run, window_figures
from ray_geolb.sim.metrics import dumps, text_table
from ray_geolb.sim.workloads.geo_diurnal import load_demand

SCENARIOS = [("eu", "none"), ("eu", "outage"), ("eu", "partition"), ("us", "none"), ("us", "outage"),
             ("us", "partition")]
PROFILE = "llama3.1-8b-h100"


def _runs(args) -> List[dict]:
    demand = load_demand("geo-diurnal-3")
    runs = []
    for region, kind in SCENARIOS:
        for system in args.systems:
            for seed in args.seeds + args.held_out:
                base = {"label": f"{region}-{kind}/{system}/{seed}", "system": system, "replicas": args.replicas,
                        "workload": {"name": "geo-diurnal", "kw": {**demand.workload_kw(), "seed": seed}},
                        "sim": {"duration_s": 1.0, "seed": seed}, "deploy": {"profile": PROFILE}}
                if args.standbys and system in SYSTEMS and SYSTEMS[system].lb_kind == "per-region":
                    base["deploy"]["region_layer"] = {"registry_standbys": list(args.standbys)}
                run = peak_fault_run(base, region, "outage" if kind == "none" else kind, hour_s=args.hour_s,
                                     detect_s=args.detect_s, connect_failover_s=args.connect_failover_s)
                if kind == "none":
                    del run["sim"]["faults"]
                run["meta"] = {"region": region, "kind": kind, "system": system, "seed": seed,
                               "detect_s": args.detect_s, "connect_failover_s": args.connect_failover_s,
                               "slo": args.slo, "steady_s": args.steady_s}
                runs.append(run)
    return runs


def one(run: Dict[str, Any]) -> Dict[str, Any]:
    """Simulate one run; its figures in the fault hour (the same hour for the baseline)."""
    from ray_geolb.sim.deploy import deployment_for
    from ray_geolb.sim.faults import peak_hour
    from ray_geolb.sim.run_spec import RunSpec
    from ray_geolb.sim.scenarios import build_workload
    from ray_geolb.sim.simulator import simulate

    run = dict(run)
    meta = run.pop("meta")
    spec = RunSpec.model_validate(run)
    wl = build_workload(spec.workload)
    t0 = time.perf_counter()
    res = simulate(wl, deployment_for(spec.system, spec.replicas, **spec.deploy), spec.sim)
    hour = spec.workload.kw["day_s"] / 24.0
    h0 = spec.workload.kw["hours"][0]
    s = (peak_hour(spec.workload.kw["curves"], meta["region"]) - h0) * hour
    e = s + hour
    td = s + min(meta["detect_s"], hour)
    ts = e - min(meta["steady_s"], hour)
    sent = {"all": 0, "detecting": 0, "after": 0, "transient": 0, "steady": 0, "region": 0}
    for t, prog in wl.open.arrivals:
        if s <= t < e:
            sent["all"] += 1
            sent["detecting" if t < td else "after"] += 1
            sent["transient" if t < ts else "steady"] += 1
            sent["region"] += prog.region == meta["region"]
    rows, slos = res.answered()[0], (meta["slo"],)  # by their first token, as fault_report
    c = res.counters
    return {**meta, "wall_s": time.perf_counter() - t0, "window": [s, e], "hour_s": hour,
            "all": window_figures(rows, s, e, sent["all"], slos),
            "detecting": window_figures(rows, s, td, sent["detecting"], slos),
            "after": window_figures(rows, td, e, sent["after"], slos),
            "transient": window_figures(rows, s, ts, sent["transient"], slos),
            "steady": window_figures(rows, ts, e, sent["steady"], slos),
            "region_clients": window_figures(rows, s, e, sent["region"], slos, region=meta["region"]),
            "lost": c.get("fault_lost", 0), "waits": c.get("fault_client_waits", 0),
            "call_failures": c.get("fault_call_failures", 0)}


def _att(r: dict, part: str) -> float:
    return r[part]["by_slo"][f"{r['slo']:g}"]["attainment"]


def _good(r: dict, part: str) -> float:
    return r[part]["by_slo"][f"{r['slo']:g}"]["goodput_rps"]


def _missed(r: dict, part: str) -> float:
    sent = r[part]["sent"]
    return sent * (1.0 - _att(r, part)) if sent else 0.0  # an empty part (--steady-s >= --hour-s) misses none


def _real_hour(r: dict) -> float:
    """The hour's attainment if its last ``steady_s`` seconds lasted the rest of a real hour (module docstring)."""
    rate = r["all"]["sent"] / r["hour_s"]
    first = r["hour_s"] - r["steady"]["t1"] + r["steady"]["t0"]
    steady_miss = 1.0 - _att(r, "steady") if r["steady"]["sent"] else 0.0
    missed = _missed(r, "transient") + steady_miss * rate * (3600.0 - first)
    return 1.0 - missed / (rate * 3600.0)


#: (header, value, kind): kind "%" / "%2" (a share, printed in % with 1 / 2 decimals), "n" (a count), "r" (a rate)
COLS = [("in hour %", lambda r: _att(r, "all"), "%"), ("missed", lambda r: _missed(r, "all"), "n"),
        ("steady %", lambda r: _att(r, "steady"), "%"), ("real hour %", _real_hour, "%2"),
        ("region's clients %", lambda r: _att(r, "region_clients"), "%"),
        ("goodput req/s", lambda r: _good(r, "all"), "r")]


def _spread(xs: List[float], kind: str) -> str:
    lo, hi, mean = min(xs), max(xs), sum(xs) / len(xs)
    f = {"%": lambda v: f"{100 * v:.1f}", "%2": lambda v: f"{100 * v:.2f}", "r": lambda v: f"{v:.1f}",
         "n": lambda v: f"{v:.0f}"}[kind]
    return f"{f(lo)}/{f(mean)}/{f(hi)}"


def _table(results: List[dict], seeds: List[int], args) -> str:
    rows = [["scenario", "system"] + [h for h, _, _ in COLS] + ["lost", "waited"]]
    for region, kind in SCENARIOS:
        for system in args.systems:
            rs = [r for r in results if (r["region"], r["kind"], r["system"]) == (region, kind, system)
                  and r["seed"] in seeds]
            rows.append([f"{region} {kind}", system]
                        + [_spread([fn(r) for r in rs], k) for _, fn, k in COLS]
                        + [_spread([float(r["lost"]) for r in rs], "n"), _spread([float(r["waits"]) for r in rs], "n")])
    return text_table(rows)


def _verdicts(results: List[dict], seeds: List[int], args) -> str:
    lines = []
    ours = "geoprefix"
    if ours not in args.systems:
        return ""
    for region, kind in SCENARIOS:
        if kind == "none":
            continue
        parts = []
        for other in args.systems:
            if other == ours:
                continue
            for h, fn, _ in (COLS[0], COLS[3]):
                a = [fn(r) for r in results if (r["region"], r["kind"], r["system"]) == (region, kind, ours)
                     and r["seed"] in seeds]
                b = [fn(r) for r in results if (r["region"], r["kind"], r["system"]) == (region, kind, other)
                     and r["seed"] in seeds]
                v = "win" if min(a) > max(b) else "loss" if max(a) < min(b) else "tie"
                parts.append(f"{other} ({h.rstrip(' %')}): {v}")
        lines.append(f"  {region} {kind}: " + "; ".join(parts))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--systems", default="geoprefix,region-local,sgl,ray-prefix")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--held-out-seeds", default="4,5")
    ap.add_argument("--replicas", default="us=2,eu=2,asia=2")
    ap.add_argument("--hour-s", type=float, default=60.0)
    ap.add_argument("--detect-s", type=float, default=10.0)
    ap.add_argument("--slo", type=float, default=1.0, help="P99 TTFT SLO (s) the attainment is judged at")
    ap.add_argument("--steady-s", type=float, default=20.0, help="the fault hour's last seconds taken as steady")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--registry-standbys", default="", help="regions of the per-region systems' standby registries")
    ap.add_argument("--connect-failover-s", type=float, default=None,
                    help="every system's clients try the next LB this long after a failed connect (default: they "
                         "wait for the health check's --detect-s)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    args.standbys = [r for r in args.registry_standbys.split(",") if r]
    args.systems = [s for s in args.systems.split(",") if s]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.held_out = [int(s) for s in args.held_out_seeds.split(",") if s]
    args.replicas = parse_regions(args.replicas)
    runs = _runs(args)
    t0 = time.perf_counter()
    results = []
    with mp.get_context("fork").Pool(args.workers) as pool:
        for i, r in enumerate(pool.imap(one, runs)):
            results.append(r)
            print(f"[{i + 1}/{len(runs)}] {runs[i]['label']}: {r['wall_s']:.1f} s", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    connect = ("" if args.connect_failover_s is None
               else f", and its clients try the next LB {args.connect_failover_s:g} s after a failed connect")
    head = (f"faults: demand geo-diurnal-3 (48 req/s mean), replicas "
            f"{','.join(f'{k}={v}' for k, v in args.replicas.items())} for every system, {PROFILE}; each scenario "
            f"is the region's peak hour and one hour either side, an hour = {args.hour_s:g} simulated s; the fault "
            f"covers the peak hour; detection delay {args.detect_s:g} s for every system{connect}; attainment at P99 "
            f"TTFT <= {args.slo:g} s of the requests sent in the fault hour (min/mean/max over seeds, %); goodput = "
            f"those within the SLO per simulated second; per-region systems' registries: us"
            f"{''.join(f' + a standby in {r}' for r in args.standbys)}; {len(runs)} runs, {wall:.0f} s wall")
    text = [head, "", f"seeds {','.join(map(str, args.seeds))}:", _table(results, args.seeds, args), "",
            "GeoPrefix against each (seeds' ranges apart = win/loss, else tie):",
            _verdicts(results, args.seeds, args)]
    if args.held_out:
        text += ["", f"held-out seeds {','.join(map(str, args.held_out))}:", _table(results, args.held_out, args), "",
                 "GeoPrefix against each, held-out seeds:", _verdicts(results, args.held_out, args)]
    out = "\n".join(text)
    print(out)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "faults.json"), "w") as f:
            f.write(dumps({"runs": results, "args": {k: v for k, v in vars(args).items()}}))
        with open(os.path.join(args.out, "faults.txt"), "w") as f:
            f.write(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
