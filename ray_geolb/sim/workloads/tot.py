"""Tree-of-Thoughts on GSM8K (SkyLB §5.1: depth 4, 2-branch = 15 calls, 4-branch = 85 calls).

Output lengths: by default each node writes as many tokens as its question's GSM8K reference
rationale (``thought_tokens_for``: median 53 on the fixture), and sends no ``max_tokens``. SkyLB's
benchmark client and SGLang's ``tree_of_thought_deep`` benchmark send ``max_tokens=256`` to
Llama-3.1-8B-Instruct; the SkyLB scenarios (``sim/scenarios.py``) pass ``max_tokens=256`` and
``thought_tokens=256``: every node writes its whole budget, an upper bound on the real model's
(unmeasured) outputs. ``fork_root=True`` forks at the root too, as that client and benchmark do
(2 + 4 + 8 + 16 = 30 calls per 2-branch tree instead of the paper's 15).
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

from .datasets import GsmQuestion, load_gsm8k
from .model import Call, ClosedLoopSpec, Program, ProgramStream, Workload
from .text import rng_for, words

TOT_INSTRUCTION = ("Solve the following grade-school math problem step by step. "
                   "Propose one reasoning step at a time.\n")
DEFAULT_DEPTH = 4
_CALC = re.compile(r"<<[^>]*>>")


def answer_steps(answer: str) -> list[str]:
    """GSM8K rationale lines without ``<<calc>>`` annotations and without the ``#### n`` line."""
    steps = [_CALC.sub("", s).strip() for s in answer.split("\n")]
    return [s for s in steps if s and not s.startswith("####")] or [answer.strip() or "think"]


def thought_tokens_for(q: GsmQuestion) -> int:
    """Default output length of a node: ceil(len(cleaned rationale)/4), clipped to [16, 512]."""
    return min(512, max(16, math.ceil(len("\n".join(answer_steps(q.answer))) / 4)))


def thought_text(q: GsmQuestion, path: tuple[int, ...], n_chars: int, seed: int) -> str:
    """Deterministic synthetic thought of a node at ``path`` (branch indexes from the root): the
    rationale steps rotated by depth+branch, padded with seeded words, cut to ``n_chars``."""
    steps = answer_steps(q.answer)
    rot = (len(path) + sum(path)) % len(steps)
    head = f"Option {'.'.join(map(str, path)) or 'root'}: " + " ".join(steps[rot:] + steps[:rot])
    if len(head) >= n_chars:
        return head[:n_chars]
    pad = words(n_chars - len(head) - 1, rng_for(seed, q.idx, 104729, *path))
    return head + " " + pad


def tot_program(q: GsmQuestion, branching: int, region: str, program_id: str, *, depth: int = DEFAULT_DEPTH,
                seed: int = 0, salt: str = "", session_key: str | None = None,
                thought_tokens: int | None = None, tenant: str | None = None,
                max_tokens: int | None = None, fork_root: bool = False) -> Program:
    """A tree of 1 + b + ... + b^(depth-1) calls in BFS order (b + ... + b^depth with ``fork_root``);
    each child depends on its parent.

    Node prompt = instruction + [salt] + question + one ``"Thought: ..."`` line per ancestor, so a
    parent's prompt is a strict prefix of each child's prompt (the parent's output is appended).
    Each node writes ``thought_tokens`` (default: the question's rationale length), clipped to
    ``max_tokens`` when the client sends one.
    """
    if branching < 1 or depth < 1:
        raise ValueError(f"branching and depth must be >= 1, got {branching}, {depth}")
    out_tok = thought_tokens or thought_tokens_for(q)
    if max_tokens is not None:
        out_tok = min(out_tok, max_tokens)
    key = session_key or f"gsm8k-{q.idx}"
    root_prompt = f"{TOT_INSTRUCTION}{salt}Question: {q.question}\n"
    calls: list[Call] = []
    # frontier entries: (call index, path, prompt)
    frontier: list[tuple[int | None, tuple[int, ...], str]] = (
        [(None, (b,), root_prompt) for b in range(branching)] if fork_root else [(None, (), root_prompt)])
    for level in range(depth):
        nxt = []
        for parent, path, prompt in frontier:
            idx = len(calls)
            calls.append(Call(prompt=prompt, output_tokens=out_tok, session_key=key,
                              depends_on=() if parent is None else (parent,), tenant=tenant, max_tokens=max_tokens))
            if level + 1 < depth:
                thought = thought_text(q, path, out_tok * 4, seed)
                child_prompt = prompt + f"Thought: {thought}\n"
                nxt.extend((idx, path + (b,), child_prompt) for b in range(branching))
        frontier = nxt
    return Program(program_id, region, calls)


