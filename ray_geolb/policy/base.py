"""The policy interface every router (simulated or in Ray Serve) drives.

A policy routes requests over a set of *targets* (replica ids). The driver calls:

* ``set_targets(ids)`` when the replica set changes;
* ``choose(req, now, candidates=None)`` → a :class:`Decision`, or ``None`` to *hold* the request at the
  load balancer (selective pushing: nothing eligible is available now; retry later, FCFS);
* ``on_dispatch(req, target, now)`` once the request is really sent (affinity state and in-flight
  accounting are updated here, not in ``choose``, so a rejected or retried choice leaves no trace);
* ``on_complete(req_id, target, now, ...)`` on completion, cancellation or error;
* ``on_stats(target, stats)`` whenever a replica report arrives;
* ``observe_ttft(target, uncached_tokens, ttft_s)`` for each TTFT a replica measured itself (Ray
  Serve: the report's ``ttft_samples``; the simulator instead passes ``ttft_s`` to ``on_complete``).

A driver that picks a replica before the send is confirmed (Ray Serve's router) also calls
``reserve`` / ``release`` around that gap, ``revalidate`` before it holds a request, and
``set_headroom_share`` / ``set_seen_margin`` to say how it sees the replicas. The policy's
:class:`~ray_geolb.policy.availability.LoadTracker` is its own: drivers call these methods, never it.

A policy is assembled from small pieces: a :class:`~ray_geolb.policy.availability.LoadTracker`
(which targets are eligible), an optional prefix index or hash ring (how they are scored) and a
picker (``_pick``). Each algorithm lives in its own short file under ``policy/algorithms``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice
from operator import le
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    FrozenSet,
    Hashable,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

from .availability import LoadTracker, ReplicaStats
from .config import PolicyConfig
from .prefix_index import PrefixIndex, PreparedText

__all__ = ["RouteRequest", "Decision", "Policy", "UnknownPolicyError", "least_loaded"]


@dataclass
class RouteRequest:
    """What a policy sees of a request. ``text`` is the canonical prompt text.

    A request also carries two memos from ``choose`` to ``on_dispatch`` (the same object goes through
    both), each behind a method that says what it holds:

    * :meth:`prepared_for` -- the text hashed into one prefix index's blocks, computed once per
      index (the local policy's index, the region layer's snapshot);
    * :meth:`note_pricing` / :meth:`pricing_by` -- what a cost policy priced at choice time (the
      estimated cached tokens per replica and the replicas priced), read back at dispatch.

    ``reply_span`` is where the last reply a chat carries back lies in ``text`` (``canonical.reply_span``; None:
    no such reply): a policy that :attr:`~Policy.infers_replies` credits a replica known to hold the turn that
    reply answered with the reply too (``matching.through_reply``).

    ``driver_data`` is the driver's own: policies never read it; it is handed back to the driver's
    hooks (the simulator's oracle ``cache_probe`` keeps the prompt's KV block hashes there).
    """

    request_id: str
    text: str
    session_key: Optional[str] = None
    prompt_tokens: int = 0
    output_tokens_hint: int = 0
    region: Optional[str] = None
    allowed_regions: Optional[FrozenSet[str]] = None
    tenant: Optional[str] = None
    hops: int = 0
    reply_span: Optional[Tuple[int, int]] = None
    driver_data: Any = field(default=None, repr=False, compare=False)
    _prepared: Dict[int, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _pricing: Dict[int, Tuple[Dict[Hashable, float], Sequence[Hashable]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

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

    def prepared_for(self, index) -> Any:
        """``index.prepare(self.text)``, computed once per index object and kept with the request."""
        key = id(index)
        p = self._prepared.get(key)
        if p is None:
            p = self._prepared[key] = index.prepare(self.text)
        return p

    def share_prepared(self, other: "RouteRequest") -> None:
        """Reuse ``other``'s :meth:`prepared_for` results (the same prompt text, hashed by another
        layer of the same process for the same index objects). ValueError if the texts differ."""
        if other.text != self.text:
            raise ValueError("share_prepared: the requests' texts differ")
        for key, p in other._prepared.items():
            self._prepared.setdefault(key, p)

    def note_pricing(self, owner: Any, hits: Dict[Hashable, float], priced: Sequence[Hashable]) -> None:
        """Record what ``owner`` (a cost policy) priced for this request: estimated cached tokens per
        target and the targets it priced (the last call wins)."""
        self._pricing[id(owner)] = (hits, priced)

    def pricing_by(self, owner: Any) -> Optional[Tuple[Dict[Hashable, float], Sequence[Hashable]]]:
        """``(hits, priced)`` as ``owner`` last noted them, or None if it never priced this request."""
        return self._pricing.get(id(owner))


@dataclass
class Decision:
    target: Hashable
    matched: int = 0  # matched prefix length (bytes of canonical text) at the chosen target
    reason: str = ""


class UnknownPolicyError(ValueError):
    """A policy config names no known policy, or another policy than the class it is given to."""


def least_loaded(targets: Sequence[Hashable], tracker: LoadTracker, rng: random.Random) -> Hashable:
    """The target with the fewest router-side in-flight requests; random among ties.

    Reservoir sampling over ``targets`` in order: a target with fewer in-flight requests than all
    before it becomes the pick (the tie count restarts), one that equals the running minimum
    replaces the pick with probability 1/ties (one ``rng.random()`` draw each). The loads, their
    running minimum and the positions that can change the pick are computed in C, so only those
    positions (new minima and ties) cost Python work; the draws are exactly those of a plain
    left-to-right scan.
    """
    if not isinstance(targets, (list, tuple)):
        targets = list(targets)
    n = len(targets)
    if n <= 1:
        return targets[0] if n else None
    loads = tracker.outstanding_of(targets)
    mins = accumulate(loads, min)  # mins[i] = min(loads[:i+1]); paired with loads[i+1] below
    best, best_n, ties = targets[0], loads[0], 1
    for i in compress(range(1, n), map(le, islice(loads, 1, None), mins)):
        v = loads[i]
        if v < best_n:
            best, best_n, ties = targets[i], v, 1
        else:
            ties += 1
            if rng.random() * ties < 1.0:
                best = targets[i]
    return best


class Policy:
    """Base class: availability + bookkeeping. Subclasses implement ``_pick``."""

    name: ClassVar[str] = "base"
    #: the policy's pydantic config (a :class:`PolicyConfig` whose ``name`` is the literal ``name``)
    Config: ClassVar[Type[PolicyConfig]]
    #: default availability mode when the config does not say (the paper's choice for this system)
    default_availability: ClassVar[str] = "bp"
    #: SP-P's defaults when the config does not say (``AvailabilityConfig.max_burst`` / ``pending_allowance``)
    default_max_burst: ClassVar[int] = 32
    default_pending_allowance: ClassVar[int] = 0
    default_slots_by_uncached_share: ClassVar[bool] = False

    def __init__(self, config=None, targets: Iterable[Hashable] = (), cache_probe: Callable = None):
        self.config = self.parse_config(config)
        av = self.config.availability
        self.tracker = LoadTracker(
            mode=av.mode or self.default_availability,
            max_outstanding=av.max_outstanding,
            unknown_headroom=av.unknown_headroom,
            max_burst=av.max_burst if av.max_burst is not None else self.default_max_burst,
            request_tokens=av.request_tokens,
            seen_margin_s=av.seen_margin_s,
            stale_report_s=av.stale_report_s,
            prefill_budget_reports=av.prefill_budget_reports,
            slots_by_uncached_share=av.slots_by_uncached_share if av.slots_by_uncached_share is not None else
            self.default_slots_by_uncached_share,
            pending_allowance=av.pending_allowance if av.pending_allowance is not None else
            self.default_pending_allowance,
        )
        #: SP-P's region gate (``AvailabilityConfig.gate``): the slots say *whether* to send, the pick *where*
        self.region_gate = av.gate == "region" and self.tracker.mode == "sp-p"
        self.rng = random.Random(self.config.seed)
        self.cache_probe = cache_probe
        self._targets: List[Hashable] = []
        self._target_set: FrozenSet[Hashable] = frozenset()
        self._all_available: Optional[List[Hashable]] = None  # last eligible() over all targets
        self.set_targets(targets)

    @classmethod
    def parse_config(cls, config=None) -> PolicyConfig:
        """This policy's config from None (the defaults), a dict of its ``Config`` fields (``name``
        optional) or a config object; a config naming another policy raises UnknownPolicyError."""
        if config is None:
            return cls.Config()
        if isinstance(config, dict):
            config = {"name": cls.name, **config}
            if config["name"] != cls.name:
                raise UnknownPolicyError(f"policy.name: config is for {config['name']!r}, not {cls.name!r}")
            return cls.Config.model_validate(config)
        if not isinstance(config, PolicyConfig):
            raise TypeError(f"policy config must be a dict or a PolicyConfig, got {type(config).__name__}")
        if config.name != cls.name:
            raise UnknownPolicyError(f"policy.name: config is for {config.name!r}, not {cls.name!r}")
        return config

    # ---------------------------------------------------------------- driver API
    def set_targets(self, targets: Iterable[Hashable]) -> None:
        targets = list(dict.fromkeys(targets))
        gone = self._target_set - set(targets)
        self._targets = targets
        self._target_set = frozenset(targets)
        self._target_pos = {t: i for i, t in enumerate(targets)}
        self.tracker.set_targets(targets)
        for t in gone:
            self._forget(t)
        self._targets_changed()

    @property
    def targets(self) -> List[Hashable]:
        return self._targets

    def in_target_order(self, ts: List[Hashable]) -> List[Hashable]:
        """``ts`` (targets of this policy) sorted by target order: a prefix index returns its ties
        in set order, which depends on string hashing; tie-breaking must not (reproducible runs)."""
        if len(ts) > 1:
            pos = self._target_pos
            ts = sorted(ts, key=lambda t: pos.get(t, len(pos)))
        return ts

    def available_view(self, eligible: List[Hashable]):
        """A set with the members of ``eligible`` (which :meth:`eligible` draws from the available
        set): the available set itself when nothing was filtered out, to save building one."""
        avail = self.tracker.available
        if (eligible is self._targets or eligible is self._all_available) and len(eligible) == len(avail):
            return avail
        return eligible

    def eligible(self, candidates: Optional[Iterable[Hashable]] = None) -> List[Hashable]:
        """Available targets, restricted to ``candidates`` if given (order: target order)."""
        avail = self.tracker.available
        if candidates is None:
            if len(avail) == len(self._targets):
                return self._targets
            el = self._all_available = list(filter(avail.__contains__, self._targets))
            return el
        return list(filter(avail.__contains__, candidates))

    def choose(self, req: RouteRequest, now: float,
               candidates: Optional[Iterable[Hashable]] = None) -> Optional[Decision]:
        if self.region_gate:
            return self._choose_gated(req, now, candidates)
        eligible = self.eligible(candidates)
        if not eligible:
            return None
        return self._pick(req, eligible, now)

    def _choose_gated(self, req: RouteRequest, now: float,
                      candidates: Optional[Iterable[Hashable]]) -> Optional[Decision]:
        """The region gate: the slots say *whether* (None while no replica has one), and every replica with
        room (``LoadTracker.has_room``) competes for *where*."""
        if candidates is not None and not isinstance(candidates, (list, tuple)):
            candidates = list(candidates)  # read twice below
        eligible = self.eligible(candidates)
        if not eligible:
            return None
        room = self.tracker.has_room
        pool = [t for t in (self._targets if candidates is None else candidates) if room(t)]
        return self._pick(req, pool if len(pool) > len(eligible) else eligible, now)

    def on_dispatch(self, req: RouteRequest, target: Hashable, now: float) -> None:
        self.reserve(req, target, now)  # the load count (a reservation made earlier is only dated again)
        self._record(req, target, now)
        if self.sibling_outbox is not None and self.index is not None:  # several routers share their inserts
            self.sibling_outbox.add("d", target, req.prepared_for(self.index))

    def on_complete(self, request_id: Hashable, target: Hashable = None, now: Optional[float] = None,
                    ttft_s: Optional[float] = None, ok: bool = True, req: RouteRequest = None) -> None:
        self.tracker.on_complete(request_id, target, now)

    def on_stats(self, target: Hashable, stats: ReplicaStats) -> None:
        if target in self._target_set:
            self.tracker.on_stats(target, stats)

    def learn_sibling_dispatch(self, req: Union[RouteRequest, PreparedText], target: Hashable, now: float) -> bool:
        """A sibling router (another ingress replica over the same targets) sent ``req`` (a request, or its
        prompt as this index's ``PreparedText``: a row of ``policy/region/sibling_inserts.py``) to ``target``:
        record it in this router's prefix index as if this router had sent it, with no load accounting
        (the sibling counts the request; the replicas' reports carry its load to every router). A policy
        without a prefix index keeps nothing. True if it was recorded."""
        idx = self.index
        if idx is None or target not in self._target_set:
            return False
        idx.insert(req if isinstance(req, PreparedText) else req.prepared_for(idx), target, now)
        return True

    #: this policy indexes the replies its replicas cached (:meth:`learn_reply`); the systems modelled on
    #: other routers index what they send, as those routers do
    learns_replies = False
    #: this policy credits a replica it sent a chat's previous turn with that turn's reply too
    #: (``RouteRequest.reply_span``, ``matching.through_reply``); the systems modelled on other routers do not
    infers_replies = False

    def learn_reply(self, text: Union[str, PreparedText], target: Hashable, now: float) -> bool:
        """A request this router sent to ``target`` finished, and ``text`` is its prompt followed by its reply
        (``canonical.text_with_reply``): the engine cached the reply's blocks as it decoded them, and a
        conversation's next turn starts with exactly this text. Record it in the prefix index as a dispatch
        to ``target`` (and in ``sibling_outbox`` for the sibling routers), so the next turn matches its whole
        history, not only the prompt before it -- a short first turn then still counts as a match. No load
        accounting. True if it was recorded (a policy that :attr:`learns_replies`, with an index, and a
        target it has)."""
        idx = self.index
        if not self.learns_replies or idx is None or target not in self._target_set:
            return False
        prepared = text if isinstance(text, PreparedText) else idx.prepare(text)
        idx.insert(prepared, target, now)
        if self.sibling_outbox is not None:
            self.sibling_outbox.add("d", target, prepared)
        return True

    def observe_ttft(self, target: Hashable, uncached_tokens: float, ttft_s: float) -> None:
        """A TTFT measured at ``target`` for a request with ``uncached_tokens`` prompt tokens to
        prefill (reported by the replica, e.g. ``ReplicaStats.ttft_samples``). Policies with an online
        TTFT model learn from it; the default ignores it."""

    # ---------------------------------------------------------------- accounting (a driver that
    # routes asynchronously: Ray Serve's router). The policy owns its LoadTracker; drivers call these.
    def reserve(self, req: RouteRequest, target: Hashable, now: float) -> None:
        """Count ``req`` at ``target`` from the moment it was picked, before it is really sent (two
        requests picked before the first is acknowledged must not both see the same headroom).
        :meth:`on_dispatch` of the same request later counts nothing twice; :meth:`release` undoes it."""
        self.tracker.on_dispatch(target, req.request_id, now, tokens=req.prompt_tokens,
                                 uncached=self.uncached_at(req, target), pooled=self.region_gate)

    def uncached_at(self, req: RouteRequest, target: Hashable) -> Optional[float]:
        """The prompt tokens ``req`` is expected to prefill at ``target`` (what SP-P's unreported-work cap
        counts); None: all of them. A cost policy answers from what it priced at choice time."""
        return None

    def release(self, request_id: Hashable, target: Hashable = None, now: Optional[float] = None) -> bool:
        """Uncount a reservation that will not be sent (retried, rejected, failed, cancelled): load
        only, no completion for the policy to learn from, and no slot a report granted (no report
        counted it). False if it was not counted."""
        return self.tracker.on_complete(request_id, target, now, reached_engine=False)

    @property
    def headroom_share(self) -> Tuple[int, int]:
        """``(rank, n)``: this router's share of each report's headroom (``(0, 1)``: all of it)."""
        return self.tracker.share

    def set_headroom_share(self, rank: int, n: int) -> None:
        """This driver is router ``rank`` of ``n`` over the same replicas (``LoadTracker.set_share``)."""
        self.tracker.set_share(rank, n)

    def set_seen_margin(self, seconds: float) -> None:
        """A request dispatched less than ``seconds`` before a report was measured is not assumed to
        be in it (reports from another process lag the engine). ValueError unless a number >= 0."""
        if not (isinstance(seconds, (int, float)) and seconds >= 0):
            raise ValueError(f"seen_margin_s must be a number >= 0, got {seconds!r}")
        self.tracker.seen_margin_s = float(seconds)

    def revalidate(self, now: float) -> int:
        """Re-check frozen reports of unavailable targets (``LoadTracker.revalidate``; O(targets):
        call it when a request would be held). Returns how many targets became available."""
        return self.tracker.revalidate(now)

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

    # ---------------------------------------------------------------- what the region layer reads
    # (ray_geolb.policy.region.local_layer.LocalLayer; besides targets, tracker, choose, on_dispatch)
    #: the prefix index of what this policy sent where (prefix policies); None: it keeps none
    index: Optional[PrefixIndex] = None
    #: several routers over the same targets: each dispatch's hash-only row goes here for the siblings
    #: (a ``policy/region/sibling_inserts.SiblingOutbox``, set by the driver); None: none is kept
    sibling_outbox: Optional[Any] = None
    #: the mean prompt length (tokens) this policy has seen; None: it does not track it
    mean_prompt_tokens: Optional[float] = None

    def region_t_p(self) -> Optional[float]:
        """Seconds per prefill token on these replicas as this policy prices them; None: this policy
        has no TTFT model (the region layer then uses its own prior)."""
        return None

    def queued_tokens(self, target: Hashable) -> Optional[float]:
        """Prefill tokens queued ahead of a new request at ``target``; None: not estimated here (the
        region layer then uses reported waiting + unseen dispatches at the mean prompt length)."""
        return None
