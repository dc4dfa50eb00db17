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
  is drained). Three races must not give a slot twice: a completion the router hears of within
  ``seen_margin_s`` after a report was measured may already be missing from it (the engine finished it,
  the notice was still on its way), so it frees nothing until the next report; a reservation released
  before it was sent never reached the engine, so no report counted it; and a reservation is dated
  again when it is really sent (a report measured in between could not have seen it). A target with
  no slot left, or less KV budget left than one typical request (``request_tokens``), is unavailable
  until the next report, however idle it looked: "a replica that was just sent work is no longer known
  to be empty".
  ``max_burst`` is only a safety cap on slots for very stale reports; the KV budget is what tracks
  the engine's real admission limit. Several routers over the same replicas (a region's ingress
  replicas) each take a share of every report and keep no more than their fixed part of an engine's
  sequence slots in flight there (:meth:`LoadTracker.set_share`).

  Four options refine it. **A pending allowance** (``pending_allowance`` k; 0 is SkyLB's rule): a report
  with at most k requests waiting still grants its slots less those k -- near KV saturation most reports
  catch a short queue, and SkyLB's rule then idles the engine for a report period and a half while the
  router holds what it could have started (GeoPrefix uses 8; measured in ``benchmarks/RESULTS.md``
  section 16). **An unreported-work cap** (``prefill_budget_reports``; off by default): a target takes no
  new request once the uncached prompt tokens sent to it since its last report reach that many report
  intervals of prefill at its rate (``prefill_rate``, set by the owning policy), so a burst is not granted
  to a replica mid-step.
  **Slots by uncached share** (``slots_by_uncached_share``; GeoPrefix's default, off for the others): a request
  spends the share of its prompt the target does not hold (as the policy priced its match there; all of it when
  unknown) of a slot, at least ``MIN_SLOT``; the target still takes no more requests than its report's free
  sequence slots (a report without the engine's size: one slot per request). One slot per request caps how many
  requests a replica takes per report whatever they cost it: at a peak, a replica that holds many conversations
  runs out of slots while its engine has nothing waiting, and its cache hits are sent to replicas that must
  prefill them in full, which costs the fleet the prefill and makes the next turns miss too (RESULTS.md section
  44). A new prompt, however short, still spends a whole slot: what the count also spreads is decode work, and
  spending slots by prefill tokens alone piled a burst of short new prompts onto one replica. A replica without a
  slot may still take a prompt it holds through a cost policy's holder pass (``CostConfig.holder_pass_share``),
  which asks :meth:`LoadTracker.has_sequence_room` (RESULTS.md section 45).

  **The gate** (``gate``; the policy applies it, ``Policy.choose``): SkyLB's ``"replica"`` sends a request
  only to a replica with a slot left. ``"region"`` makes the slots say *whether* to send and the policy's
  pick say *where*: the router still holds every request while no replica has a slot left, but while one
  has, the policy picks among every replica the engine still has room at (:meth:`LoadTracker.has_room`:
  the KV budget, and with several routers their fixed part of the slots). A request sent to a replica with
  no slot left spends a slot of the replica with the most (``on_dispatch(pooled=True)``), so the region
  still sends no more requests per report than its reports granted: without that, an overloaded region
  kept at home what SkyLB's rule would have forwarded (RESULTS.md section 42). The count-based limits --
  ``max_burst`` per report and the waiting allowance -- then decide only when to hold; a replica past them
  is priced by its queue (the cost policies' queued tokens) instead of being skipped. The KV budget stays a
  hard limit: without it, ToT's sibling bursts queued in the engine holding their prefix (RESULTS.md
  section 41).

A report can freeze: an engine left idle (e.g. by an aborted request) runs no further step, so it
may keep sending -- with fresh timestamps -- the figures it had, ``num_waiting=1`` included, and SP-P
would shun an idle replica for good. The tracker therefore **stops trusting** a report that says
something waits when (a) its figures (waiting, running, KV usage) have not changed for
``stale_report_s`` and (b) this router has had nothing in flight at that target for as long: the
waiting count is then ignored and the target gets ``unknown_headroom`` slots (no KV budget), so one
request probes it and the engine's next report is trusted again. The bound (5 s by default, ten of
GeoPrefixRouter's 0.5 s report periods) is long enough that a loaded engine -- whose KV usage and
running count change every step -- never matches it, and a legitimately waiting queue of another
router's requests keeps changing figures too. ``stale_report_s=None`` turns the rule off.

Reports are validated (:meth:`ReplicaStats.from_dict`): a non-finite or future timestamp (beyond
``max_future_s`` of clock skew), a NaN/inf/negative load or a KV usage outside [0, 1] raises
``ValueError`` naming the field; the caller counts and logs it and keeps the previous report.

Everything is O(1) per event and the set of available targets is maintained incrementally, so a
routing decision never scans all targets (:meth:`LoadTracker.revalidate`, which re-checks frozen
reports of unavailable targets, is O(targets) and meant for the hold path only).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from itertools import repeat
from typing import Callable, Dict, Hashable, Iterable, Optional, Set, Tuple

__all__ = ["ReplicaStats", "LoadTracker", "AVAILABILITY_MODES", "MAX_TTFT_SAMPLES", "parse_ttft_samples",
           "parse_engine_work", "EngineWorkError", "ENGINE_WORK_FIELDS", "ENGINE_WORK_OPTIONAL"]

AVAILABILITY_MODES = ("bp", "sp-o", "sp-p")
#: most TTFT samples one report may carry (a replica sends only those since its previous report)
MAX_TTFT_SAMPLES = 1024
#: ``slots_by_uncached_share``: the least part of a slot a request spends, however much of its prompt the target
#: holds (it still takes a sequence slot and decodes)
MIN_SLOT = 0.25
_SLOT_EPS = 1e-9  # float sums of slot parts: a remainder this small is no slot


def _replica_hash(target: Hashable) -> int:
    """A replica id's hash, the same in every router's process (which routers get a left-over slot)."""
    return zlib.crc32(str(target).encode())


def _nonneg_number(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what} must be a number, got {v!r}")
    x = float(v)
    if not (x >= 0.0 and math.isfinite(x)):
        raise ValueError(f"{what} must be finite and >= 0, got {v!r}")
    return x


def _count(v, what: str) -> int:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
        raise ValueError(f"replica stats have a negative {what}: {v!r}")
    x = _nonneg_number(v, what)
    if x != int(x):
        raise ValueError(f"{what} must be a whole number, got {v!r}")
    return int(x)


def _count_or_none(v, what: str) -> Optional[int]:
    return None if v is None else _count(v, what)


ENGINE_WORK_FIELDS = ("steps", "prefill_tokens", "decode_tokens", "busy_s")
#: optional ``engine_work`` counters (an older replica's report omits them and stays valid)
ENGINE_WORK_OPTIONAL = ("prefill_pairs",)


class EngineWorkError(ValueError):
    """A report's ``engine_work`` is malformed; ``field`` names the offending counter (``engine_work.<name>``,
    or ``engine_work`` for the whole value). A ``ValueError``: callers that reject bad reports catch it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def parse_engine_work(v) -> Optional[Tuple[float, ...]]:
    """Validate a report's ``engine_work``: ``{"steps", "prefill_tokens", "decode_tokens", "busy_s"}`` and
    optionally ``"prefill_pairs"`` (the summed ``P·(c + P/2)`` over prefill chunks: new tokens × tokens
    attended, the prefill-attention work), finite non-negative cumulative counters. Returns
    ``(steps, prefill_tokens, decode_tokens, busy_s)``, with ``prefill_pairs`` appended when the report has
    it; None if ``v`` is None. A bad value raises :class:`EngineWorkError` naming the field."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise EngineWorkError("engine_work", f"engine_work must be a dict of {ENGINE_WORK_FIELDS} (+ optional "
                                             f"{ENGINE_WORK_OPTIONAL}), got {type(v).__name__}")
    out = []
    for k in ENGINE_WORK_FIELDS + ENGINE_WORK_OPTIONAL:
        x = v.get(k)
        if x is None and k in ENGINE_WORK_OPTIONAL:
            continue
        try:
            out.append(_nonneg_number(x, f"engine_work.{k}"))
        except ValueError as e:
            raise EngineWorkError(f"engine_work.{k}", str(e)) from None
    return tuple(out)


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
    #: cumulative engine step work ``(steps, prefill_tokens, decode_tokens, busy_s[, prefill_pairs])`` since
    #: the engine started (report key ``engine_work``; :func:`parse_engine_work`); a cost policy differences
    #: two reports to fit t_p (and, with ``prefill_pairs``, the prefill-attention price per pair)
    engine_work: Optional[Tuple[float, ...]] = None

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
    def from_dict(cls, d: dict, default_timestamp: float = 0.0, now: Optional[float] = None,
                  max_future_s: float = 2.0) -> "ReplicaStats":
        """Parse a stats dict as vLLM (SchedulerStats names) or our emulated engine reports it.

        Raises ``ValueError`` naming the field for a non-finite timestamp, a timestamp more than
        ``max_future_s`` after ``now`` (when ``now`` is given: clock skew beyond that would make
        every later dispatch look counted by the report), a NaN/inf/negative count, or a KV usage
        that is not a finite fraction in [0, 1]."""
        if not isinstance(d, dict):
            raise TypeError(f"replica stats must be a dict, got {type(d).__name__}")
        vals = {}
        for field, names in cls._ALIASES.items():
            for n in names:
                if d.get(n) is not None:
                    vals[field] = d[n]
                    break
        kv = vals.get("kv_cache_usage")
        if kv is not None:
            kv = _nonneg_number(kv, "kv_cache_usage")
            if kv > 1.0:
                raise ValueError(f"kv_cache_usage must be a fraction in [0, 1], got {vals['kv_cache_usage']!r}")
        ts = vals.get("timestamp", default_timestamp)
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise ValueError(f"timestamp must be a finite number, got {ts!r}")
        ts = float(ts)
        if now is not None and ts > now + max_future_s:
            raise ValueError(f"timestamp {ts:.3f} is {ts - now:.3f} s in the future (more than "
                             f"{max_future_s:g} s of clock skew)")
        s = cls(
            num_waiting=_count(vals.get("num_waiting", 0), "num_waiting"),
            num_running=_count(vals.get("num_running", 0), "num_running"),
            kv_cache_usage=kv,
            timestamp=ts,
            max_num_seqs=_count_or_none(vals.get("max_num_seqs"), "max_num_seqs"),
            num_gpu_blocks=_count_or_none(vals.get("num_gpu_blocks"), "num_gpu_blocks"),
            block_tokens=_count_or_none(vals.get("block_tokens"), "block_tokens"),
            ttft_samples=parse_ttft_samples(d.get("ttft_samples")),
            engine_work=parse_engine_work(d.get("engine_work")),
        )
        return s


class _Target:
    __slots__ = ("inflight", "stats", "unseen", "unseen_tokens", "completed_seen", "credits", "kv_budget",
                 "tokens_inflight", "figures", "figures_since", "idle_since", "distrusted", "free", "unseen_prefill",
                 "work_mark", "prefill_budget", "quota", "unseen_slots", "seq_room", "seq_free")

    def __init__(self):
        self.figures: Optional[tuple] = None  # (waiting, running, kv usage) of the last report
        self.figures_since = 0.0  # report time at which these figures were first reported
        self.idle_since = -math.inf  # when this router last had nothing in flight here (-inf: never sent)
        self.distrusted = False  # the last report's waiting count is ignored (frozen report)
        self.inflight: Dict[Hashable, tuple] = {}  # request id -> (dispatch time, tokens, uncached tokens)
        self.stats: Optional[ReplicaStats] = None
        self.unseen = 0  # in flight, dispatched after stats.timestamp
        self.unseen_tokens = 0  # their prompt tokens
        self.unseen_prefill = 0  # their uncached prompt tokens (the prefill the last report cannot show)
        self.unseen_slots = 0.0  # the slots they spent (``slots_by_uncached_share``; else not kept)
        self.seq_free: Optional[int] = None  # the engine's free sequence slots at the report (None: not reported)
        self.seq_room: Optional[int] = None  # seq_free where the report granted slots, else None
        self.work_mark: Optional[float] = None  # the previous report's time (the cap's report interval)
        self.prefill_budget: Optional[float] = None  # the unreported-work cap in tokens (None: not known yet)
        self.completed_seen = 0  # completed since the report, and counted by it
        self.credits = 0  # request slots granted by the report
        self.kv_budget: Optional[float] = None  # free KV tokens at the report (None: not reported)
        self.tokens_inflight = 0
        self.free = 0  # request slots this router may still send here (see LoadTracker.free_slots)
        #: with sibling routers: the most requests this router may have in flight here, its share of the
        #: engine's sequence slots (None: one router, or the engine's size is not reported); LoadTracker.set_share
        self.quota: Optional[int] = None

    def report_time(self) -> Optional[float]:
        """When the last report was measured (None: no report yet)."""
        return self.stats.timestamp if self.stats is not None else None


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
        stale_report_s: Optional[float] = 5.0,
        prefill_budget_reports: Optional[float] = None,
        pending_allowance: int = 0,
        slots_by_uncached_share: bool = False,
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
        if stale_report_s is not None and not (isinstance(stale_report_s, (int, float)) and stale_report_s > 0):
            raise ValueError(f"stale_report_s must be a number > 0 or None, got {stale_report_s!r}")
        #: a report that says something waits is ignored once its figures are this old and this router
        #: has had nothing in flight at the target for as long (None: always trusted); see the docstring
        self.stale_report_s = None if stale_report_s is None else float(stale_report_s)
        #: reports ignored by that rule so far
        self.distrusted_reports = 0
        if prefill_budget_reports is not None and not (
                isinstance(prefill_budget_reports, (int, float)) and not isinstance(prefill_budget_reports, bool)
                and 0 < prefill_budget_reports < math.inf):
            raise ValueError(f"prefill_budget_reports must be a number > 0 or None, got {prefill_budget_reports!r}")
        #: SP-P's unreported-work cap: a target takes no new request once the uncached prompt tokens sent to
        #: it since its last report reach this many report intervals of prefill at its rate
        #: (:attr:`prefill_rate`); None: off. Until two reports and a rate are known a target is not capped.
        self.prefill_budget_reports = prefill_budget_reports
        #: target -> its prefill rate in tokens/s, or None (set by the policy that owns the tracker: a cost
        #: policy's fitted t_p); without it the cap is off
        self.prefill_rate: Optional[Callable[[Hashable], Optional[float]]] = None
        #: grants the cap refused (a target that SP-P's slots alone would have left available)
        self.prefill_capped = 0
        if isinstance(pending_allowance, bool) or not isinstance(pending_allowance, int) or pending_allowance < 0:
            raise ValueError(f"pending_allowance must be an integer >= 0, got {pending_allowance!r}")
        #: SP-P's pending test: a report with at most this many requests waiting still grants slots (less
        #: the ones waiting); 0 = SkyLB's rule (anything waiting: no slot until the next report)
        self.pending_allowance = pending_allowance
        #: SP-P: a request spends :meth:`slot_cost` of a slot -- the share of its prompt the target does not
        #: hold, at least ``MIN_SLOT`` -- instead of one (see the module docstring)
        self.slots_by_uncached_share = bool(slots_by_uncached_share)
        #: (rank, n): this router's share of each report's headroom (:meth:`set_share`)
        self.share = (0, 1)
        self.mode = mode
        self.max_outstanding = max_outstanding
        self.unknown_headroom = unknown_headroom
        self.max_burst = max_burst
        self.request_tokens = request_tokens
        self._t: Dict[Hashable, _Target] = {}
        self._out: Dict[Hashable, int] = {}  # target -> len(inflight), for C-level bulk reads
        self.available: Set[Hashable] = set()
        #: sum of every target's free request slots (see :meth:`free_slots`), kept incrementally
        self.free_total = 0
        self._req_target: Dict[Hashable, Hashable] = {}
        #: request id -> (target whose slot it spent, that target's report time): requests the region gate
        #: sent to a target with no slot left (:meth:`_spend_pooled`)
        self._pooled: Dict[Hashable, tuple] = {}

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
            self.free_total -= st.free
            for rid in st.inflight:
                self._req_target.pop(rid, None)
                self._pooled.pop(rid, None)

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
        figures = (stats.num_waiting, stats.num_running, stats.kv_cache_usage)
        if figures != st.figures:
            st.figures = figures
            st.figures_since = stats.timestamp
        st.distrusted = False
        ts = stats.timestamp - self.seen_margin_s
        n = tok = pre = 0
        slots = 0.0
        weighted = self.slots_by_uncached_share
        for t, k, u in st.inflight.values():
            if t > ts:
                n += 1
                tok += k
                pre += u
                if weighted:
                    slots += self.slot_cost(k, u)
        st.unseen, st.unseen_tokens, st.unseen_prefill, st.unseen_slots = n, tok, pre, slots
        if self.prefill_budget_reports is not None:
            self._measure_prefill_budget(target, st, stats)
        st.completed_seen = 0
        st.credits, st.kv_budget = self._headroom(stats)
        st.seq_free = (None if stats.max_num_seqs is None
                       else max(0, stats.max_num_seqs - stats.num_running - stats.num_waiting))
        st.seq_room = None if st.credits <= 0 else st.seq_free
        if self.share[1] > 1:
            st.credits, st.kv_budget = self._shared(target, st.credits, st.kv_budget, stats.timestamp)
            st.quota = None if stats.max_num_seqs is None else self._quota(target, stats.max_num_seqs)
        if stats.num_waiting > 0 and self.stale_report_s is not None:
            self._check_frozen(st, stats.timestamp)
        self._refresh(target, st)

    def _measure_prefill_budget(self, target: Hashable, st: _Target, stats: ReplicaStats) -> None:
        """The unreported-work cap in tokens: ``prefill_budget_reports`` x the interval between this report
        and the previous one x the target's prefill rate (``prefill_rate``, tokens/s; the policy's)."""
        prev, st.work_mark = st.work_mark, stats.timestamp
        rate = self.prefill_rate(target) if self.prefill_rate is not None else None
        if prev is not None and stats.timestamp > prev and rate:
            st.prefill_budget = self.prefill_budget_reports * (stats.timestamp - prev) * rate

    def _check_frozen(self, st: _Target, now: float) -> bool:
        """Ignore the report's waiting count if it is frozen (see the module docstring)."""
        bound = self.stale_report_s
        if (st.distrusted or st.inflight or now - st.figures_since < bound or now - st.idle_since < bound):
            return False
        st.distrusted = True
        st.credits, st.kv_budget, st.seq_room, st.seq_free = self.unknown_headroom, None, None, None
        st.completed_seen = 0
        self.distrusted_reports += 1
        return True

    def revalidate(self, now: float) -> int:
        """Re-check the unavailable targets whose last report says something waits against the
        frozen-report rule at time ``now`` (reports may stop coming, or repeat unchanged with the
        same timestamp, so :meth:`on_stats` alone cannot notice). O(targets): call it when a request
        is held, not per decision. Returns how many targets it made available."""
        if self.stale_report_s is None or self.mode != "sp-p":
            return 0
        n = 0
        avail = self.available
        for target, st in self._t.items():
            if target in avail or st.stats is None or st.stats.num_waiting <= 0:
                continue
            if self._check_frozen(st, now):
                self._refresh(target, st)
                n += target in avail
        return n

    def set_share(self, rank: int, n: int) -> None:
        """This router is router ``rank`` of ``n`` routers over the same replicas (several ingress
        replicas of a region): from the next report on, it takes its share of each report's headroom --
        ``slots // n``, plus one of the ``slots % n`` left over for ``n`` routers in turn, and ``1/n`` of
        the KV budget -- so the ``n`` routers together grant exactly the report's slots, never one twice.
        Which routers get the left-over slots rotates with the replica (a stable hash of its id) and with
        the report (its measurement time, which every router receives alike): near saturation a report
        has fewer free slots than there are routers, and a fixed choice would leave the same routers
        without a slot of that replica for ever. ``(0, 1)``: all of it.

        A share alone can still grant a slot twice: the report reaches each router at its own moment, and a
        router may already have spent more than its new share, under the report before, by then -- its
        excess lowers no sibling's share. So with ``n > 1`` each router is also held to a fixed part of every
        engine's sequence slots (``_quota``, of the reported ``max_num_seqs``): it never has more requests in
        flight there than that, so the routers together never exceed the engine's slots, however late or
        unevenly the reports arrive. The price: a router cannot use a sibling's idle part (the simulator's
        ``sibling_headroom`` lends it, ``lend_slot``)."""
        if not (isinstance(n, int) and n >= 1 and isinstance(rank, int) and 0 <= rank < n):
            raise ValueError(f"headroom share: need 0 <= rank < n, got rank={rank!r}, n={n!r}")
        self.share = (rank, n)
        for target, st in self._t.items():
            seqs = st.stats.max_num_seqs if st.stats is not None and n > 1 else None
            st.quota = None if seqs is None else self._quota(target, seqs)
            self._refresh(target, st)

    def lend_slot(self, target: Hashable, to: "LoadTracker") -> bool:
        """Move one unused request slot that the last report granted this router at ``target`` to a sibling
        router's tracker over the same target (another ingress replica of the region, ``set_share``): the
        region's routers together still grant no more than the report had free. False (nothing moved) when
        this router has no such slot free there, or either side does not track the target under SP-P."""
        st, other = self._t.get(target), to._t.get(target)
        if st is None or other is None or self.mode != "sp-p" or to.mode != "sp-p" or st.free <= 0 \
                or st.credits <= 0:
            return False
        st.credits -= 1
        if st.quota is not None:
            st.quota -= 1
        self._refresh(target, st)
        other.credits += 1
        if other.quota is not None:
            other.quota += 1
        to._refresh(target, other)
        return True

    def _shared(self, target: Hashable, slots: int, kv: Optional[float], measured_at: float = 0.0):
        rank, n = self.share
        base, extra = divmod(slots, n)
        turn = (rank - _replica_hash(target) - int(measured_at * 1000.0)) % n
        return base + (1 if turn < extra else 0), (None if kv is None else kv / n)

    def _quota(self, target: Hashable, seqs: int) -> int:
        """This router's fixed part of an engine's ``seqs`` sequence slots: ``seqs // n``, plus one of the
        ``seqs % n`` left over for the routers a stable hash of the replica picks (so over many replicas
        every router gets its turn). At least one: with fewer slots than routers no router may stall, so there
        the routers together may send an engine up to ``n`` requests."""
        rank, n = self.share
        base, extra = divmod(seqs, n)
        return max(1, base + (1 if (rank - _replica_hash(target)) % n < extra else 0))

    def _headroom(self, s: ReplicaStats):
        """(request slots, free KV tokens or None) that a report grants."""
        kv = None
        if s.kv_cache_usage is not None and s.num_gpu_blocks and s.block_tokens:
            kv = max(0.0, (1.0 - s.kv_cache_usage) * s.num_gpu_blocks * s.block_tokens)
        w = s.num_waiting
        if w > self.pending_allowance:
            return 0, kv
        if s.max_num_seqs is not None:
            slots = min(self.max_burst, max(0, s.max_num_seqs - s.num_running))
        elif kv is not None:
            slots = self.max_burst
        else:
            slots = min(self.unknown_headroom, self.max_burst)
        return max(0, slots - w), kv

    @staticmethod
    def slot_cost(tokens: int, uncached: float) -> float:
        """The part of a report's slot a request of ``tokens`` prompt tokens, ``uncached`` of them to prefill at
        the target, spends (``slots_by_uncached_share``): ``uncached / tokens``, at least ``MIN_SLOT``."""
        x = uncached / tokens if tokens > 0 else 1.0
        return 1.0 if x >= 1.0 else (MIN_SLOT if x <= MIN_SLOT else x)

    def on_dispatch(self, target: Hashable, request_id: Hashable, now: float, tokens: int = 0,
                    uncached: Optional[float] = None, pooled: bool = False) -> None:
        """Count a request at ``target``: ``tokens`` prompt tokens (``request_tokens`` if unknown), of which
        ``uncached`` must be prefilled there (None: all of them; what the unreported-work cap counts).
        ``pooled`` (the region gate): a request sent to a target with no slot left spends a slot of the
        target with the most left instead (:meth:`_spend_pooled`), so the region's slots still count
        every request it sends."""
        st = self._t.get(target)
        if st is None:
            self.add_target(target)
            st = self._t[target]
        if request_id in st.inflight:
            self._redate(st, target, request_id, now)  # counted once, however often the caller reports it
            return
        if pooled and st.free <= 0 and self.available:
            self._spend_pooled(request_id)
        tokens = tokens if tokens > 0 else self.request_tokens
        pre = tokens if uncached is None else max(0, min(tokens, int(uncached)))
        st.inflight[request_id] = (now, tokens, pre)
        self._out[target] = len(st.inflight)
        st.tokens_inflight += tokens
        self._req_target[request_id] = target
        if st.stats is None or now > st.stats.timestamp - self.seen_margin_s:
            st.unseen += 1
            st.unseen_tokens += tokens
            st.unseen_prefill += pre
            if self.slots_by_uncached_share:
                st.unseen_slots += self.slot_cost(tokens, pre)
        self._refresh(target, st)

    def _spend_pooled(self, request_id: Hashable) -> None:
        """Spend one slot of the available target with the most free slots for ``request_id`` (sent to a
        target with none left): one credit of that report, until its next one. Remembered, so a reservation
        released unsent gives it back."""
        donor = max(self.available, key=lambda t: (self._t[t].free, -_replica_hash(t)))
        st = self._t[donor]
        st.credits -= 1
        self._pooled[request_id] = (donor, st.report_time())
        self._refresh(donor, st)

    def _unspend_pooled(self, request_id: Hashable) -> None:
        """Give back the slot :meth:`_spend_pooled` took for a reservation that was never sent, if the
        donor's report is still the one it was taken from."""
        donor, stamp = self._pooled.pop(request_id)
        st = self._t.get(donor)
        if st is not None and st.report_time() == stamp:
            st.credits += 1
            self._refresh(donor, st)

    def _redate(self, st: _Target, target: Hashable, request_id: Hashable, now: float) -> None:
        """A request counted earlier (a reservation) is really sent at ``now``: it is dated then, so a
        report measured between the two, which could not include it, does not count as having seen it."""
        t, tok, pre = st.inflight[request_id]
        if now <= t:
            return
        st.inflight[request_id] = (now, tok, pre)
        if st.stats is not None and t <= st.stats.timestamp - self.seen_margin_s < now:
            st.unseen += 1
            st.unseen_tokens += tok
            st.unseen_prefill += pre
            if self.slots_by_uncached_share:
                st.unseen_slots += self.slot_cost(tok, pre)
            self._refresh(target, st)

    def on_complete(self, request_id: Hashable, target: Hashable = None, now: Optional[float] = None,
                    reached_engine: bool = True) -> bool:
        """Uncount a request (completion, cancel or error). Returns False if it was not in flight.
        ``now`` (the caller's clock) dates the moment the target's in-flight count fell to 0, for
        the frozen-report rule; without it the request's dispatch time stands in. A request the last
        report counted frees its slot only if ``now`` is at least ``seen_margin_s`` after that report
        was measured (an earlier notice may be of a completion the report already left out; without
        ``now`` it frees it). ``reached_engine=False``: a reservation that was never sent, which no
        report counted, so it frees no slot a report granted."""
        if target is None:
            target = self._req_target.get(request_id)
        if self._pooled and request_id in self._pooled:
            if reached_engine:
                del self._pooled[request_id]
            else:
                self._unspend_pooled(request_id)
        st = self._t.get(target)
        if st is None:
            self._req_target.pop(request_id, None)
            return False
        entry = st.inflight.pop(request_id, None)
        self._req_target.pop(request_id, None)
        if entry is None:
            return False
        self._out[target] = len(st.inflight)
        t, tok, pre = entry
        if not st.inflight:
            st.idle_since = t if now is None else now
        st.tokens_inflight = max(0, st.tokens_inflight - tok)
        if st.stats is None or t > st.stats.timestamp - self.seen_margin_s:
            st.unseen = max(0, st.unseen - 1)
            st.unseen_tokens = max(0, st.unseen_tokens - tok)
            st.unseen_prefill = max(0, st.unseen_prefill - pre)
            if self.slots_by_uncached_share:
                st.unseen_slots = max(0.0, st.unseen_slots - self.slot_cost(tok, pre)) if st.unseen else 0.0
        elif reached_engine and (now is None or now >= st.stats.timestamp + self.seen_margin_s):
            st.completed_seen += 1
        self._refresh(target, st)
        return True

    # ------------------------------------------------------------ queries
    def _refresh(self, target: Hashable, st: _Target) -> None:
        free = self._free(st)
        self.free_total += free - st.free
        st.free = free
        if free > 0:
            self.available.add(target)
        else:
            self.available.discard(target)

    def _free(self, st: _Target) -> int:
        """Request slots this router may still send to the target: SP-P's ``credits + freed - unseen`` (with
        ``slots_by_uncached_share``: the unseen requests' slot parts, rounded up, and no more than the engine's
        free sequence slots), capped by the KV budget in requests of ``request_tokens``; SP-O's
        ``max_outstanding - outstanding``; BP's ``max_burst`` (always available). > 0 exactly when the target
        is available."""
        mode = self.mode
        if mode == "bp":
            return self.max_burst
        if mode == "sp-o":
            return max(0, self.max_outstanding - len(st.inflight))
        waiting = st.stats.num_waiting if st.stats is not None and not st.distrusted else 0
        freed = max(0, st.completed_seen - waiting)
        if self.slots_by_uncached_share and st.seq_room is not None:
            # fractional slots spent (a slot partly left still takes one more request), never more requests
            # than the engine had sequence slots free
            free = min(math.ceil(st.credits + freed - st.unseen_slots - _SLOT_EPS), st.seq_room + freed - st.unseen)
        else:
            free = st.credits + freed - st.unseen
        if free <= 0:
            return 0
        if st.kv_budget is not None:
            free = min(free, int((st.kv_budget - st.unseen_tokens) // self.request_tokens))
        if st.quota is not None:
            free = min(free, st.quota - len(st.inflight))
        if st.prefill_budget is not None and free > 0 and st.unseen_prefill >= st.prefill_budget:
            self.prefill_capped += 1
            return 0
        return max(0, free)

    def free_slots(self) -> int:
        """Requests this router may still send to its targets before any of them needs a newer report
        (the sum of :meth:`_free` over the targets; O(1)). The Serve ingress admits that many requests
        to its region's router at once, as the simulator's LB dispatches them one by one."""
        return self.free_total

    def is_available(self, target: Hashable) -> bool:
        return target in self.available

    def has_room(self, target: Hashable) -> bool:
        """What the region gate still asks of a replica with no slot left: its KV budget (free KV tokens at
        its report, less the prompt tokens sent since) holds one more typical request (``request_tokens``;
        no budget reported: no limit known), and this router's fixed part of its slots (``set_share``) is not
        all in flight. False for a target this tracker does not know."""
        st = self._t.get(target)
        if st is None:
            return False
        if st.kv_budget is not None and st.kv_budget - st.unseen_tokens < self.request_tokens:
            return False
        return st.quota is None or len(st.inflight) < st.quota

    def has_sequence_room(self, target: Hashable) -> bool:
        """:meth:`has_room`, and the engine had a sequence slot free at its report that the requests sent since
        have not taken (no engine size reported: only :meth:`has_room`)."""
        if not self.has_room(target):
            return False
        st = self._t[target]
        return st.seq_free is None or st.seq_free + st.completed_seen - st.unseen > 0

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
