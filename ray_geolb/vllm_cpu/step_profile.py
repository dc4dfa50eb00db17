"""A real vLLM CPU engine's step times, from vLLM's own iteration stats, and the engine-model profile
fitted to them: ``python -m ray_geolb cpu-profile MODEL_DIR --out DIR``.

How a step is timed (vLLM 0.29 ``AsyncLLM`` in this process, with a stat logger that keeps every
``IterationStats``; nothing is timed around the engine):

* **Prefill rows** ``[P, c, 0, 0, t]``: one request of ``c + P`` tokens, max 1 output token, sent to an
  idle engine after a request of its first ``c`` tokens warmed the prefix cache. Its iteration woke an
  idle engine, so the step lasted its time to first token (``time_to_first_tokens_iter``, from the
  frontend's arrival; the IPC around it is a few ms and is part of what the real engine pays). ``P`` and
  ``c`` are what vLLM reports (``prompt_token_stats.computed`` / ``cached_tokens``), not what was asked.
* **Decode rows** ``[0, 0, B, L, t]``: ``B`` requests of ``L`` prompt tokens decoding together; each
  iteration in which exactly ``B`` tokens were generated and nothing was prefilled is one decode step,
  lasting the gap since the previous iteration (``iteration_timestamp``). ``L`` is the mean context over
  those steps.

Each row is the median of its repeats. The rows are fitted with the GPU profiles' fit
(:func:`ray_geolb.engine.step_fit.fit_step_model`), and :func:`cpu_profile` makes an
:class:`~ray_geolb.engine.profiles.EngineProfile` of the fit with the engine's real capacity
(``max_num_seqs``, KV blocks of ``block_size`` tokens, ``max_model_len``), so the simulator can run the
same engine the real-engine cluster runs (``benchmarks/sim_vs_real.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

#: the default grids: prefill chunks (P new tokens over c cached) and decode batches (B of L tokens)
PREFILLS = ((32, 0), (128, 0), (512, 0), (1024, 0), (1536, 0), (32, 512), (128, 512), (512, 512),
            (32, 1024), (256, 1024))
DECODES = ((1, 64), (2, 64), (4, 64), (8, 64), (1, 1024), (4, 1024), (8, 512))
QUICK_PREFILLS = ((32, 0), (512, 0), (1024, 0), (128, 512))
QUICK_DECODES = ((1, 64), (4, 64), (4, 512))


class _Iterations:
    """A vLLM stat logger (``StatLoggerBase`` duck type) keeping one record per iteration."""

    records: List[Dict[str, Any]] = []
    capacity: Dict[str, Any] = {}

    def __init__(self, vllm_config: Any = None, engine_index: int = 0):
        try:
            _Iterations.capacity.update(max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
                                        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
                                        block_size=vllm_config.cache_config.block_size,
                                        max_model_len=vllm_config.model_config.max_model_len)
        except AttributeError:
            pass
        self._config = vllm_config

    def record(self, scheduler_stats=None, iteration_stats=None, mm_cache_stats=None, engine_idx: int = 0):
        if iteration_stats is None:
            return
        pts = iteration_stats.prompt_token_stats
        _Iterations.records.append({
            "ts": float(iteration_stats.iteration_timestamp),
            "computed": int(pts.computed), "cached": int(pts.cached_tokens),
            "gen": int(iteration_stats.num_generation_tokens),
            "ttfts": [float(x) for x in iteration_stats.time_to_first_tokens_iter],
            "running": None if scheduler_stats is None else int(scheduler_stats.num_running_reqs),
        })

    def log_engine_initialized(self):
        try:
            _Iterations.capacity["num_gpu_blocks"] = self._config.cache_config.num_gpu_blocks
        except AttributeError:
            pass

    def log(self):
        pass


def _stat_logger_class():
    from vllm.v1.metrics.loggers import StatLoggerBase

    return type("StepTimeRecorder", (_Iterations, StatLoggerBase), {})


async def _generate(engine, tokens: List[int], max_tokens: int, rid: str) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    async for _ in engine.generate(TokensPrompt(prompt_token_ids=tokens), sp, rid):
        pass


def _tokens(rng: random.Random, n: int, vocab: int) -> List[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


async def _measure(engine, vocab: int, prefills, decodes, repeats: int, seed: int) -> List[List[float]]:
    rng = random.Random(seed)
    rec = _Iterations.records
    rows: List[List[float]] = []
    n = 0
    for P, c in prefills:
        got = []
        for _ in range(repeats):
            prefix = _tokens(rng, c, vocab)
            if c:
                await _generate(engine, prefix, 1, f"warm{n}")
                n += 1
            await asyncio.sleep(0.05)  # the engine goes idle
            start = len(rec)
            await _generate(engine, prefix + _tokens(rng, P, vocab), 1, f"p{n}")
            n += 1
            firsts = [r for r in rec[start:] if r["ttfts"] and r["computed"]]
            if len(firsts) == 1:
                r = firsts[0]
                got.append((r["computed"], r["cached"], min(r["ttfts"])))
        if got:
            rows.append([statistics.median(g[0] for g in got), statistics.median(g[1] for g in got), 0, 0,
                         statistics.median(g[2] for g in got)])
    for B, L in decodes:
        durations, contexts = [], []
        for _ in range(repeats):
            await asyncio.sleep(0.05)
            start = len(rec)
            out_tokens = 24
            await asyncio.gather(*[_generate(engine, _tokens(rng, L, vocab), out_tokens, f"d{n}-{i}")
                                   for i in range(B)])
            n += 1
            its = rec[start:]
            for k in range(1, len(its)):
                cur, prev = its[k], its[k - 1]
                if cur["gen"] == B and cur["computed"] == 0 and not cur["ttfts"] and (prev["running"] or 0) >= B:
                    durations.append(cur["ts"] - prev["ts"])
                    contexts.append(L + k)
        if durations:
            rows.append([0, 0, B, round(statistics.mean(contexts)), statistics.median(durations)])
    return rows


def measure_step_times(model_dir: str, *, max_num_seqs: int = 8, max_model_len: int = 2048, kv_cache_gb: int = 1,
                       prefills: Sequence = PREFILLS, decodes: Sequence = DECODES, repeats: int = 5,
                       seed: int = 0) -> Dict[str, Any]:
    """Run a vLLM CPU engine on ``model_dir`` in this process and measure ``prefills`` (``(P, c)``) and
    ``decodes`` (``(B, L)``). Returns ``{"rows": [[P, c, B, L, seconds], ...], "capacity": {...},
    "info": {...}}``."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    meta = json.loads((Path(model_dir) / "config.json").read_text())
    for P, c in prefills:
        if P + c + 1 > max_model_len:
            raise ValueError(f"prefill ({P}, {c}) does not fit max_model_len {max_model_len}")
    args = AsyncEngineArgs(model=str(model_dir), enforce_eager=True, enable_prefix_caching=True, dtype="bfloat16",
                           max_model_len=max_model_len, max_num_seqs=max_num_seqs, disable_log_stats=False)
    _Iterations.records.clear()
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_class()])
    try:
        async def run():
            await _generate(engine, _tokens(random.Random(seed + 1), 64, meta["vocab_size"]), 4, "warmup")
            return await _measure(engine, meta["vocab_size"], prefills, decodes, repeats, seed)

        t0 = time.time()
        rows = asyncio.run(run())
        wall = time.time() - t0
    finally:
        engine.shutdown()
    return {"rows": rows, "capacity": dict(_Iterations.capacity),
            "info": {"vllm": vllm.__version__, "model": meta, "repeats": repeats, "seconds": round(wall, 1),
                     "cpu_count": os.cpu_count(), "measured": time.strftime("%Y-%m-%d")}}


