"""How much of a workload's P99 TTFT is its start (a diagnostic, not a comparison): the P99 over the requests sent
at or after ``w`` seconds, for several ``w``, with one router per region and with N routers sharing their inserts
through the registry (``bench_ingress_replicas.py``'s runs). At ``t = 0`` every closed-loop client sends its first
request at once, each with a new long context; the later requests are the steady state.

    .venv/bin/python benchmarks/diag_tail_by_send_time.py --seeds 0,1,2,3 --workloads shared-context
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ingress_replicas as bench  # noqa: E402 - the workloads and the N-router deployment, one copy

from ray_geolb.percentile import percentile  # noqa: E402
from ray_geolb.sim.deploy import deployment_for  # noqa: E402
from ray_geolb.sim.run_spec import RunSpec  # noqa: E402
from ray_geolb.sim.scenarios import build_workload  # noqa: E402
from ray_geolb.sim.simulator import Simulator  # noqa: E402


def tails(run: dict, since: list) -> list:
    """P99 TTFT (s) of the requests sent at or after each of ``since`` (s), and how many there were."""
    spec = RunSpec.model_validate({k: v for k, v in run.items() if k not in ("slo", "hour_s")})
    res = Simulator(build_workload(spec.workload), deployment_for(spec.system, spec.replicas, **spec.deploy),
                    spec.sim).run()
    out = []
    for w in since:
        ttfts = [r[1] for r in res.requests if r[0] >= w]  # (t_send, ttft, ...)
        out.append((percentile(ttfts, 99) if ttfts else float("nan"), len(ttfts)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--routers", default="1,8")
    ap.add_argument("--workloads", default="shared-context", help="of bench_ingress_replicas.py's")
    ap.add_argument("--since", default="0,2,5,10", help="send times (s) the tails start at")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args(argv)
    since = [float(x) for x in args.since.split(",")]
    ns = [int(n) for n in args.routers.split(",")]
    print("| workload | seed | N | " + " | ".join(f"P99 TTFT s, sent >= {w:g} s (requests)" for w in since) + " |")
    print("|---|---|---|" + "---|" * len(since))
    for seed in (int(s) for s in args.seeds.split(",")):
        for base in (b for w in args.workloads.split(",") for b in bench.workload_runs(w, seed, args)):
            for n in ns:
                cells = tails(bench.with_routers(base, n, False, "registry" if n > 1 else None), since)
                print(f"| {base['label'].split('/')[0]} | {seed} | {n} | "
                      + " | ".join(f"{p:.2f} ({k})" for p, k in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
