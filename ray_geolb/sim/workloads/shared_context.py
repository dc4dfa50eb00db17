"""Shared long contexts from every region: RAG documents or agent contexts of several thousand
tokens, a pool of them reused many times, each asked about from every region.

Context pool: context ``d`` is a deterministic text of ``context_tokens`` (uniform in the given range,
fixed per ``d``) after a short system prompt every request shares. The pool turns over: request ``i``
of a stream asks about context ``i // reuse + u`` with ``u`` uniform in ``[0, live)``, so ``live``
contexts are in use at any time, each is asked about ``reuse`` times in expectation (per region in
the closed loop, in total in the trace) and then retires -- hot documents come and go. A question
(unique text, ``question_tokens``) follows the context; replies write ``output_tokens``.

* :func:`shared_context`: a closed loop with ``clients[region]`` clients per region, each region
  drawing from its own stream of the *same* pool sequence, so every context is asked about from every
  region at about the same time and a per-region load balancer sees a third of each context's traffic.
* :func:`shared_context_trace`: the same pool as a Mooncake-format JSONL trace (``hash_ids`` of
  ``block_tokens``-token blocks: block 0 the shared system prompt, then the context's blocks, then the
  question's unique blocks; ``session_id`` a user out of ``users``), Poisson arrivals at ``rate_rps``,
  written to ``path`` (default: a file in the temp folder named by its parameters) and replayed by
  :func:`~ray_geolb.sim.workloads.trace.trace` with ``region_by`` (``"row"``: dealt round-robin).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Dict, Sequence, Tuple

from .model import Call, ClosedLoopSpec, Program, ProgramStream, Workload
from .text import CHARS_PER_TOKEN, rng_for, stable_int, words
from .trace import trace

__all__ = ["shared_context", "shared_context_trace", "context_of"]

SYSTEM_PROMPT = ("You are a retrieval assistant. Answer the question using only the context below; quote "
                 "the passage you rely on and say so when the context does not contain the answer.\n\n")


def _check(live: int, reuse: int, context_tokens: Tuple[int, int], question_tokens: Tuple[int, int],
           output_tokens: Tuple[int, int]) -> None:
    if live < 1 or reuse < 1:
        raise ValueError(f"live and reuse must be >= 1, got {live}, {reuse}")
    for name, (a, b) in (("context_tokens", context_tokens), ("question_tokens", question_tokens),
                         ("output_tokens", output_tokens)):
        if not 1 <= a <= b:
            raise ValueError(f"{name} must be (lo, hi) with 1 <= lo <= hi, got {(a, b)}")


def context_of(i: int, live: int, reuse: int, seed: int, stream: str = "") -> int:
    """The context request ``i`` of a stream asks about: ``i // reuse + u``, ``u`` uniform in [0, live)."""
    u = int(rng_for(seed, "ctx-pick", stream, i).integers(0, live))
    return i // reuse + u


def _uniform(lo: int, hi: int, *key) -> int:
    return lo if lo == hi else int(rng_for(*key).integers(lo, hi + 1))


def _context_text(d: int, context_tokens: Tuple[int, int], seed: int) -> str:
    n = _uniform(*context_tokens, seed, "ctx-len", d)
    head = f"[context {d}] "
    return head + words(n * CHARS_PER_TOKEN - len(head), rng_for(seed, "ctx-text", d))


def shared_context(clients: Dict[str, int] | None = None, live: int = 64, reuse: int = 4,
                   context_tokens: Tuple[int, int] = (4000, 8000), question_tokens: Tuple[int, int] = (64, 256),
                   output_tokens: Tuple[int, int] = (32, 256), seed: int = 0) -> Workload:
    """Closed loop: ``clients`` per region (default 24 in each of us / eu / asia), one call per program."""
    clients = dict({"us": 24, "eu": 24, "asia": 24} if clients is None else clients)
    _check(live, reuse, context_tokens, question_tokens, output_tokens)
    texts: Dict[int, str] = {}

    def context(d: int) -> str:
        t = texts.get(d)
        if t is None:
            if len(texts) > 4 * live:  # contexts retire: keep the memo bounded
                texts.clear()
            t = texts[d] = _context_text(d, context_tokens, seed)
        return t

    def make(region: str):
        def program(i: int) -> Program:
            d = context_of(i, live, reuse, seed)  # the same pool sequence in every region
            q = _uniform(*question_tokens, seed, "q-len", region, i)
            question = f"\n\nQuestion ({region} {i}): " + words(q * CHARS_PER_TOKEN, rng_for(seed, "q", region, i))
            out = _uniform(*output_tokens, seed, "out", region, i)
            return Program(f"shared-context:{region}:{i}", region, [
                Call(prompt=SYSTEM_PROMPT + context(d) + question, output_tokens=out, session_key=f"ctx-{d}")])
        return program

    return Workload(
        name="shared-context",
        description=(f"shared long contexts from every region: {live} live contexts of {context_tokens[0]}-"
                     f"{context_tokens[1]} tokens, each asked ~{reuse} times per region, clients {clients}"),
        closed=ClosedLoopSpec(clients=clients, programs={r: ProgramStream(make(r)) for r in clients}),
        meta={"clients": clients, "live": live, "reuse": reuse, "context_tokens": list(context_tokens), "seed": seed},
    )