def fit_rows(rows: Sequence[Sequence[float]]):
    """The step model fitted to ``[P, c, B, L, t]`` rows with the GPU profiles' fit."""
    from ray_geolb.engine.step_fit import _row_step, fit_step_model

    return fit_step_model([[_row_step(r) for r in rows]])


def cpu_profile(measured: Dict[str, Any], *, name: str = "tiny-llama-cpu", ttft_overhead_s: float = 0.0):
    """An :class:`~ray_geolb.engine.profiles.EngineProfile` of the measured engine: the step model
    fitted to its rows and the engine's own capacity. ``ttft_overhead_s``: the serving path's fixed
    latency outside the engine's steps (measured where the engine is served, e.g. through Ray Serve)."""
    from ray_geolb.engine.profiles import EngineProfile

    cap = measured["capacity"]
    return EngineProfile(
        name=name, source=f"measured on this machine's CPU ({measured['info'].get('measured', '?')}): "
                          f"vLLM {measured['info'].get('vllm', '?')} iteration stats, ray_geolb cpu-profile",
        step=fit_rows(measured["rows"]), ttft_overhead_s=ttft_overhead_s,
        num_gpu_blocks=int(cap.get("num_gpu_blocks") or 1024), block_tokens=int(cap.get("block_size") or 128),
        max_num_seqs=int(cap.get("max_num_seqs") or 8),
        max_num_batched_tokens=int(cap.get("max_num_batched_tokens") or 2048),
        max_model_len=int(cap.get("max_model_len") or 2048), gpu="cpu", model="tiny-llama")


