"""Command line: ``python -m ray_geolb {demo,simulate,plan,goodput,policies}``.

* ``demo``      — the main job: a local, CPU-only, three-region Ray Serve demo (emulated engines).
* ``simulate``  — the multi-region discrete-event simulator (policies x workloads x scenarios).
* ``plan``      — the capacity planner: GPUs per region at a latency SLO, per routing system (simulated).
* ``goodput``   — SLO goodput: the largest load each system serves within the SLO, and attainment.
* ``policies``  — a quick, Ray-free look at the policy core: every policy on one small workload.
* ``tiny-model`` — write a tiny random-weight Llama for real vLLM engines on CPU (no download).
* ``cpu-profile`` — measure a real vLLM CPU engine's step times and fit the engine model's profile to them.

Every package these commands import is a declared dependency (core, or the ``demo`` extra the
README installs). If one is missing anyway (a partial install), the command stops with a one-line
error naming the package and the install command, not a traceback.
"""

from __future__ import annotations

import argparse
import sys

#: top-level module -> the pip requirement that provides it (pyproject.toml: core deps + ``[demo]``,
#: whose ``ray[serve,llm]`` brings Ray Serve LLM's own imports: vLLM for its protocol models, pyarrow)
_PROVIDERS = {
    "xxhash": "xxhash", "numpy": "numpy", "pydantic": "pydantic", "ray": "ray[serve]==2.60.*",
    "fastapi": "fastapi<0.137", "httpx": "ray_geolb[demo]", "matplotlib": "ray_geolb[demo]",
    "tqdm": "ray_geolb[demo]", "vllm": "ray_geolb[demo]", "pyarrow": "ray_geolb[demo]",
    "transformers": "ray_geolb[vllm-cpu]", "tokenizers": "ray_geolb[vllm-cpu]", "torch": "ray_geolb[vllm-cpu]",
}


def _policies(args) -> int:
    from ray_geolb.policy_demo import run

    return run(args)


def _build_parser() -> argparse.ArgumentParser:
    from ray_geolb.sim.cli import add_simulate_parser, run_simulate

    ap = argparse.ArgumentParser(prog="python -m ray_geolb", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    demo = sub.add_parser("demo", help="three-region Ray Serve demo on this machine (CPU only)", add_help=False)
    demo.set_defaults(func=None)

    sp = add_simulate_parser(sub)
    sp.set_defaults(func=run_simulate)

    from ray_geolb.sim.goodput import add_goodput_parser
    from ray_geolb.sim.plan import add_plan_parser

    add_plan_parser(sub)
    add_goodput_parser(sub)

    from ray_geolb.vllm_cpu.step_profile import add_parser as add_cpu_profile_parser
    from ray_geolb.vllm_cpu.tiny_model import add_parser as add_tiny_model_parser

    add_tiny_model_parser(sub)
    add_cpu_profile_parser(sub)

    pol = sub.add_parser("policies", help="compare every policy on a small synthetic workload (no Ray)")
    pol.add_argument("--requests", type=int, default=2000)
    pol.add_argument("--replicas", type=int, default=8)
    pol.add_argument("--seed", type=int, default=0)
    pol.set_defaults(func=_policies)
    return ap


def _run(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from ray_geolb.demo import main as demo_main

        return demo_main(argv[1:]) or 0
    args = _build_parser().parse_args(argv)
    return args.func(args) or 0


def main(argv=None) -> int:
    try:
        return _run(argv)
    except ImportError as e:
        top = (e.name or "").split(".")[0]
        if top not in _PROVIDERS and "Neither vLLM nor SGLang" in str(e):
            top = "vllm"  # Ray Serve LLM's protocol models: raised as a plain ImportError
        if top not in _PROVIDERS:
            raise
        print(f"error: ray_geolb needs the Python package {top!r}, which is not installed here; install it "
              f"with: pip install \"{_PROVIDERS[top]}\" (or reinstall: pip install -e \".[demo]\")", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