def trace_rows(requests: int, rate_rps: float, live: int, reuse: int, context_tokens: Tuple[int, int],
               question_tokens: Tuple[int, int], output_tokens: Tuple[int, int], users: int, seed: int,
               block_tokens: int = 512) -> list:
    """The rows of :func:`shared_context_trace` (Mooncake JSONL fields plus ``session_id``)."""
    _check(live, reuse, context_tokens, question_tokens, output_tokens)
    if requests < 1 or not rate_rps > 0 or users < 1 or block_tokens < 1:
        raise ValueError("requests, rate_rps, users and block_tokens must be positive")
    sys_blocks = 1
    max_ctx_blocks = -(-context_tokens[1] // block_tokens)
    gaps = rng_for(seed, "trace-arrivals").exponential(1.0 / rate_rps, size=requests)
    t = 0.0
    rows = []
    for i in range(requests):
        t += float(gaps[i])
        d = context_of(i, live, reuse, seed, "trace")
        n_ctx = _uniform(*context_tokens, seed, "ctx-len", d)
        n_q = _uniform(*question_tokens, seed, "q-len", "trace", i)
        ctx_ids = [1 + d * max_ctx_blocks + j for j in range(-(-n_ctx // block_tokens))]
        q_first = 1 + (1 << 40) + i * (-(-question_tokens[1] // block_tokens) + 1)
        q_ids = [q_first + j for j in range(-(-n_q // block_tokens) + 1)]
        rows.append({"timestamp": int(round(t * 1000)),
                     "input_length": sys_blocks * block_tokens + len(ctx_ids) * block_tokens + n_q,
                     "output_length": _uniform(*output_tokens, seed, "out", "trace", i),
                     "hash_ids": [0] + ctx_ids + q_ids,
                     "session_id": int(rng_for(seed, "user", i).integers(0, users))})
    return rows


def shared_context_trace(region_of: Sequence[str] = ("us", "eu", "asia"), region_by: str = "row",
                         requests: int = 2000, rate_rps: float = 8.0, live: int = 64, reuse: int = 12,
                         context_tokens: Tuple[int, int] = (4000, 8000), question_tokens: Tuple[int, int] = (64, 256),
                         output_tokens: Tuple[int, int] = (32, 256), users: int = 300, seed: int = 0,
                         path: str | Path | None = None) -> Workload:
    """Write the shared-context pool as a Mooncake-format JSONL trace and replay it (module docstring).
    The file is a pure function of the parameters; an existing file of the default name is reused."""
    params = dict(requests=requests, rate_rps=rate_rps, live=live, reuse=reuse, context_tokens=list(context_tokens),
                  question_tokens=list(question_tokens), output_tokens=list(output_tokens), users=users, seed=seed)
    if path is None:
        tag = stable_int(json.dumps(params, sort_keys=True)) & 0xFFFFFFFFFFFF
        folder = Path(tempfile.gettempdir()) / "ray_geolb_traces"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"shared_context_{tag:012x}.jsonl"
    path = Path(path)
    if not path.exists():
        rows = trace_rows(requests, rate_rps, live, reuse, tuple(context_tokens), tuple(question_tokens),
                          tuple(output_tokens), users, seed)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the whole file or none
    w = trace(path, region_of=list(region_of), seed=seed, region_by=region_by, tenant="shared-context")
    w.name = f"shared-context-trace:{region_by}"
    w.description = f"shared-context trace ({region_by}): " + w.description
    w.meta.update(params)
    return w