def step_errors(model, rows: Sequence[Sequence[float]]) -> List[float]:
    from ray_geolb.engine.step_fit import _row_step, errors

    return [float(e) for e in errors(model, [_row_step(r) for r in rows])]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("cpu-profile", help="measure a real vLLM CPU engine's step times and fit the engine model")
    p.add_argument("model_dir", help="a model directory (python -m ray_geolb tiny-model DIR)")
    p.add_argument("--out", default="out/cpu_profile", help="writes steps.json there")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="a small grid (CI)")
    p.set_defaults(func=_run)
    return p


def _run(args) -> int:
    import sys

    if not (Path(args.model_dir) / "config.json").is_file():
        print(f"error: {args.model_dir!r} has no config.json (write one: python -m ray_geolb tiny-model DIR)",
              file=sys.stderr)
        return 2
    if args.repeats < 1 or args.max_num_seqs < 1:
        print("error: --repeats and --max-num-seqs must be >= 1", file=sys.stderr)
        return 2
    prefills, decodes = (QUICK_PREFILLS, QUICK_DECODES) if args.quick else (PREFILLS, DECODES)
    decodes = [(b, L) for b, L in decodes if b <= args.max_num_seqs]
    measured = measure_step_times(args.model_dir, max_num_seqs=args.max_num_seqs, prefills=prefills,
                                  decodes=decodes, repeats=args.repeats)
    model = fit_rows(measured["rows"])
    errs = step_errors(model, measured["rows"])
    print(f"vLLM {measured['info']['vllm']} on {measured['info']['cpu_count']} CPUs, "
          f"{len(measured['rows'])} steps in {measured['info']['seconds']} s; capacity {measured['capacity']}")
    print(f"fit: {model}")
    print(f"{'P':>6} {'c':>6} {'B':>3} {'L':>6} {'measured':>10} {'model':>10} {'error':>7}")
    for r, e in zip(measured["rows"], errs):
        print(f"{r[0]:>6.0f} {r[1]:>6.0f} {r[2]:>3.0f} {r[3]:>6.0f} {1e3 * r[4]:>8.2f}ms "
              f"{1e3 * r[4] * (1 + e):>8.2f}ms "
              f"{100 * e:>+6.1f}%")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "steps.json").write_text(json.dumps({**measured, "errors": errs}, indent=1))
    print(f"wrote {out / 'steps.json'}")
    return 0


__all__ = ["measure_step_times", "fit_rows", "cpu_profile", "step_errors", "add_parser"]
