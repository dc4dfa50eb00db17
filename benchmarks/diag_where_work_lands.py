"""Where a day's prefill work lands, with one router per region and with N (a diagnostic, not a comparison).

    .venv/bin/python benchmarks/diag_where_work_lands.py --demand geo-workday-3 --multiplier 3.01 --seed 0 \
        --routers 1,8 --window 10,11.5

Runs ``bench_ingress_replicas.py``'s geo-diurnal deployment (2/2/2, 40 req/s on the 24-s day) of ``--demand`` at
one rate multiplier, each N with its routers sharing their inserts as Serve does (through the registry; ``--share``
for a fixed delay in seconds instead), and prints, per N:

* the prefix-hit rate of the requests served in their client's region and of those forwarded, per client region
  (prompt tokens the engines found cached over prompt tokens);
* for the requests sent inside ``--window``: per (replica, client region) the requests, their uncached prompt
  tokens, the longest any of them waited in the engine's queue and their mean TTFT -- which regions kept their
  own work and where the forwarded work piled up.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ingress_replicas as bench  # noqa: E402 - the deployment and the N-router variants, one copy

from ray_geolb.percentile import percentile  # noqa: E402
from ray_geolb.sim.deploy import deployment_for  # noqa: E402
from ray_geolb.sim.plan import _seeded  # noqa: E402
from ray_geolb.sim.run_spec import RunSpec  # noqa: E402
from ray_geolb.sim.scenarios import build_workload  # noqa: E402
from ray_geolb.sim.simulator import Simulator  # noqa: E402


def simulate(run: dict):
    spec = RunSpec.model_validate({k: v for k, v in run.items() if k not in ("slo", "hour_s")})
    return Simulator(build_workload(spec.workload), deployment_for(spec.system, spec.replicas, **spec.deploy),
                     spec.sim).run()


def report(res, window) -> None:
    # SimResult.requests: (t_send, ttft, e2e, prompt, output, lb_wait, cross, client_region, replica);
    # .breakdown: (network s, engine queued s, engine prefill s, uncached prompt tokens), in the same order
    hits = collections.defaultdict(lambda: [0, 0, 0.0])
    lands = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for r, b in zip(res.requests, res.breakdown):
        h = hits[("forwarded" if r[6] else "local", r[7])]
        h[0] += 1
        h[1] += r[3]
        h[2] += b[3]
        if window[0] <= r[0] < window[1]:
            w = lands[(str(r[8]), r[7])]
            w[0] += 1
            w[1] += b[3]
            w[2] = max(w[2], b[1])
            w[3] += r[1]
    prompt = sum(h[1] for h in hits.values())
    uncached = sum(h[2] for h in hits.values())
    print(f"  P99 TTFT {percentile([r[1] for r in res.requests], 99):.3f} s, {len(res.requests)} requests, "
          f"hit rate {1 - uncached / prompt:.3f}")
    print("  | served | client region | requests | prompt tokens | uncached | hit rate |")
    print("  |---|---|---|---|---|---|")
    for (kind, region), (n, p, u) in sorted(hits.items()):
        print(f"  | {kind} | {region} | {n} | {p} | {u:.0f} | {1 - u / p:.3f} |")
    print(f"  sent in [{window[0]:g}, {window[1]:g}) s:")
    print("  | replica | client region | requests | uncached tokens | longest engine queue s | mean TTFT s |")
    print("  |---|---|---|---|---|---|")
    for (rep, region), (n, u, q, t) in sorted(lands.items()):
        print(f"  | {rep} | {region} | {n} | {u:.0f} | {q:.2f} | {t / n:.2f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demand", default="geo-workday-3")
    ap.add_argument("--multiplier", type=float, default=3.01, help="the day's rate multiplier")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routers", default="1,8")
    ap.add_argument("--share", default="registry", help="'registry' (as Serve) or a fixed delay in seconds")
    ap.add_argument("--window", default="10,11.5", help="send times (s) of the per-replica table")
    ap.add_argument("--diurnal", default="us:2,eu:2,asia:2")
    args = ap.parse_args(argv)
    window = tuple(float(x) for x in args.window.split(","))
    share = args.share if args.share == "registry" else float(args.share)
    # bench_ingress_replicas.py's geo-diurnal deployment at its defaults (40 req/s, the 24-s day, H100, 1 s)
    setting = argparse.Namespace(demand=args.demand, diurnal=args.diurnal, mean_rps=40.0, day_s=24.0,
                                 profile="llama3.1-8b-h100", slo=1.0, cost="")
    base = _seeded(bench.diurnal_run(setting, f"{args.demand}/geoprefix", args.multiplier), args.seed)
    for n in (int(x) for x in args.routers.split(",")):
        print(f"{args.demand} x{args.multiplier:g}, seed {args.seed}, N = {n}"
              + (f", inserts shared {'through the registry' if share == 'registry' else f'at {share:g} s'}"
                 if n > 1 else ""))
        report(simulate(bench.with_routers(base, n, False, share if n > 1 else None)), window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
