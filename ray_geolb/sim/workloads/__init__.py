"""Workloads for the multi-region simulator (SkyLB §5, Ray Serve prefix-router blog, ServeGen, traces).

Data model
----------
* ``Call``: one LLM request: ``messages`` (OpenAI chat ``[{"role","content"}]``) *or* ``prompt``;
  ``output_tokens``; ``session_key`` (user/session/question id = consistent-hashing key);
  ``depends_on`` (indexes of earlier calls of the same program that must finish first); ``tenant``.
  ``Call.text`` renders the request as one string (prompt, or ``"role: content\\n"`` per message).
* ``Program``: ``program_id``, ``region`` (where the client sits), ``calls`` (a DAG in list order).
  A conversation is a chain (call k depends on k-1; messages = full history incl. the dataset's
  real replies; ``output_tokens = clip(ceil(len(real reply)/4), 1, 1024)``). A ToT tree is BFS
  ordered, children depend on their parent, parent prompt is a strict prefix of child prompts.
* ``ProgramStream``: deterministic lazily-built (usually infinite) sequence, ``stream[i]``.
* ``ClosedLoopSpec(clients={region: n}, programs={region: ProgramStream}, think_time_s)``: each client
  runs one program at a time, pulling the next one from its region's shared stream.
* ``OpenLoopSpec(arrivals=[(time_s, Program), ...])``, time-sorted, t=0 = run start.
* ``Workload(name, description, closed | open, meta)``.

Builders: ``conversation``, ``tot``, ``mixed_tot``, ``prefix_repetition``, ``diurnal``, ``servegen``,
``trace``, ``shared_context`` / ``shared_context_trace`` (long contexts shared across regions), ``geo_diurnal``
(open-loop multi-region day curves) and
``by_name("conversation:wildchat" | "tot" | "mixed-tot" | ... | "trace:PATH", **kw)``.

Re-used data: when a region runs out of conversations/questions it starts a new cycle in a fresh
seeded order; programs of cycle >= 1 are *new users*: ids and session keys get ``#<region>.c<cycle>``
and the first user message (conversations) or the text after the ToT instruction gets a short salt
``[<region>#<cycle>] ``, so a text-level prefix index does not see cross-user sharing that the real
data would not have (shared system prompts / the ToT instruction stay shared).

Everything is deterministic given ``seed``: ``random.Random(str)`` / ``numpy`` Generators seeded from
sha256 of keys, never global RNG state or Python's ``hash()``.
"""

from __future__ import annotations

from .conversation import COUNTRY_REGION, conversation, conversation_program, region_of_country
from .datasets import (
    Conversation,
    GsmQuestion,
    ServeGenWindow,
    fixture_path,
    load_conversations,
    load_gsm8k,
    load_servegen,
    load_sharegpt,
    load_wildchat,
)
from .geo_diurnal import geo_diurnal
from .model import Call, ClosedLoopSpec, OpenLoopSpec, Program, ProgramStream, Workload
from .prefix import prefix_repetition
from .servegen import servegen
from .shared_context import shared_context, shared_context_trace
from .tot import mixed_tot, tot, tot_program, tot_size
from .trace import trace


def diurnal(clients: dict[str, int] | None = None, base: str = "conversation", **kw) -> Workload:
    """SkyLB Fig. 10 regionally skewed load ("US working hours"): US 120 clients, EU/Asia 40 each,
    running ``base`` = ``"conversation"`` (kw: source, path, seed, ...) or ``"tot"`` (kw: branching, ...)."""
    clients = dict({"us": 120, "eu": 40, "asia": 40} if clients is None else clients)
    if base == "conversation":
        w = conversation(clients=clients, **kw)
    elif base == "tot":
        w = tot(clients=clients, **kw)
    else:
        raise ValueError(f"diurnal: base must be 'conversation' or 'tot', got {base!r}")
    w.name = f"diurnal:{base}"
    w.description = "regionally skewed (SkyLB Fig. 10): " + w.description
    return w


WORKLOAD_NAMES = ("conversation", "conversation:sharegpt", "conversation:wildchat", "tot", "mixed-tot",
                  "prefix-repetition", "diurnal", "diurnal:tot", "servegen", "trace:PATH", "shared-context",
                  "shared-context-trace", "geo-diurnal")


def by_name(spec: str, **kw) -> Workload:
    """Build a workload from a name (see ``WORKLOAD_NAMES``); ``kw`` go to the builder.
    ``prefix-repetition`` defaults to ``num_replicas=4`` when not given."""
    name, _, arg = spec.partition(":")
    if name == "conversation":
        return conversation(source=arg or kw.pop("source", "sharegpt"), **kw)
    if name == "tot" and not arg:
        return tot(**kw)
    if name in ("mixed-tot", "mixed_tot") and not arg:
        return mixed_tot(**kw)
    if name in ("prefix-repetition", "prefix_repetition") and not arg:
        kw.setdefault("num_replicas", 4)
        return prefix_repetition(**kw)
    if name == "diurnal":
        return diurnal(base=arg or kw.pop("base", "conversation"), **kw)
    if name == "servegen" and not arg:
        return servegen(**kw)
    if name == "shared-context" and not arg:
        return shared_context(**kw)
    if name == "shared-context-trace" and not arg:
        return shared_context_trace(**kw)
    if name == "geo-diurnal" and not arg:
        return geo_diurnal(**kw)
    if name == "trace":
        if not arg:
            raise ValueError("trace workload needs a path: 'trace:PATH'")
        return trace(arg, **kw)
    raise ValueError(f"unknown workload {spec!r}; valid: {', '.join(WORKLOAD_NAMES)}")


__all__ = [
    "Call", "ClosedLoopSpec", "Conversation", "COUNTRY_REGION", "GsmQuestion", "OpenLoopSpec", "Program",
    "ProgramStream", "ServeGenWindow", "Workload", "WORKLOAD_NAMES", "by_name", "conversation",
    "conversation_program", "diurnal", "fixture_path", "geo_diurnal", "load_conversations", "load_gsm8k",
    "load_servegen",
    "load_sharegpt", "load_wildchat", "mixed_tot", "prefix_repetition", "region_of_country", "servegen",
    "shared_context", "shared_context_trace", "tot", "tot_program", "tot_size", "trace",
]
