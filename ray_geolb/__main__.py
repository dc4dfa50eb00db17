"""Command line: ``python -m ray_geolb {demo,simulate,policies}``.

* ``demo``      — the main job: a local, CPU-only, three-region Ray Serve demo (emulated engines).
* ``simulate``  — the multi-region discrete-event simulator (policies x workloads x scenarios).
* ``policies``  — a quick, Ray-free look at the policy core: every policy on one small workload.
"""

from __future__ import annotations

import argparse
import sys


def _policies(args) -> int:
    from ray_geolb.policy_demo import run

    return run(args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ray_geolb", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    demo = sub.add_parser("demo", help="three-region Ray Serve demo on this machine (CPU only)", add_help=False)
    demo.set_defaults(func=None)

    try:
        from ray_geolb.sim.cli import add_simulate_parser, run_simulate
    except ImportError:  # simulator CLI not available in this build
        add_simulate_parser = None
    if add_simulate_parser is not None:
        sp = add_simulate_parser(sub)
        sp.set_defaults(func=run_simulate)

    pol = sub.add_parser("policies", help="compare every policy on a small synthetic workload (no Ray)")
    pol.add_argument("--requests", type=int, default=2000)
    pol.add_argument("--replicas", type=int, default=8)
    pol.add_argument("--seed", type=int, default=0)
    pol.set_defaults(func=_policies)

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from ray_geolb.demo import main as demo_main

        return demo_main(argv[1:]) or 0
    args = ap.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
