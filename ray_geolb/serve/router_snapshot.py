"""What a GeoPrefixRouter publishes for the region ingress of its process: :class:`RouterSnapshot`.

The router runs on Ray's router loop thread; the ingress decides on its own. So the ingress never
reads the router's live policy: after each event that changes what layer 1 reads -- a request
arriving or leaving Ray's queue, a routing decision (placed or held), routed, completed, a replica
report, a replica gone -- the router builds a new frozen snapshot on its own thread and publishes it
with one attribute swap (``router.snapshot = snapshot_of(router)``, :meth:`GeoPrefixRouter.publish`).
The ingress reads ``router.snapshot`` once per question and answers the ``LocalLayer`` protocol
(``policy/region/local_layer.py``) from that object alone (``serve/ingress/local_view.py``):
no lock, no retry, nothing to catch.

It holds the figures layer 1 reads: free slots and available replicas, the router's queue (requests
and prompt tokens), per replica its last report, unseen dispatches, requests in flight and queued
prefill tokens, the headroom share, the mean prompt length, the pooled ``t_p``, and the prefix
index with its change mark. The index is the one shared structure: it is far too large to copy at
every event, so the snapshot names it and the mark at which the figures were taken; only the cost
selector's match of a new prompt and this region's prefix summary read it (see ``RegionRouter``).

Pure: no Ray import, no serve import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Hashable, Mapping, Optional, Sequence, Tuple

__all__ = ["RouterSnapshot", "snapshot_of"]


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True)
class RouterSnapshot:
    """One published state of a GeoPrefixRouter (see the module docstring). Immutable: the mappings
    are read-only views of dicts built for this snapshot only, ``targets`` a sequence the policy
    replaces (never changes in place) when its replica set changes."""

    targets: Sequence[Hashable] = ()
    available: int = 0  # replicas SP-P would send a request to now (``num_available``)
    free_slots: int = 0  # requests the policy may still place (``LoadTracker.free_slots``)
    queue_len: int = 0  # requests waiting in the router (Ray's pending queue)
    queued_tokens: float = 0.0  # their prompt tokens (``RouterViews.queued_tokens``)
    #: per replica: its last report (``ReplicaStats``) or None; dispatches after that report; this
    #: router's requests in flight there; prefill tokens queued there (``policy.queued_tokens``)
    stats: Mapping[Hashable, Any] = field(default_factory=_empty)
    unseen: Mapping[Hashable, int] = field(default_factory=_empty)
    outstanding: Mapping[Hashable, int] = field(default_factory=_empty)
    engine_queued: Mapping[Hashable, Optional[float]] = field(default_factory=_empty)
    share: Tuple[int, int] = (0, 1)  # ``(rank, n)`` of each report's headroom
    mean_prompt_tokens: Optional[float] = None
    t_p: Optional[float] = None  # ``policy.region_t_p()``: the pooled fit, floor applied
    index: Any = None  # the policy's prefix index (shared, see the module docstring), or None
    index_mark: Optional[tuple] = None  # ``index.change_mark()`` when this was taken
    infers_replies: bool = False  # ``policy.infers_replies``: a match covering a chat's previous turn counts its reply


def snapshot_of(router) -> RouterSnapshot:
    """The snapshot of ``router`` now (on the router's thread). Reads its ``policy`` and
    ``num_available`` / ``free_slots`` / ``queue_len`` / ``queued_tokens``."""
    p = router.policy
    tr = p.tracker
    targets = p.targets
    index = p.index
    return RouterSnapshot(
        targets=targets,
        available=int(router.num_available()),
        free_slots=int(router.free_slots()),
        queue_len=int(router.queue_len()),
        queued_tokens=float(router.queued_tokens()),
        stats=MappingProxyType({t: tr.stats(t) for t in targets}),
        unseen=MappingProxyType({t: tr.unseen(t) for t in targets}),
        outstanding=MappingProxyType({t: tr.outstanding(t) for t in targets}),
        engine_queued=MappingProxyType({t: p.queued_tokens(t) for t in targets}),
        share=tuple(tr.share),
        mean_prompt_tokens=p.mean_prompt_tokens,
        t_p=p.region_t_p(),
        index=index,
        index_mark=None if index is None else index.change_mark(),
        infers_replies=bool(p.infers_replies),
    )
