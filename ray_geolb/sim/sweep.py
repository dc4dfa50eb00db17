"""Run many simulations: sequentially, or as Ray tasks (one task per run).

``run_many(runs, ray=True)`` starts ``ray.init(address="local", num_cpus=2, include_dashboard=False)``
(a fresh local cluster of its own, never an existing one by accident); ``address=...`` joins an
existing cluster instead. A run is a plain dict (see ``scenarios``), a simulation is a pure function
of it, so the Ray results are identical to the sequential ones (tested). Ray is imported lazily,
only inside these functions.

``grid(systems, seeds, replica_sets, workload, sim)`` builds the systems x seeds x replica-counts runs.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, List, Optional, Sequence

from .scenarios import run_one

__all__ = ["run_many", "grid", "ProgressBar", "ray_session"]


class ProgressBar:
    """A plain stderr progress bar (tqdm if installed), ``update(done_fraction, note)``."""

    def __init__(self, total: float, desc: str = "", enabled: bool = True, stream=None):
        self.total = max(total, 1e-9)
        self.desc = desc
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._last = -1
        self._tq = None
        if enabled:
            try:
                from tqdm import tqdm  # noqa: F401

                self._tq = tqdm(total=100, desc=desc, file=self.stream, leave=True)
            except ImportError:
                self._tq = None

    def update(self, done: float, note: str = "") -> None:
        if not self.enabled:
            return
        pct = int(100 * min(1.0, done / self.total))
        if pct == self._last:
            return
        if self._tq is not None:
            self._tq.update(pct - max(0, self._last))
            if note:
                self._tq.set_postfix_str(note)
        else:
            n = pct // 4
            self.stream.write(f"\r{self.desc} [{'#' * n}{'.' * (25 - n)}] {pct:3d}% {note}")
            self.stream.flush()
        self._last = pct

    def close(self) -> None:
        if not self.enabled:
            return
        if self._tq is not None:
            self._tq.close()
        else:
            self.stream.write("\n")
            self.stream.flush()


def grid(systems: Sequence[str], seeds: Sequence[int], replica_sets: Sequence[Dict[str, int]],
         workload: Dict[str, Any], sim: Dict[str, Any], deploy: Optional[Dict[str, Any]] = None) -> List[dict]:
    runs = []
    for reps in replica_sets:
        n = sum(reps.values())
        for seed in seeds:
            wl = {"name": workload["name"], "kw": dict(workload.get("kw", {}), seed=seed)}
            if workload.get("data_dir"):
                wl["data_dir"] = workload["data_dir"]
            for s in systems:
                runs.append({"label": f"{n}rep/seed{seed}/{s}", "group": f"{n} replicas", "system": s,
                             "replicas": dict(reps), "workload": wl, "sim": dict(sim, seed=seed),
                             "deploy": dict(deploy or {})})
    return runs


def add_runner_args(sp) -> None:
    """The runner's options on a command's argparse parser (``simulate``, ``plan``, ``goodput``): ``--ray`` or
    ``--address`` (:func:`run_many`'s), and ``--progress / --no-progress``."""
    import argparse

    g = sp.add_mutually_exclusive_group()
    g.add_argument("--ray", action="store_true", help="run the simulations as tasks on a fresh local Ray (2 CPUs)")
    g.add_argument("--address", default=None, help="run the simulations on an existing Ray cluster")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar on stderr")


def parse_seeds(parser, spec: str) -> List[int]:
    """``--seeds`` ("0,1,2") as ints; an argparse error naming the flag when it is not that, or empty."""
    try:
        seeds = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {spec!r}")
    if not seeds:
        parser.error("--seeds: no seed given")
    return seeds


def _init_ray(address: Optional[str], num_cpus: int = 2) -> bool:
    """Start (or join, with ``address``) Ray unless it is up; True when this call started it."""
    import ray as ray_mod

    if ray_mod.is_initialized():
        return False
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"env_vars": {"PYTHONPATH": pkg_root + os.pathsep + os.environ.get("PYTHONPATH", "")}}
    if address:
        ray_mod.init(address=address, runtime_env=env, log_to_driver=False)
    else:
        ray_mod.init(address="local", num_cpus=num_cpus, include_dashboard=False, runtime_env=env,
                     log_to_driver=False)
    return True


@contextmanager
def ray_session(ray: bool = False, address: Optional[str] = None, num_cpus: int = 2):
    """Keep one Ray up across many :func:`run_many` calls (a search's rounds): started here (a fresh
    local cluster, or ``address``) unless already up, shut down on exit if started here; a no-op
    without ``ray``/``address``."""
    started = False
    if ray or address:
        started = _init_ray(address, num_cpus)
    try:
        yield
    finally:
        if started:
            import ray as ray_mod

            ray_mod.shutdown()


def _remote_run(run, fn=None):
    return (fn or run_one)(run)


def run_many(runs: List[dict], ray: bool = False, address: Optional[str] = None, progress: bool = True,
             num_cpus: int = 2, on_result: Optional[Callable[[int, dict], None]] = None,
             fn: Optional[Callable[..., dict]] = None) -> List[dict]:
    """Results in the order of ``runs``. ``fn(run, progress=None)`` turns a run into its result
    (default :func:`~ray_geolb.sim.scenarios.run_one`; a module-level function, so Ray can ship it)."""
    one = fn or run_one
    n = len(runs)
    if not ray and not address:
        out = []
        for i, r in enumerate(runs):
            bar = ProgressBar(r["sim"]["duration_s"], f"[{i + 1}/{n}] {r['label']}", enabled=progress)
            t0 = time.perf_counter()
            m = one(r, progress=(lambda t, b=bar: b.update(t)) if progress else None)
            bar.update(r["sim"]["duration_s"], f"{time.perf_counter() - t0:.1f}s wall")
            bar.close()
            out.append(m)
            if on_result:
                on_result(i, m)
        return out

    import ray as ray_mod

    started = _init_ray(address, num_cpus)
    try:
        task = ray_mod.remote(num_cpus=1)(_remote_run)
        refs = [task.remote(r, fn) for r in runs]
        idx = {ref: i for i, ref in enumerate(refs)}
        results: List[Optional[dict]] = [None] * n
        bar = ProgressBar(n, f"{n} runs on Ray", enabled=progress)
        pending = list(refs)
        done = 0
        while pending:
            ready, pending = ray_mod.wait(pending, num_returns=1)
            for ref in ready:
                i = idx[ref]
                results[i] = ray_mod.get(ref)
                done += 1
                bar.update(done, runs[i]["label"])
                if on_result:
                    on_result(i, results[i])
        bar.close()
        return results  # type: ignore[return-value]
    finally:
        if started:
            ray_mod.shutdown()