def tot_size(branching: int, depth: int = DEFAULT_DEPTH, fork_root: bool = False) -> int:
    return sum(branching ** d for d in range(1 if fork_root else 0, depth + (1 if fork_root else 0)))


def _question_pools(qs: list[GsmQuestion], regions: list[str], seed: int) -> dict[str, list[GsmQuestion]]:
    order = list(qs)
    random.Random(f"{seed}:gsm8k:order").shuffle(order)
    pools = {r: order[i::len(regions)] for i, r in enumerate(regions)}
    return {r: (p or order) for r, p in pools.items()}


def _stream(pool: list[GsmQuestion], region: str, branching: int, seed: int, depth: int,
            thought_tokens: int | None, **node_kw) -> ProgramStream:
    n = len(pool)

    def make(i: int) -> Program:
        cycle, j = divmod(i, n)
        q = pool[j]
        suffix = f"#{region}.c{cycle}" if cycle else ""
        return tot_program(q, branching, region, f"tot{branching}:{region}:{i}:q{q.idx}{suffix}", depth=depth,
                           seed=seed, salt=f"[{region}#{cycle}] " if cycle else "",
                           session_key=f"gsm8k-{q.idx}{suffix}", thought_tokens=thought_tokens, **node_kw)

    return ProgramStream(make)


def tot(branching: int | dict[str, int] = 2, clients: dict[str, int] | None = None,
        path: str | Path | None = None, seed: int = 0, *, depth: int = DEFAULT_DEPTH,
        thought_tokens: int | None = None, think_time_s: float = 0.0, name: str | None = None,
        max_tokens: int | None = None, fork_root: bool = False) -> Workload:
    """Closed-loop ToT. ``branching`` may be per region. Regions get disjoint, seeded slices of the
    questions; a region that exhausts its slice repeats it with a salt (``[region#cycle]`` after the
    instruction) and ``#<region>.c<cycle>`` keys, so repeats are new trees that still share the instruction.
    ``thought_tokens`` / ``max_tokens`` / ``fork_root``: see the module docstring."""
    clients = dict({"us": 40, "eu": 20, "asia": 20} if clients is None else clients)
    qs = load_gsm8k(path)
    if not qs:
        raise ValueError(f"no GSM8K questions in {path or 'the shipped fixture'}")
    br = branching if isinstance(branching, dict) else {r: branching for r in clients}
    missing = [r for r in clients if r not in br]
    if missing:
        raise ValueError(f"tot: no branching factor for regions {missing}")
    pools = _question_pools(qs, list(clients), seed)
    streams = {r: _stream(pools[r], r, br[r], seed, depth, thought_tokens, max_tokens=max_tokens, fork_root=fork_root)
               for r in clients}
    return Workload(
        name=name or "tot",
        description=f"Tree-of-Thoughts on GSM8K, depth {depth}, branching {br}, clients {clients}",
        closed=ClosedLoopSpec(clients=clients, programs=streams, think_time_s=think_time_s),
        meta={"branching": br, "depth": depth, "seed": seed, "max_tokens": max_tokens, "fork_root": fork_root},
    )


def mixed_tot(clients: dict[str, int] | None = None, branching: dict[str, int] | None = None,
              path: str | Path | None = None, seed: int = 0, **kw) -> Workload:
    """SkyLB "Mixed Tree": US runs 4-branch trees with 2 clients; EU/Asia 2-branch trees, 20 clients each."""
    clients = dict({"us": 2, "eu": 20, "asia": 20} if clients is None else clients)
    branching = dict({"us": 4, "eu": 2, "asia": 2} if branching is None else branching)
    return tot(branching, clients, path, seed, name="mixed-tot", **kw)
