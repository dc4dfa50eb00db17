"""The simulator against the real system: one closed-loop workload on real vLLM CPU engines behind two region
apps, and the same workload in the simulator with the engine profile fitted to those engines' own steps.

    .venv-cpu/bin/python benchmarks/sim_vs_real.py [--duration 60] [--seed 0]

Runs in the real-engine venv (README "Real engines on CPU"). In one run:

1. **The engine's steps.** A tiny random-weight Llama (``python -m ray_geolb tiny-model``) is served by one
   vLLM CPU engine in this process; its prefill and decode steps are timed from vLLM's own iteration
   stats and the step model is fitted to them (``ray_geolb.vllm_cpu.step_profile``), over a grid that
   covers the workload's prompt lengths.
2. **The real system.** A local two-node Ray cluster (us = head, eu), one real engine per region
   (``max_num_seqs`` 4), GeoPrefixRouter in each region app, the demo's inter-region RTTs injected. The
   serving path's fixed latency (HTTP proxy, ingress, router, vLLM's frontend) is measured first: the
   median of single requests' TTFT on an idle engine, less the fitted step time of their prefill. Then
   the demo's conversation clients (ShareGPT conversations re-sending their history, us 6 clients / eu 1,
   at most 32 output tokens) run for ``--duration`` seconds through the real HTTP proxy.
3. **The simulator**, with that profile (and that fixed latency as its ``ttft_overhead_s``), the same
   regions, replicas, RTTs, GeoPrefix, workload and seed, for the same duration; the prompt text is
   turned into tokens at the real tokenizer's characters per token on this workload.
4. **The simulator again, with the engines' steps as long as they were under the real load** (``sim x F``):
   on a 2-core machine every process of the serving path (HTTP proxy, ingresses, routers, vLLM's
   frontends, the load generator) shares the cores with the engines, so a step takes longer than the
   same step timed alone. ``F`` is the real engines' mean step time under the load (their own
   ``engine_work``) over the first simulation's, and every step of the profile is scaled by it.

Prints throughput and TTFT p50 / p99 side by side with the ratios, and writes ``sim_vs_real.json`` to
``--out``. Everything is measured in the run: nothing is carried over from an earlier one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ray_geolb.percentile import percentile

REPLICAS = {"us": 1, "eu": 1}
CONV = {"us": 6, "eu": 1}
MAX_TOKENS = 32
MAX_NUM_SEQS = 4
MAX_MODEL_LEN = 16384
MESSAGE_CHARS = 1500
#: prefill (P new over c cached) and decode (B of L) steps timed for the fit: the workload's range
PREFILLS = ((32, 0), (128, 0), (512, 0), (1024, 0), (2048, 0), (4096, 0), (32, 2048), (256, 2048),
            (1024, 2048), (64, 6144), (512, 6144))
DECODES = ((1, 64), (2, 64), (4, 64), (1, 2048), (4, 2048), (4, 6144))


def _chars_per_token(model_dir: str, workloads) -> float:
    """The real tokenizer's characters per token over the workload's prompts (the simulator's unit)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    chars = tokens = 0
    for w in workloads:
        for progs in w.closed.programs.values():
            for prog in progs.take(40):
                for call in prog.calls:
                    text = call.prompt if call.messages is None else "\n".join(m["content"] for m in call.messages)
                    chars += len(text)
                    tokens += len(tok(text).input_ids)
    return chars / max(1, tokens)


def workload(seed: int, cap: int = MAX_TOKENS):
    """The demo's conversation workload with at most ``cap`` output tokens per call (the demo's clients ask
    for that much: the simulated calls do too)."""
    from dataclasses import replace

    from ray_geolb.demo import build_workloads
    from ray_geolb.sim.workloads.model import ProgramStream

    (w,) = build_workloads(CONV, {r: 0 for r in CONV}, seed, max_message_chars=MESSAGE_CHARS)

    def capped(stream):
        def make(i):
            prog = stream[i]
            for call in prog.calls:
                call.output_tokens = max(1, min(call.output_tokens, cap))
            return prog
        return ProgramStream(make, stream.limit)

    closed = replace(w.closed, programs={r: capped(s) for r, s in w.closed.programs.items()})
    return replace(w, closed=closed)


def measure_overhead(base: str, model_step, model_dir: str) -> float:
    """The serving path's fixed latency: idle single requests' client TTFT less their fitted prefill step
    (the probe's tokens counted by the model's own tokenizer)."""
    import httpx
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    with httpx.Client(timeout=120) as c:
        for i in range(8):
            region = "us" if i % 2 else "eu"
            text = " ".join(f"overhead probe {i} word {k}" for k in range(20 + 40 * i))
            t0 = time.monotonic()
            with c.stream("POST", f"{base}/{region}/v1/completions",
                          json={"prompt": text, "max_tokens": 2, "stream": True},
                          headers={"x-allowed-regions": region}) as r:
                ttft = None
                for line in r.iter_lines():  # read to the end: the request finishes before the next
                    if ttft is None and line.startswith("data: {"):
                        ttft = time.monotonic() - t0
            out.append(ttft - model_step.time(((len(tok(text).input_ids), 0),), []))
            time.sleep(0.2)
    print(f"real: idle TTFT less the fitted step, ms: {[round(1e3 * x, 1) for x in out]}", flush=True)
    return max(0.0, statistics.median(out))


def run_real(model_dir: str, args, workloads, measured, cpt: float) -> dict:
    from ray_geolb.demo import LoadRun, _warmup
    from ray_geolb.serve.app import build_region_apps, deploy_region_apps
    from ray_geolb.serve.local import serve_on_region_cluster
    from ray_geolb.vllm_cpu.config import cpu_llm_config
    from ray_geolb.vllm_cpu.step_profile import fit_rows

    with serve_on_region_cluster(list(REPLICAS), "geolb_svr_", "geolb_svr", num_cpus=8) as base:
        cfg = cpu_llm_config(model_dir, model_id="tiny-llama",
                             engine_kwargs={"max_num_seqs": MAX_NUM_SEQS, "max_model_len": MAX_MODEL_LEN})
        token = "sim-vs-real-admin-token-0123"
        apps = build_region_apps(REPLICAS, cfg, latency={"scale": 1.0}, stats_period_s=0.5,
                                 ingress={"max_queue": 512, "max_wait_s": 60.0, "admin_token": token})
        t0 = time.monotonic()
        deploy_region_apps(apps, timeout_s=400)
        print(f"real: deployed in {time.monotonic() - t0:.0f} s", flush=True)
        asyncio.run(_warmup(base, list(REPLICAS), True, token))
        overhead = measure_overhead(base, fit_rows(measured["rows"]), model_dir)
        print(f"real: serving path's fixed latency {1e3 * overhead:.1f} ms", flush=True)
        work0 = engine_work([a.name for a in apps])
        lr = LoadRun(base, workloads, args.duration, MAX_TOKENS, "real")
        asyncio.run(lr.run())
        work1 = engine_work([a.name for a in apps])
        recs = [r for r in lr.records if r["t1"] <= lr.t0 + args.duration]
        ok = [r for r in recs if r["status"] == 200 and r["ttft"] is not None]
        return {"overhead_s": overhead, "requests": len(recs), "ok": len(ok),
                "throughput_rps": len(ok) / args.duration,
                "ttft_p50_s": percentile([r["ttft"] for r in ok], 50),
                "ttft_p99_s": percentile([r["ttft"] for r in ok], 99),
                "cross_region_share": sum(1 for r in ok if r["route"] == "forwarded") / max(1, len(ok)),
                "engine_work": {k: work1[k] - work0[k] for k in work1}}


def engine_work(app_names) -> dict:
    """The model replicas' cumulative ``engine_work`` (vLLM iteration stats), summed."""
    import ray

    from ray_geolb.serve.app import model_replica_actors

    tot = {"steps": 0.0, "busy_s": 0.0, "prefill_tokens": 0.0, "decode_tokens": 0.0}
    for a in model_replica_actors(app_names).values():
        w = ray.get(a.record_routing_stats.remote(), timeout=30).get("engine_work") or {}
        for k in tot:
            tot[k] += float(w.get(k, 0.0))
    return tot


def run_sim(args, workloads, profile, cpt: float) -> dict:
    from ray_geolb.engine.profiles import PROFILES
    from ray_geolb.sim.deploy import deployment_for
    from ray_geolb.sim.metrics import summarize
    from ray_geolb.sim.simulator import SimConfig, simulate

    PROFILES[profile.name] = profile  # this process only: the run's own measured profile
    dep = deployment_for("geoprefix", dict(REPLICAS), profile=profile.name)
    res = simulate(workloads[0], dep, SimConfig(duration_s=args.duration, seed=args.seed, chars_per_token=cpt))
    m = summarize(res)
    work = {"steps": 0.0, "busy_s": 0.0, "prefill_tokens": 0.0, "decode_tokens": 0.0}
    for st in res.engine_stats.values():
        for k in work:
            work[k] += float((st.get("engine_work") or {}).get(k, 0.0))
    return {"requests": m.get("completed"), "throughput_rps": m["throughput_rps"],
            "ttft_p50_s": m["ttft_s"]["p50"], "ttft_p99_s": m["ttft_s"]["p99"],
            "cross_region_share": m["cross_region_share"], "engine_work": work}


def scaled(profile, factor: float):
    """``profile`` with every step ``factor`` times as long (the step model's times, not its knee)."""
    from dataclasses import fields, replace

    step = replace(profile.step, **{f.name: getattr(profile.step, f.name) * factor for f in fields(profile.step)
                                    if f.name.endswith("_s")})
    return replace(profile, name=f"{profile.name}-x{factor:.2f}", step=step)


def step_s(work: dict) -> float:
    return work["busy_s"] / work["steps"] if work["steps"] else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of closed-loop load (default 60)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each timed step")
    ap.add_argument("--out", default="out/sim_vs_real")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.repeats < 1:
        print("error: --duration must be > 0 and --repeats >= 1", file=sys.stderr)
        return 2
    from ray_geolb.vllm_cpu.step_profile import cpu_profile, measure_step_times, step_errors
    from ray_geolb.vllm_cpu.tiny_model import write_tiny_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(write_tiny_model(tempfile.mkdtemp(prefix="tiny_model_"), max_positions=MAX_MODEL_LEN))
    t0 = time.monotonic()
    measured = measure_step_times(model_dir, max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN,
                                  prefills=PREFILLS, decodes=DECODES, repeats=args.repeats, seed=args.seed)
    print(f"steps: {len(measured['rows'])} timed in {time.monotonic() - t0:.0f} s", flush=True)
    workloads = [workload(args.seed)]
    cpt = _chars_per_token(model_dir, workloads)
    real = run_real(model_dir, args, [workload(args.seed)], measured, cpt)
    profile = cpu_profile(measured, ttft_overhead_s=real["overhead_s"])
    errs = step_errors(profile.step, measured["rows"])
    sim = run_sim(args, workloads, profile, cpt)
    # the same engines under the real cluster's load: every process of the serving path shares this
    # machine's cores with the engines, so a step takes longer than the same step timed alone. The
    # contention factor is the real engines' mean step time under the load over the simulator's.
    factor = step_s(real["engine_work"]) / step_s(sim["engine_work"])
    sim_insitu = run_sim(args, workloads, scaled(profile, factor), cpt)
    rows = [("throughput (req/s)", "throughput_rps", 1.0), ("TTFT p50 (ms)", "ttft_p50_s", 1e3),
            ("TTFT p99 (ms)", "ttft_p99_s", 1e3)]
    print(f"\nstep model on this CPU: {profile.step}")
    print(f"step fit: median |error| {100 * statistics.median(abs(e) for e in errs):.1f} %, "
          f"max {100 * max(abs(e) for e in errs):.1f} % over {len(errs)} steps; chars/token {cpt:.2f}")
    print(f"mean step under the load: real {1e3 * step_s(real['engine_work']):.2f} ms, simulated "
          f"{1e3 * step_s(sim['engine_work']):.2f} ms: contention factor {factor:.2f}")
    print(f"\n{'':<22}{'real':>10}{'sim':>10}{'sim/real':>10}{'sim x' + format(factor, '.2f'):>12}{'/real':>8}")
    for label, key, mul in rows + [("cross-region (%)", "cross_region_share", 100.0)]:
        a, b, c = real[key], sim[key], sim_insitu[key]
        print(f"{label:<22}{mul * a:>10.2f}{mul * b:>10.2f}{(b / a if a else float('nan')):>10.3f}"
              f"{mul * c:>12.2f}{(c / a if a else float('nan')):>8.3f}")
    (out / "sim_vs_real.json").write_text(json.dumps(
        {"args": vars(args), "real": real, "sim": sim, "sim_in_situ": sim_insitu, "contention_factor": factor,
         "chars_per_token": cpt, "steps": measured,
         "step_errors": errs, "step_model": str(profile.step)}, indent=1, default=str))
    print(f"wrote {out / 'sim_vs_real.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
