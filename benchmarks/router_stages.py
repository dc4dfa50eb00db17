"""The stages of a GeoPrefixRouter decision that ``profile_router_path.py`` (in one process) and
``bench_router.py --stages`` (in Serve) time: hashing the prompt, the tree walk and insert, the pricing, the
request book. Benchmark code only."""

from __future__ import annotations

import functools
import time

from ray_geolb.policy import base, cost_policy, prefix_index, prefix_policy
from ray_geolb.serve import request_book
from ray_geolb.serve.router import GeoPrefixRouter

STAGES = [
    (prefix_index.PrefixIndex, "prepare", "hash the prompt (PrefixIndex.prepare)"),
    (prefix_index.PrefixIndex, "match", "tree walk at choice (PrefixIndex.match)"),
    (prefix_index.PrefixIndex, "insert", "tree insert at dispatch (PrefixIndex.insert)"),
    (base.Policy, "choose", "policy.choose (incl. hash, walk, pricing)"),
    (cost_policy.CostPolicy, "costs", "  cost policies: costs() (incl. hash and walk)"),
    (prefix_policy.PrefixPolicy, "_record", "index insert via the policy (_record)"),
    (request_book.RequestBook, "new_entry", "request book: new entry (prompt text, RouteRequest)"),
    (request_book.RequestBook, "routed", "request book: routed (dispatch, in-flight, decision log)"),
    (request_book.RequestBook, "completed", "request book: completed"),
    (GeoPrefixRouter, "_choose", "GeoPrefixRouter._choose (everything at choice)"),
    (GeoPrefixRouter, "on_request_routed", "GeoPrefixRouter.on_request_routed"),
]


def wrap_stages(spent: dict, clock=time.perf_counter) -> list:
    """Wrap each of :data:`STAGES` in a timer that adds its ``clock`` seconds to ``spent[label]``; returns the
    originals, for :func:`unwrap_stages` (``profile_router_path.py``: ``perf_counter``; ``bench_router.py
    --stages``: thread CPU time)."""
    saved = []

    def wrap(owner, name, label):
        f = owner.__dict__[name]
        saved.append((owner, name, f))

        @functools.wraps(f)
        def timed(*a, **k):
            t0 = clock()
            try:
                return f(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + clock() - t0
        setattr(owner, name, timed)

    for owner, name, label in STAGES:
        wrap(owner, name, label)
    return saved


def unwrap_stages(saved: list) -> None:
    for owner, name, f in reversed(saved):
        setattr(owner, name, f)
