"""Which targets may be sent a request now: blind pushing, SP-O and SP-P (SkyLB §3.3).

Two sources of truth are combined per target:

* **replica stats** (:class:`ReplicaStats`): what the engine reported — waiting (pending) and running
  requests, KV-cache usage — with the time it was measured. They reach the router late
  (Ray Serve polls them every ``request_routing_stats_period_s``; measured lag 0.3-0.6 s).
* **the router's own in-flight accounting**: counted at dispatch, uncounted on completion, cancel
  or error, and never reset by a stats refresh.

Modes:

* ``bp`` — blind pushing: every target is always available.
* ``sp-o`` — selective pushing by outstanding requests: available while the router's in-flight count
  is below ``max_outstanding``.
* ``sp-p`` — selective pushing by pending requests (SkyLB): available only if the engine has nothing
  waiting. Naively that herds: between two stats refreshes every new request would see the same
  "empty" replica. So a report grants an estimate of what the engine can still admit without
  queueing — nothing if anything is waiting; otherwise ``min(max_num_seqs - running, max_burst)``
  request *slots* (``unknown_headroom`` if the report has no capacity fields) and, when it reports KV
  usage and size, a *KV budget* of free tokens. Each request dispatched after the report was measured
  spends a slot and its prompt tokens (``request_tokens`` when its size is unknown); requests the
  report already counted that complete afterwards give slots back (once the reported waiting queue
  is drained). A target with no slot left, or less KV budget left than one typical request
  (``request_tokens``), is unavailable until the next report,
  however idle it looked: "a replica that was just sent work is no longer known to be empty".
  ``max_burst`` is only a safety cap on slots for very stale reports; the KV budget is what tracks
  the engine's real admission limit.

Everything is O(1) per event and the set of available targets is maintained incrementally, so a
routing decision never scans all targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat
from typing import Dict, Hashable, Iterable, Optional, Set, Tuple

__all__ = ["ReplicaStats", "LoadTracker", "AVAILABILITY_MODES", "MAX_TTFT_SAMPLES", "parse_ttft_samples"]

AVAILABILITY_MODES = ("bp", "sp-o", "sp-p")
#: most TTFT samples one report may carry (a replica sends only those since its previous report)
MAX_TTFT_SAMPLES = 1024


def _nonneg_number(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what} must be a number, got {v!r}")
    x = float(v)
    if not (x >= 0.0 and math.isfinite(x)):
        raise ValueError(f"{what} must be finite and >= 0, got {v!r}")
    return x


def parse_ttft_samples(v) -> Optional[Tuple[Tuple[float, float], ...]]:
    """Validate a report's ``ttft_samples``: a list of ``[uncached_prompt_tokens, ttft_s]`` pairs
    (finite numbers >= 0), at most :data:`MAX_TTFT_SAMPLES`. ``None`` / empty -> None; anything else
    -> ``ValueError`` naming the bad entry (the whole report is then rejected, like any bad field)."""
    if v is None:
        return None
    if isinstance(v, (str, bytes, dict)) or not isinstance(v, (list, tuple)):
        raise ValueError(f"ttft_samples must be a list of [uncached_tokens, ttft_s] pairs, got {type(v).__name__}")
    if len(v) > MAX_TTFT_SAMPLES:
        raise ValueError(f"ttft_samples has {len(v)} samples; at most {MAX_TTFT_SAMPLES} per report")
    out = []
    for i, pair in enumerate(v):
        if isinstance(pair, (str, bytes, dict)) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"ttft_samples[{i}] must be an [uncached_tokens, ttft_s] pair, got {pair!r}")
        out.append((_nonneg_number(pair[0], f"ttft_samples[{i}][0] (uncached tokens)"),
                    _nonneg_number(pair[1], f"ttft_samples[{i}][1] (ttft_s)")))
    return tuple(out) or None


@dataclass
class ReplicaStats:
    """One engine report. ``timestamp`` is when it was measured, on the router's clock.

    ``ttft_samples`` (optional): ``((uncached_prompt_tokens, ttft_s), ...)`` of the requests whose
    first token the replica produced since its previous report -- what a cost policy's online t_p
    regression learns from (:meth:`~ray_geolb.policy.base.Policy.observe_ttft`).
    """

    num_waiting: int = 0
    num_running: int = 0
    kv_cache_usage: Optional[float] = None
    timestamp: float = 0.0
    max_num_seqs: Optional[int] = None
    num_gpu_blocks: Optional[int] = None
    block_tokens: Optional[int] = None
    ttft_samples: Optional[Tuple[Tuple[float, float], ...]] = None

    _ALIASES = {
        "num_waiting": ("num_waiting", "num_waiting_reqs", "waiting", "pending"),
        "num_running": ("num_running", "num_running_reqs", "running"),
        "kv_cache_usage": ("kv_cache_usage", "kv_usage", "gpu_cache_usage"),
        "timestamp": ("timestamp", "ts"),
        "max_num_seqs": ("max_num_seqs",),
        "num_gpu_blocks": ("num_gpu_blocks",),
        "block_tokens": ("block_tokens", "block_size"),
    }

    @classmethod
    def from_dict(cls, d: dict, default_timestamp: float = 0.0) -> "ReplicaStats":
        """Parse a stats dict as vLLM (SchedulerStats names) or our emulated engine reports it."""
        if not isinstance(d, dict):
            raise TypeError(f"replica stats must be a dict, got {type(d).__name__}")
        vals = {}
        for field, names in cls._ALIASES.items():
            for n in names:
                if d.get(n) is not None:
                    vals[field] = d[n]
                    break
        s = cls(
            num_waiting=int(vals.get("num_waiting", 0)),
            num_running=int(vals.get("num_running", 0)),
            kv_cache_usage=None if vals.get("kv_cache_usage") is None else float(vals["kv_cache_usage"]),
            timestamp=float(vals.get("timestamp", default_timestamp)),
            max_num_seqs=None if vals.get("max_num_seqs") is None else int(vals["max_num_seqs"]),
            num_gpu_blocks=None if vals.get("num_gpu_blocks") is None else int(vals["num_gpu_blocks"]),
            block_tokens=None if vals.get("block_tokens") is None else int(vals["block_tokens"]),
            ttft_samples=parse_ttft_samples(d.get("ttft_samples")),
        )
        if s.num_waiting < 0 or s.num_running < 0:
            raise ValueError(f"replica stats have negative counts: {d!r}")
        return s


class _Target:
    __slots__ = ("inflight", "stats", "unseen", "unseen_tokens", "completed_seen", "credits", "kv_budget",
                 "tokens_inflight")

    def __init__(self):
        self.inflight: Dict[Hashable, tuple] = {}  # request id -> (dispatch time, tokens)
        self.stats: Optional[ReplicaStats] = None
        self.unseen = 0  # in flight, dispatched after stats.timestamp
        self.unseen_tokens = 0  # their prompt tokens
        self.completed_seen = 0  # completed since the report, and counted by it
        self.credits = 0  # request slots granted by the report
        self.kv_budget: Optional[float] = None  # free KV tokens at the report (None: not reported)
        self.tokens_inflight = 0


class LoadTracker:
    """Per-target load and availability; see the module docstring."""

    def __init__(
        self,
        mode: str = "sp-p",
        max_outstanding: int = 8,
        unknown_headroom: int = 1,
        max_burst: int = 32,
        request_tokens: int = 1024,
        seen_margin_s: float = 0.0,
    ):
        if mode not in AVAILABILITY_MODES:
            raise ValueError(f"availability mode must be one of {AVAILABILITY_MODES}, got {mode!r}")
        for name, v in (("max_outstanding", max_outstanding), ("unknown_headroom", unknown_headroom),
                        ("max_burst", max_burst), ("request_tokens", request_tokens)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not (isinstance(seen_margin_s, (int, float)) and seen_margin_s >= 0):
            raise ValueError(f"seen_margin_s must be a number >= 0, got {seen_margin_s!r}")
        #: a request dispatched less than this before a report was measured is not assumed to be
        #: in it (in a real deployment it may still be in the API server / on the wire)
        self.seen_margin_s = float(seen_margin_s)
        self.mode = mode
        self.max_outstanding = max_outstanding
        self.unknown_headroom = unknown_headroom
        self.max_burst = max_burst
        self.request_tokens = request_tokens
        self._t: Dict[Hashable, _Target] = {}
        self._out: Dict[Hashable, int] = {}  # target -> len(inflight), for C-level bulk reads
        self.available: Set[Hashable] = set()
        self._req_target: Dict[Hashable, Hashable] = {}

    # ------------------------------------------------------------ membership
    def add_target(self, target: Hashable) -> None:
        if target not in self._t:
            st = _Target()
            self._t[target] = st
            self._out[target] = 0
            st.credits = self.unknown_headroom
            self._refresh(target, st)

    def remove_target(self, target: Hashable) -> None:
        st = self._t.pop(target, None)
        self._out.pop(target, None)
        self.available.discard(target)
        if st is not None:
            for rid in st.inflight:
                self._req_target.pop(rid, None)

    def set_targets(self, targets: Iterable[Hashable]) -> None:
        want = set(targets)
        for t in list(self._t):
            if t not in want:
                self.remove_target(t)
        for t in want:
            self.add_target(t)

    @property
    def targets(self):
        return self._t.keys()

    # ------------------------------------------------------------ events
    def on_stats(self, target: Hashable, stats: ReplicaStats) -> None:
        st = self._t.get(target)
        if st is None:
            self.add_target(target)
            st = self._t[target]
        if st.stats is not None and stats.timestamp < st.stats.timestamp:
            return  # an older report arrived late: keep the newer one
        st.stats = stats
        ts = stats.timestamp - self.seen_margin_s
        n = tok = 0
        for t, k in st.inflight.values():
            if t > ts:
                n += 1
                tok += k
        st.unseen, st.unseen_tokens = n, tok
        st.completed_seen = 0
        st.credits, st.kv_budget = self._headroom(stats)
        self._refresh(target, st)

    def _headroom(self, s: ReplicaStats):
        """(request slots, free KV tokens or None) that a report grants."""
        kv = None
        if s.kv_cache_usage is not None and s.num_gpu_blocks and s.block_tokens:
            kv = max(0.0, (1.0 - s.kv_cache_usage) * s.num_gpu_blocks * s.block_tokens)
        if s.num_waiting > 0:
            return 0, kv
        if s.max_num_seqs is not None:
            return min(self.max_burst, max(0, s.max_num_seqs - s.num_running)), kv
        if kv is not None:
            return self.max_burst, kv
        return min(self.unknown_headroom, self.max_burst), kv

    def on_dispatch(self, target: Hashable, request_id: Hashable, now: float, tokens: int = 0) -> None:
        st = self._t.get(target)
        if st is None:
            self.add_target(target)
            st = self._t[target]
        if request_id in st.inflight:
            return  # counted once, however often the caller reports it
        tokens = tokens if tokens > 0 else self.request_tokens
        st.inflight[request_id] = (now, tokens)
        self._out[target] = len(st.inflight)
        st.tokens_inflight += tokens
        self._req_target[request_id] = target
        if st.stats is None or now > st.stats.timestamp - self.seen_margin_s:
            st.unseen += 1
            st.unseen_tokens += tokens
        self._refresh(target, st)

    def on_complete(self, request_id: Hashable, target: Hashable = None) -> bool:
        """Uncount a request (completion, cancel or error). Returns False if it was not in flight."""
        if target is None:
            target = self._req_target.get(request_id)
        st = self._t.get(target)
        if st is None:
            self._req_target.pop(request_id, None)
            return False
        entry = st.inflight.pop(request_id, None)
        self._req_target.pop(request_id, None)
        if entry is None:
            return False
        self._out[target] = len(st.inflight)
        t, tok = entry
        st.tokens_inflight = max(0, st.tokens_inflight - tok)
        if st.stats is None or t > st.stats.timestamp - self.seen_margin_s:
            st.unseen = max(0, st.unseen - 1)
            st.unseen_tokens = max(0, st.unseen_tokens - tok)
        else:
            st.completed_seen += 1
        self._refresh(target, st)
        return True

    # ------------------------------------------------------------ queries
    def _refresh(self, target: Hashable, st: _Target) -> None:
        if self._is_available(st):
            self.available.add(target)
        else:
            self.available.discard(target)

    def _is_available(self, st: _Target) -> bool:
        mode = self.mode
        if mode == "bp":
            return True
        if mode == "sp-o":
            return len(st.inflight) < self.max_outstanding
        waiting = st.stats.num_waiting if st.stats is not None else 0
        freed = max(0, st.completed_seen - waiting)
        if st.credits + freed - st.unseen <= 0:
            return False
        return st.kv_budget is None or st.kv_budget - st.unseen_tokens >= self.request_tokens

    def is_available(self, target: Hashable) -> bool:
        return target in self.available

    def outstanding(self, target: Hashable) -> int:
        return self._out.get(target, 0)

    def outstanding_of(self, targets: Iterable[Hashable]) -> list:
        """``[outstanding(t) for t in targets]``, in C (one dict lookup per target)."""
        targets = targets if isinstance(targets, (list, tuple)) else list(targets)
        return list(map(self._out.get, targets, repeat(0, len(targets))))

    def stats(self, target: Hashable) -> Optional[ReplicaStats]:
        st = self._t.get(target)
        return st.stats if st is not None else None

    def unseen(self, target: Hashable) -> int:
        st = self._t.get(target)
        return st.unseen if st is not None else 0

    def unseen_tokens(self, target: Hashable) -> int:
        """Prompt tokens of in-flight requests dispatched after the target's last report."""
        st = self._t.get(target)
        return st.unseen_tokens if st is not None else 0

    def tokens_inflight(self, target: Hashable) -> int:
        st = self._t.get(target)
        return st.tokens_inflight if st is not None else 0

    def total_outstanding(self) -> int:
        return sum(self._out.values())
