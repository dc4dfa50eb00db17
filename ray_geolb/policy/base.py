"""The policy interface every router (simulated or in Ray Serve) drives.

A policy routes requests over a set of *targets* (replica ids). The driver calls:

* ``set_targets(ids)`` when the replica set changes;
* ``choose(req, now, candidates=None)`` → a :class:`Decision`, or ``None`` to *hold* the request at the
  load balancer (selective pushing: nothing eligible is available now; retry later, FCFS);
* ``on_dispatch(req, target, now)`` once the request is really sent (affinity state and in-flight
  accounting are updated here, not in ``choose``, so a rejected or retried choice leaves no trace);
* ``on_complete(req_id, target, now, ...)`` on completion, cancellation or error;
* ``on_stats(target, stats)`` whenever a replica report arrives.

A policy is assembled from small pieces: a :class:`~ray_geolb.policy.availability.LoadTracker`
(which targets are eligible), an optional prefix index or hash ring (how they are scored) and a
picker (``_pick``). Each algorithm lives in its own short file under ``policy/algorithms``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, FrozenSet, Hashable, Iterable, List, Optional, Sequence

from .availability import LoadTracker, ReplicaStats
from .canonical import canonical_text

__all__ = ["RouteRequest", "Decision", "Policy", "register", "POLICIES", "least_loaded"]


@dataclass
class RouteRequest:
    """What a policy sees of a request. ``text`` is the canonical prompt text."""

    request_id: str
    text: str
    session_key: Optional[str] = None
    prompt_tokens: int = 0
    output_tokens_hint: int = 0
    region: Optional[str] = None
    allowed_regions: Optional[FrozenSet[str]] = None
    tenant: Optional[str] = None
    hops: int = 0
    # Per-request caches (hashed text per index geometry, GORGO features...).
    cache: Dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError("RouteRequest.request_id must be a non-empty string")
        if not isinstance(self.text, str):
            raise ValueError("RouteRequest.text must be a string (use canonical_text)")
        if self.prompt_tokens <= 0:
            self.prompt_tokens = max(1, len(self.text) // 4)
        if self.allowed_regions is not None:
            self.allowed_regions = frozenset(self.allowed_regions)
            if not self.allowed_regions:
                raise ValueError("RouteRequest.allowed_regions must not be empty (None means any region)")

    @classmethod
    def from_body(cls, request_id: str, body: Any, **kw) -> "RouteRequest":
        return cls(request_id=request_id, text=canonical_text(body), **kw)


@dataclass
class Decision:
    target: Hashable
    matched: int = 0  # matched prefix length (bytes of canonical text) at the chosen target
    reason: str = ""


POLICIES: Dict[str, type] = {}


def register(cls):
    """Class decorator: make a policy buildable by its ``name``."""
    POLICIES[cls.name] = cls
    return cls


def least_loaded(targets: Sequence[Hashable], tracker: LoadTracker, rng: random.Random) -> Hashable:
    """The target with the fewest router-side in-flight requests; random among ties."""
    best = None
    best_n = None
    ties = 0
    for t in targets:
        n = tracker.outstanding(t)
        if best_n is None or n < best_n:
            best, best_n, ties = t, n, 1
        elif n == best_n:
            ties += 1
            if rng.random() * ties < 1.0:  # reservoir sampling among ties
                best = t
    return best


class Policy:
    """Base class: availability + bookkeeping. Subclasses implement ``_pick``."""

    name: ClassVar[str] = "base"
    #: default availability mode when the config does not say (the paper's choice for this system)
    default_availability: ClassVar[str] = "bp"

    def __init__(self, config=None, targets: Iterable[Hashable] = (), cache_probe: Callable = None):
        from .config import config_for  # local import: config imports the algorithms' configs

        self.config = config_for(self.name, config)
        av = self.config.availability
        self.tracker = LoadTracker(
            mode=av.mode or self.default_availability,
            max_outstanding=av.max_outstanding,
            unknown_headroom=av.unknown_headroom,
            max_burst=av.max_burst,
            request_tokens=av.request_tokens,
        )
        self.rng = random.Random(self.config.seed)
        self.cache_probe = cache_probe
        self._targets: List[Hashable] = []
        self._target_set: FrozenSet[Hashable] = frozenset()
        self.set_targets(targets)

    # ---------------------------------------------------------------- driver API
    def set_targets(self, targets: Iterable[Hashable]) -> None:
        targets = list(dict.fromkeys(targets))
        gone = self._target_set - set(targets)
        self._targets = targets
        self._target_set = frozenset(targets)
        self.tracker.set_targets(targets)
        for t in gone:
            self._forget(t)
        self._targets_changed()

    @property
    def targets(self) -> List[Hashable]:
        return self._targets

    def eligible(self, candidates: Optional[Iterable[Hashable]] = None) -> List[Hashable]:
        """Available targets, restricted to ``candidates`` if given (order: target order)."""
        avail = self.tracker.available
        if candidates is None:
            if len(avail) == len(self._targets):
                return self._targets
            return [t for t in self._targets if t in avail]
        return [t for t in candidates if t in avail]

    def choose(self, req: RouteRequest, now: float, candidates: Optional[Iterable[Hashable]] = None) -> Optional[Decision]:
        eligible = self.eligible(candidates)
        if not eligible:
            return None
        return self._pick(req, eligible, now)

    def on_dispatch(self, req: RouteRequest, target: Hashable, now: float) -> None:
        self.tracker.on_dispatch(target, req.request_id, now, tokens=req.prompt_tokens)
        self._record(req, target, now)

    def on_complete(self, request_id: Hashable, target: Hashable = None, now: float = 0.0,
                    ttft_s: Optional[float] = None, ok: bool = True, req: RouteRequest = None) -> None:
        self.tracker.on_complete(request_id, target)

    def on_stats(self, target: Hashable, stats: ReplicaStats) -> None:
        if target in self._target_set:
            self.tracker.on_stats(target, stats)

    # ---------------------------------------------------------------- hooks
    def _pick(self, req: RouteRequest, eligible: List[Hashable], now: float) -> Decision:
        raise NotImplementedError

    def _record(self, req: RouteRequest, target: Hashable, now: float) -> None:
        """Update affinity state after a dispatch (prefix index insert, ...)."""

    def _forget(self, target: Hashable) -> None:
        """A target left: drop its affinity state."""

    def _targets_changed(self) -> None:
        """The target list changed (rings rebuild here)."""

    def describe(self) -> dict:
        return {"policy": self.name, "availability": self.tracker.mode}
