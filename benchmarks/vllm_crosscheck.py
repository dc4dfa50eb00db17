"""vLLM's real v1 scheduler vs the project's EngineModel on a multi-turn chat trace (issue 26, item 4).

    .venv/bin/python benchmarks/vllm_crosscheck.py [--convs 120] [--seed 0]

The trace: the committed ShareGPT and WildChat fixtures (60 conversations each), every turn one
request whose prompt is one of 3 shared 256-token system prompts + the whole history + the new user
message (text "tokenised" as one id per 4 characters), max tokens = the answer's length (capped at
512); conversations start uniformly over the first 300 steps, a turn arrives ~its answer length + a
think gap after the previous one. vLLM is fed the answer's tokens as its sampled tokens, so its cached
output blocks can hit in the next turn, as in a real multi-turn chat; the engine model is given the
answer's block hashes after the prompt's and caches those blocks as they fill (as the simulator does
for conversation turns whose reply the next turn replays).

Prints (1) the lockstep agreement table (ray_geolb.engine.vllm_replay.replay) for an H100-sized KV
cache and for a tight one that forces preemptions (the latter also with the whole-prompt admission rule
off on both sides: vLLM's ``scheduler_reserve_full_isl``, the engine's ``reserve_full_prompt``), and
(2) the CPU time per step of vLLM's
``schedule()+update_from_output()`` vs ``EngineModel.step()`` by batch-size band, with the StepModel
GPU time of the same steps (what the wall-clock emulator sleeps).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ray_geolb.serve.llm_server import guard_broken_torch_extras  # noqa: E402

guard_broken_torch_extras()  # before vLLM is imported (this venv: CUDA torchvision over CPU torch)

from ray_geolb.engine.profiles import get_profile  # noqa: E402
from ray_geolb.engine.vllm_replay import TraceRequest, default_step_model, replay, time_steps  # noqa: E402
from ray_geolb.sim.workloads.datasets import load_sharegpt, load_wildchat  # noqa: E402

MAX_MODEL_LEN = 8192
MAX_ANSWER = 512
BANDS = ((1, 8), (9, 32), (33, 128), (129, 256), (257, 1024))


def tokenize(text: str) -> list:
    b = text.encode("utf-8")
    return [zlib.crc32(b[i:i + 4]) % 127999 + 1 for i in range(0, len(b), 4)] or [1]


def chat_trace(n_convs: int, seed: int, start_window: int = 300) -> list:
    """Past the 120 fixture conversations, copies follow with their own system-prompt suffix token (so
    a copy shares the 256-token system prompt but not the conversation)."""
    rng = random.Random(seed)
    convs = load_sharegpt() + load_wildchat()
    rng.shuffle(convs)
    systems = [[rng.randrange(1, 128000) for _ in range(256)] for _ in range(3)]
    out = []
    for ci in range(n_convs):
        c = convs[ci % len(convs)]
        hist = list(systems[ci % 3]) + ([128001 + ci // len(convs)] if ci >= len(convs) else [])
        step = rng.randrange(start_window)
        for k, (user, answer) in enumerate(c.turns):
            prompt = hist + tokenize(user)
            ans = tokenize(answer)[:MAX_ANSWER]
            if len(prompt) + len(ans) > MAX_MODEL_LEN:
                break
            out.append(TraceRequest(step, tuple(prompt), len(ans), f"c{ci}t{k}", tuple(ans)))
            hist = prompt + ans
            step += len(ans) + len(prompt) // 2048 + rng.randint(10, 100)
    out.sort(key=lambda r: r.arrival_step)
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--convs", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timing-convs", type=int, default=480,
                    help="conversations of the (denser: all start within 100 steps) CPU-timing trace")
    a = ap.parse_args()
    prof = get_profile("llama3.1-8b-h100")
    seqs, toks = prof.max_num_seqs, prof.max_num_batched_tokens
    trace = chat_trace(a.convs, a.seed)
    sm = default_step_model()
    print(f"trace: {len(trace)} requests from {a.convs} conversations, "
          f"{sum(len(r.prompt_token_ids) for r in trace)} prompt + {sum(r.max_tokens for r in trace)} output "
          f"tokens; max_num_seqs {seqs}, max_num_batched_tokens {toks}, block 16; StepModel "
          f"{'profile.step' if getattr(prof, 'step', None) is not None else 'constants'}")

    synth = [replace(r, output_token_ids=()) for r in trace]
    H = prof.num_gpu_blocks + 1
    runs = [("H100 KV cache, answers fed back (multi-turn hits on output blocks possible)", trace, H, seqs, toks, True),
            ("H100 KV cache, synthetic sampled tokens (no cross-turn output hits)", synth, H, seqs, toks, True),
            ("tight KV cache, answers fed back", trace, 3000, seqs, toks, True),
            ("tight KV cache, synthetic sampled tokens", synth, 3000, seqs, toks, True),
            ("tight KV, synthetic, 2048-token budget", synth, 3000, 256, 2048, True),
            ("tight KV, synthetic, 2048-token budget, vLLM reserve_full_isl=False", synth, 3000, 256, 2048, False)]
    for name, tr, nb, mseqs, budget, isl in runs:
        t0 = time.perf_counter()
        res = replay(tr, nb, mseqs, budget, max_model_len=MAX_MODEL_LEN, step_model=sm, reserve_full_isl=isl,
                     max_divergences=6)
        print(f"\n== {name}: {nb} vLLM blocks ({nb - 1} usable = engine num_gpu_blocks), max_num_seqs {mseqs}, "
              f"max_num_batched_tokens {budget}; replay {time.perf_counter() - t0:.1f} s wall")
        print(res.table())
        if res.unfinished != (0, 0):
            print(f"  UNFINISHED (vLLM, engine): {res.unfinished}")
        for d in res.divergences:
            print(f"  step {d.step:>5} {d.kind:<9} {d.detail[:150]}")

    dense = chat_trace(a.timing_convs, a.seed, start_window=100)
    print(f"\n== CPU time per step: {len(dense)} requests from {a.timing_convs} conversations starting within "
          f"100 steps; H100 KV cache; each scheduler alone; perf_counter on this machine")
    ts = time_steps(dense, H, seqs, toks, max_model_len=MAX_MODEL_LEN, step_model=sm)
    hdr = (f"  {'batch':>9} {'n vLLM':>7} {'vLLM p50':>9} {'vLLM p99':>9} {'n eng':>6} {'eng p50':>8} "
           f"{'eng p99':>8} {'p50 ratio':>9} {'GPU p50':>8} {'vLLM/GPU p50':>12} {'vLLM/GPU max':>12}")
    print(hdr)
    us = 1e6
    for lo, hi in BANDS:
        v = [x for x in ts["vllm"] if lo <= x[0] <= hi]
        e = [x for x in ts["engine"] if lo <= x[0] <= hi]
        if not v and not e:
            continue
        vc = [x[1] for x in v]
        ec = [x[1] for x in e]
        fr = [x[1] / x[2] for x in v if x[2] > 0]
        ratio = pct(vc, .5) / pct(ec, .5) if vc and ec else float("nan")
        print(f"  {lo:>4}-{hi:<4} {len(v):>7} {pct(vc, .5) * us:>7.0f}us {pct(vc, .99) * us:>7.0f}us {len(e):>6} "
              f"{pct(ec, .5) * us:>6.0f}us {pct(ec, .99) * us:>6.0f}us {ratio:>8.1f}x "
              f"{pct([x[2] for x in v], .5) * 1e3:>6.1f}ms {pct(fr, .5):>11.1%} {max(fr, default=0):>11.1%}")
    vc = [x[1] for x in ts["vllm"]]
    ec = [x[1] for x in ts["engine"]]
    gpu = [x[2] for x in ts["vllm"]]
    fr = [x[1] / x[2] for x in ts["vllm"] if x[2] > 0]
    print(f"  all steps: vLLM {len(vc)} steps, p50 {pct(vc, .5) * us:.0f} us, p99 {pct(vc, .99) * us:.0f} us, "
          f"total {sum(vc):.2f} s; engine {len(ec)} steps, p50 {pct(ec, .5) * us:.0f} us, p99 "
          f"{pct(ec, .99) * us:.0f} us, total {sum(ec):.2f} s")
    print(f"  StepModel GPU time of vLLM's steps: p50 {pct(gpu, .5) * 1e3:.1f} ms, min {min(gpu) * 1e3:.1f} ms, "
          f"max {max(gpu) * 1e3:.1f} ms, total {sum(gpu):.1f} s")
    print(f"  vLLM scheduler CPU / GPU step time: p50 {pct(fr, .5):.1%}, p99 {pct(fr, .99):.1%}, "
          f"max {max(fr):.1%}; summed {sum(vc) / sum(gpu):.1%} -> "
          f"{'small' if pct(fr, .99) < 0.1 else 'NOT small'} relative to the emulated GPU steps")


if __name__ == "__main__":
    main()
