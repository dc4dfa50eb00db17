"""Ray Serve blog / vLLM ``PrefixRepetitionDataset`` workload: shared random prefixes + unique suffixes."""

from __future__ import annotations

from .model import Call, ClosedLoopSpec, Program, ProgramStream, Workload
from .text import CHARS_PER_TOKEN, rng_for, words


def prefix_repetition(num_replicas: int, num_prefixes: int = 32, prompts_per_replica: int = 512,
                      prefix_tokens: int = 512, suffix_tokens: int = 128, output_tokens: int = 128,
                      seed: int = 0, concurrency: int | None = None, region: str = "us") -> Workload:
    """``num_prefixes * num_replicas`` random prefixes, each followed by random suffixes, for
    ``prompts_per_replica * num_replicas`` single-call prompts, shuffled (blog: 512 prefix tokens,
    128 suffix tokens, 32 prefixes and 512 prompts per replica, concurrency 32 per replica).

    Closed loop with ``concurrency`` clients (default ``32 * num_replicas``) in ``region`` over a finite stream.
    Each program's ``session_key`` is ``prefix-<p>`` (the id of its shared prefix).
    """
    if num_replicas < 1 or num_prefixes < 1 or prompts_per_replica < 1:
        raise ValueError("num_replicas, num_prefixes and prompts_per_replica must be >= 1")
    n_prefixes = num_prefixes * num_replicas
    n_prompts = prompts_per_replica * num_replicas
    prefixes = [words(prefix_tokens * CHARS_PER_TOKEN, rng_for(seed, 1, p)) for p in range(n_prefixes)]
    rng = rng_for(seed, 2)
    # Even assignment of prompts to prefixes (the first n_prompts % n_prefixes get one more), then shuffle.
    assign = [i % n_prefixes for i in range(n_prompts)]
    order = rng.permutation(n_prompts).tolist()
    programs = []
    for k, i in enumerate(order):
        p = assign[i]
        suffix = words(suffix_tokens * CHARS_PER_TOKEN, rng_for(seed, 3, i))
        programs.append(Program(f"prefix-rep:{k}", region, [
            Call(prompt=prefixes[p] + suffix, output_tokens=output_tokens, session_key=f"prefix-{p}")]))
    conc = concurrency if concurrency is not None else 32 * num_replicas
    return Workload(
        name="prefix-repetition",
        description=(f"{n_prompts} prompts over {n_prefixes} shared prefixes ({prefix_tokens}+{suffix_tokens} "
                     f"tokens, out {output_tokens}), concurrency {conc} in {region}"),
        closed=ClosedLoopSpec(clients={region: conc}, programs={region: ProgramStream.from_list(programs)}),
        meta={"num_replicas": num_replicas, "num_prefixes_total": n_prefixes, "num_prompts": n_prompts,
              "prefix_chars": prefix_tokens * CHARS_PER_TOKEN, "seed": seed},
    )
