"""A calibrated state-machine model of one vLLM (v1) replica: the emulated GPU.

Pure state machine with an explicit ``now`` (seconds) argument: no sleeping, no threads.
The same object is driven in virtual time by the discrete-event simulator and in
(scaled) wall-clock time by :class:`ray_geolb.engine.driver.AsyncEngineDriver`.

Scheduling (one ``step(now)`` = one continuous-batching iteration, as vLLM v1; one method
per phase):

1. ``_release_pending``: requests whose fixed TTFT overhead has elapsed move from
   *pending* to the FCFS *waiting* queue (see "TTFT overhead" below).
2. ``_schedule_running``: running requests first, in admission order: each gets
   ``min(remaining, token budget)`` new tokens (1 for a decode, a chunk for an unfinished
   prefill).  If its KV blocks do not suffice and no free block exists, the most recently
   admitted running request is preempted by *recompute* (blocks freed, ``num_computed``
   reset, put at the FRONT of the waiting queue; its already generated tokens are kept and
   recomputed on resume).
3. ``_admit_waiting``, only if nothing was preempted this step: admit from the head of the
   waiting queue while ``len(running) < max_num_seqs``, token budget remains and KV blocks
   suffice for the whole prompt (``reserve_full_prompt``, vLLM 0.29's default), not only the
   chunk.  Prefix caching (``_prefix_hits``): the longest run of leading ``block_hashes`` present
   in the cache (held by running requests or unreferenced in the LRU free list) is
   reused and not prefilled (capped, like vLLM, so that at least the last prompt token is
   computed).  With chunked prefill a prompt longer than the remaining budget is split
   across steps.
4. ``_apply``: after the step a request whose computed tokens reach its current length
   samples one token (first token for a fresh prefill, one decode token otherwise); a
   request that has produced ``output_tokens`` tokens finishes and frees its blocks.  Full
   prompt blocks computed so far are registered in the prefix cache (``_register_blocks``).

When every running request decodes and nothing waits, ``_decode_step`` does phases 2 and 4
in one pass (the decode fast path; same result as the general path).

KV cache (block granular, O(1) per block op):
  * ``_num_free``: empty blocks; ``_cached``: hash -> refcount of blocks registered in
    the prefix cache; ``_lru``: ordered dict of cached blocks with refcount 0 (evictable,
    oldest first).  Used blocks = total - empty - evictable.
  * New blocks come from empty blocks first, then by evicting the LRU cached block.
    (vLLM 0.29 frees unhashed blocks to the front of its single free queue and cached ones to the
    tail, block_pool.py, so it too takes empty blocks before evicting cached ones.)
  * A full prompt block gets registered under its hash once computed; if that hash is
    already cached (the last prompt block is always recomputed, or two requests prefilled
    the same prefix concurrently) the request shares the cached block and its own copy is
    freed.  An output block is cached the same way when it fills, if the request carries its
    hash (``EngineRequest.block_hashes`` past the prompt: the reply's text is known to a caller
    whose next turn replays it); vLLM caches full output blocks, and the next turn hits them.
  * Blocks of a finished/preempted request are released tail-first so that the tail of
    a prefix is evicted before its head.

TTFT overhead: ``add_request(req, now)`` puts the request in a *pending* heap with ready
time ``now + ttft_overhead_s``; it becomes schedulable at the first ``step`` whose ``now``
is >= its ready time.  So at batch size 1 TTFT = overhead + prefill step time(s), and a
first token can never be produced before ``arrival + overhead``.  Pending requests are
NOT counted in ``num_waiting`` (a real vLLM replica does not count requests still in the
API server / tokeniser either); a router sees them through its own in-flight count.
``num_waiting`` in :meth:`stats` is the waiting queue right after the last schedule, as in
vLLM's SchedulerStats: a request that arrived during a step and is admitted at the next one is
never reported as waiting (SkyLB's pending-request rule would otherwise see phantom queues).
Callers should call ``step`` no earlier than :meth:`next_ready_time`.

Timing convention: ``step(now)`` applies the whole iteration immediately and returns its
``duration``; its tokens are *produced* at ``now + duration`` and the caller must not call
``step`` again before then.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from typing import Optional, Sequence

from .admission import request_fits
from .profiles import ADMISSION_FIELDS, AdmissionParams, EngineProfile, check_admission, get_profile

__all__ = ["EngineConfig", "EngineRequest", "EngineModel", "RequestTiming", "StepOutput", "request_fits"]

_PENDING, _WAITING, _RUNNING, _DONE = 0, 1, 2, 3


@dataclass(frozen=True)
class EngineConfig(AdmissionParams):  # + the admission semantics (AdmissionParams, copied from the profile)
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    block_tokens: int
    max_model_len: int
    ttft_overhead_s: float
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    #: admit a request only if the blocks of its WHOLE prompt are free, not just its first chunk's (vLLM 0.29's
    #: ``scheduler_reserve_full_isl=True`` default: vllm/v1/core/kv_cache_manager.py ``full_sequence_must_fit``)
    reserve_full_prompt: bool = True

    @classmethod
    def from_profile(cls, profile: EngineProfile, **overrides) -> "EngineConfig":
        cfg = cls(
            max_num_seqs=profile.max_num_seqs,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            num_gpu_blocks=profile.num_gpu_blocks,
            block_tokens=profile.block_tokens,
            max_model_len=profile.max_model_len,
            ttft_overhead_s=profile.ttft_overhead_s,
            **{f: getattr(profile, f) for f in ADMISSION_FIELDS},
        )
        return replace(cfg, **overrides) if overrides else cfg

    def __post_init__(self) -> None:
        for f in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks",
                  "block_tokens", "max_model_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"EngineConfig.{f} must be an int >= 1, got {v!r}")
        if self.ttft_overhead_s < 0:
            raise ValueError(f"EngineConfig.ttft_overhead_s must be >= 0, got {self.ttft_overhead_s!r}")
        check_admission(self, "EngineConfig")


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    #: chained hashes of the prompt's full blocks, optionally followed by those of the output's (the reply
    #: the next turn will replay): full output blocks are cached as they fill, as vLLM caches them
    block_hashes: Sequence[int] = ()
    #: the client's max_tokens (None: not sent). vLLM mode ignores it; SGLang reserves KV for it.
    max_new_tokens: Optional[int] = None


@dataclass
class StepOutput:
    duration: float
    first_tokens: list = field(default_factory=list)
    tokens: list = field(default_factory=list)  # ids that produced one token this step
    finished: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    #: one ``RequestTiming`` per request in ``first_tokens`` (vLLM's per-request queued/prefill intervals)
    timings: list = field(default_factory=list)


@dataclass(frozen=True)
class RequestTiming:
    """vLLM v1's per-request intervals (``FinishedRequestStats``): ``queued_s`` = first QUEUED (the request
    reached the scheduler's waiting queue, after ``ttft_overhead_s``) -> first SCHEDULED; ``prefill_s`` =
    first SCHEDULED -> first token (chunks and preemptions during prefill included); ``uncached_tokens`` =
    prompt tokens minus the prefix-cache hit at the first scheduling (vLLM's ``num_cached_tokens``)."""

    request_id: str
    uncached_tokens: int
    queued_s: float
    prefill_s: float


class _Seq:
    __slots__ = ("id", "prompt", "max_out", "hashes", "num_tokens", "num_computed",
                 "num_output", "num_blocks", "hashed", "next_hash", "sched", "status",
                 "arrival", "ready", "resumed", "max_new", "sched_ts", "uncached")

    def __init__(self, rid: str, prompt: int, max_out: int, hashes: list, arrival: float,
                 ready: float) -> None:
        self.id = rid
        self.prompt = prompt
        self.max_out = max_out
        self.hashes = hashes
        self.num_tokens = prompt  # prompt + generated tokens so far
        self.num_computed = 0  # tokens whose KV is computed
        self.num_output = 0
        self.num_blocks = 0  # blocks held (cached + anonymous)
        self.hashed: list = []  # hashes of held blocks registered in the prefix cache
        self.next_hash = 0  # index of the next prompt block to register
        self.sched = 0
        self.status = _PENDING
        self.arrival = arrival
        self.ready = ready
        self.resumed = False
        self.sched_ts = -1.0  # first SCHEDULED (engine time); -1 = never scheduled
        self.uncached = prompt  # prompt tokens not in the prefix cache at the first scheduling


class EngineModel:
    #: take :meth:`_decode_step` for all-decode batches (False: always the general path; tests
    #: compare the two)
    decode_fast_path = True

    def __init__(self, profile: EngineProfile | str, config: Optional[EngineConfig] = None):
        if isinstance(profile, str):
            profile = get_profile(profile)
        self.profile = profile
        self.config = config if config is not None else EngineConfig.from_profile(profile)
        c = self.config
        self._B = c.block_tokens
        self._max_seqs = c.max_num_seqs
        self._max_tokens = c.max_num_batched_tokens
        self._caching = c.enable_prefix_caching
        self._chunked = c.enable_chunked_prefill
        self._reserve_full = c.reserve_full_prompt
        self._overhead = c.ttft_overhead_s
        self._total_blocks = c.num_gpu_blocks
        self._step = profile.step  # StepModel: the GPU time of one step (engine/step_model.py)
        self._q = profile.step.prefill_attn_per_pair_s
        self._m = profile.step.lone_attn_per_ctx_token_s

        self._num_free = c.num_gpu_blocks
        self._cached: dict = {}
        self._lru: OrderedDict = OrderedDict()
        self._reqs: dict = {}
        self._pending: list = []  # heap of (ready, seqno, _Seq)
        self._seqno = 0
        self._waiting: deque = deque()
        self._waiting_reported = 0  # waiting count right after the last schedule (what vLLM reports)
        self._running: list = []
        # True when every running request is in its decode phase (its computed tokens are its
        # length - 1 and it has produced a token): the next step can take the decode fast path.
        self._all_decode = False
        self._now = 0.0
        # cumulative counters
        self._q_tokens = 0
        self._hit_tokens = 0
        self._num_preempted = 0
        self._num_finished = 0
        self._num_steps = 0
        self._busy_s = 0.0  # engine seconds spent in steps (cumulative; stats()["engine_work"])
        self._work_prefill = 0  # prompt tokens computed (cumulative)
        self._work_decode = 0  # decode tokens (sequences decoded one token; cumulative)
        self._work_pairs = 0.0  # prefill-attention pairs: sum over chunks of P * (c + P/2) (cumulative)

    # ------------------------------------------------------------------ requests
    def add_request(self, req: EngineRequest, now: float) -> None:
        rid = req.request_id
        p, o = req.prompt_tokens, req.output_tokens
        if not isinstance(p, int) or isinstance(p, bool) or p < 1:
            raise ValueError(f"request {rid!r}: prompt_tokens must be an int >= 1, got {p!r}")
        if not isinstance(o, int) or isinstance(o, bool) or o < 1:
            raise ValueError(f"request {rid!r}: output_tokens must be an int >= 1, got {o!r}")
        if rid in self._reqs:
            raise ValueError(f"duplicate request id {rid!r}: already in this engine")
        m = req.max_new_tokens
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < o):
            raise ValueError(f"request {rid!r}: max_new_tokens must be an int >= output_tokens ({o}), got {m!r}")
        if p + o > self.config.max_model_len:
            raise ValueError(
                f"request {rid!r}: prompt_tokens + output_tokens = {p + o} exceeds "
                f"max_model_len {self.config.max_model_len}")
        B = self._B
        # the last sampled token is never fed back, so p + o - 1 tokens need KV
        need = (p + o - 1 + B - 1) // B
        if need > self._total_blocks:
            raise ValueError(
                f"request {rid!r} can never fit in the KV cache: needs {need} blocks of {B} "
                f"tokens for {p} prompt + {o} output tokens, cache has {self._total_blocks}")
        # full blocks of prompt + fed-back output (p + o - 1 tokens): vLLM caches output blocks too, so a
        # caller that knows the reply's text (the next turn replays it) passes its hashes after the prompt's
        hashes = list(req.block_hashes[: (p + o - 1) // B]) if self._caching else []
        ready = now + self._overhead
        s = _Seq(rid, p, o, hashes, now, ready)
        self._reqs[rid] = s
        if self._overhead <= 0.0:
            s.status = _WAITING
            self._waiting.append(s)
        else:
            self._seqno += 1
            heappush(self._pending, (ready, self._seqno, s))

    def abort(self, request_id: str, now: Optional[float] = None) -> bool:
        """Remove a request wherever it is and free its blocks. Returns False if unknown."""
        s = self._reqs.pop(request_id, None)
        if s is None:
            return False
        st = s.status
        s.status = _DONE
        if st == _RUNNING:
            self._running.remove(s)
            self._free(s)
        elif st == _WAITING:
            self._waiting.remove(s)
        # pending: lazily dropped from the heap (status is _DONE)
        # The report must not keep counting an aborted request: an engine left idle by the abort runs
        # no further step to refresh it, and a stale "1 waiting" would make SP-P shun an idle replica.
        if self._waiting_reported > len(self._waiting):
            self._waiting_reported = len(self._waiting)
        return True

    # ------------------------------------------------------------------ KV blocks
    def _lock_prefix(self, s, hits: int) -> None:
        """Admit ``s`` on its ``hits`` cached prompt blocks: each gains a reference (leaving the LRU of
        free cached blocks if it was there); they become ``s``'s first blocks."""
        if hits:
            cached, lru = self._cached, self._lru
            hit_hashes = s.hashes[:hits]
            for h in hit_hashes:
                c = cached[h]
                if c == 0:
                    del lru[h]
                cached[h] = c + 1
            s.hashed = hit_hashes
            s.num_blocks = hits
        s.next_hash = hits

    def _alloc(self, s: _Seq, n: int) -> bool:
        if n <= self._num_free:
            self._num_free -= n
            s.num_blocks += n
            return True
        lru = self._lru
        if n > self._num_free + len(lru):
            return False
        k = n - self._num_free
        self._num_free = 0
        cached = self._cached
        pop = lru.popitem
        for _ in range(k):
            h, _v = pop(last=False)
            del cached[h]
        s.num_blocks += n
        return True

    def _free(self, s: _Seq) -> None:
        hashed = s.hashed
        self._num_free += s.num_blocks - len(hashed)
        if hashed:
            cached = self._cached
            lru = self._lru
            for h in reversed(hashed):
                c = cached[h] - 1
                cached[h] = c
                if c == 0:
                    lru[h] = None
            s.hashed = []
        s.num_blocks = 0

    def _preempt(self, s: _Seq) -> None:
        self._free(s)
        s.num_computed = 0
        s.next_hash = 0
        s.status = _WAITING
        s.resumed = True
        self._waiting.appendleft(s)
        self._num_preempted += 1

    # ------------------------------------------------------------------ stepping
    def has_work(self) -> bool:
        """True while any request is pending, waiting or running."""
        return bool(self._running or self._waiting or self._reqs)

    def next_ready_time(self) -> Optional[float]:
        """Earliest ``now`` at which ``step`` can make progress (None if no work)."""
        if self._running or self._waiting:
            return self._now
        pend = self._pending
        while pend and pend[0][2].status != _PENDING:
            heappop(pend)
        return pend[0][0] if pend else None

    def _make_room(self, s, need: int, running, preempted: list) -> bool:
        """Allocate ``need`` blocks for ``s`` by preempting (recompute) the most recently admitted
        running requests, as vLLM does; False if ``s`` itself had to go."""
        while running:
            victim = running.pop()
            self._preempt(victim)
            preempted.append(victim.id)
            if victim is s:
                return False
            if self._alloc(s, need):
                return True
        return False

    def step(self, now: float) -> StepOutput:
        """One continuous-batching iteration at ``now``: release pending requests, schedule the
        running ones, admit from the waiting queue, then apply the batch (module docstring, 1-4)."""
        self._now = now
        pend = self._pending
        if pend and pend[0][0] <= now:
            self._release_pending(now)
        running = self._running
        waiting = self._waiting
        if not running and not waiting:
            self._waiting_reported = 0
            return StepOutput(0.0)
        if self._all_decode and not waiting and len(running) <= self._max_tokens and self.decode_fast_path:
            return self._decode_step(running)

        scheduled = []
        preempted = []
        budget = self._schedule_running(running, scheduled, preempted)
        # admissions (FCFS), only if nothing was preempted this step
        if not preempted:
            self._admit_waiting(running, budget, scheduled)
        # vLLM builds SchedulerStats right after schedule(): requests that arrived during the last
        # step and are admitted now never show as waiting; only those the batch could not take do.
        self._waiting_reported = len(waiting)
        if not scheduled:
            return StepOutput(0.0, preempted=preempted)
        return self._apply(running, scheduled, preempted)

    def _release_pending(self, now: float) -> None:
        """Phase 1: requests whose TTFT overhead has elapsed by ``now`` join the waiting queue."""
        pend = self._pending
        waiting = self._waiting
        while pend and pend[0][0] <= now:
            s = heappop(pend)[2]
            if s.status == _PENDING:
                s.status = _WAITING
                waiting.append(s)

    def _schedule_running(self, running: list, scheduled: list, preempted: list) -> int:
        """Phase 2: running requests first, in admission order, each ``min(remaining, budget)``
        tokens; preempts the newest running requests when KV blocks run out. Appends to
        ``scheduled``/``preempted`` and returns the token budget left."""
        B = self._B
        budget = self._max_tokens
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            n = s.num_tokens - s.num_computed
            if n > budget:
                n = budget
            need = (s.num_computed + n + B - 1) // B - s.num_blocks
            if need > 0 and not self._alloc(s, need):
                if not self._make_room(s, need, running, preempted):
                    break
            s.sched = n
            budget -= n
            scheduled.append(s)
            i += 1
        return budget

    def _prefix_hits(self, s: _Seq) -> tuple:
        """``(hits, in_lru)``: leading prompt blocks of ``s`` in the prefix cache (capped so that at
        least the last prompt token is computed), and how many of them are unreferenced (LRU)."""
        hits = 0
        in_lru = 0
        hs = s.hashes
        if hs:
            cached = self._cached
            lim = (s.num_tokens - 1) // self._B
            if lim > len(hs):
                lim = len(hs)
            while hits < lim:
                c = cached.get(hs[hits])
                if c is None:
                    break
                if c == 0:
                    in_lru += 1
                hits += 1
        return hits, in_lru

    def _admit_waiting(self, running: list, budget: int, scheduled: list) -> None:
        """Phase 3: admit from the head of the waiting queue (FCFS) while a sequence slot, token
        budget and KV blocks remain, reusing cached prefix blocks; appends to ``scheduled``."""
        B = self._B
        max_seqs = self._max_seqs
        waiting = self._waiting
        lru = self._lru
        while waiting and budget > 0 and len(running) < max_seqs:
            s = waiting[0]
            hits, in_lru = self._prefix_hits(s)
            computed = hits * B
            n = s.num_tokens - computed
            if n > budget:
                if not self._chunked:
                    break
                n = budget
            need = (computed + n + B - 1) // B - hits
            check = need
            if self._reserve_full:
                full = (s.num_tokens + B - 1) // B - hits
                if full > check:
                    check = full
            if check > self._num_free + len(lru) - in_lru:
                break
            waiting.popleft()
            self._lock_prefix(s, hits)
            s.num_computed = computed
            if need > 0:
                self._alloc(s, need)  # cannot fail: checked above
            if not s.resumed:
                self._q_tokens += s.prompt
                self._hit_tokens += computed
            if s.sched_ts < 0.0:
                s.sched_ts = self._now
                s.uncached = s.prompt - computed
            s.status = _RUNNING
            running.append(s)
            s.sched = n
            budget -= n
            scheduled.append(s)

    def _register_blocks(self, s: _Seq, computed: int) -> None:
        """Register the full prompt blocks of ``s`` computed so far in the prefix cache; a block
        whose hash is already cached is shared and the request's own copy freed."""
        nh = s.next_hash
        hs = s.hashes
        upto = computed // self._B
        if upto > len(hs):
            upto = len(hs)
        if upto > nh:
            cached = self._cached
            hashed = s.hashed
            for k in range(nh, upto):
                h = hs[k]
                rc = cached.get(h)
                if rc is None:
                    cached[h] = 1
                else:
                    # same content already cached (recomputed last block, or
                    # computed concurrently): share it, free our copy
                    if rc == 0:
                        del self._lru[h]
                    cached[h] = rc + 1
                    self._num_free += 1
                hashed.append(h)
            s.next_hash = upto

    def _apply(self, running: list, scheduled: list, preempted: list) -> StepOutput:
        """Phase 4: apply the iteration: advance computed tokens, register prompt blocks, sample
        one token per request that reached its length, finish those done; returns the output."""
        prefill = 0
        decodes = 0
        ctx = 0  # decode contexts
        lmax = 0
        chunks = 0
        attn = 0.0  # prefill attention (StepModel.chunk_attn, inlined)
        pairs = 0.0
        q = self._q
        m = self._m
        first = []
        first_seqs = []
        tokens = []
        finished = []
        caching = self._caching
        for s in scheduled:
            n = s.sched
            before = s.num_computed
            c = before + n
            nt = s.num_tokens
            if n == 1 and s.num_output and c == nt:
                decodes += 1
                ctx += c
                if c > lmax:
                    lmax = c
            else:
                prefill += n
                chunks += 1
                pr = n * (before + 0.5 * n)
                pairs += pr
                pr *= q
                rd = m * c
                attn += pr if pr > rd else rd
            s.num_computed = c
            if caching and s.next_hash < len(s.hashes):
                self._register_blocks(s, c)
            if c == nt:
                s.num_tokens = nt + 1
                o = s.num_output + 1
                s.num_output = o
                rid = s.id
                tokens.append(rid)
                if o == 1:
                    first.append(rid)
                    first_seqs.append(s)
                if o >= s.max_out:
                    finished.append(rid)
                    s.status = _DONE
                    self._free(s)
                    del self._reqs[rid]
        # Every request still running is decoding iff each scheduled one produced a token and
        # none was left unscheduled (budget exhausted).
        self._all_decode = len(tokens) == len(scheduled) == len(running)
        if finished:
            self._running = [s for s in running if s.status == _RUNNING]
            self._num_finished += len(finished)
        self._num_steps += 1
        dur = self._step.time_of(prefill + decodes, chunks, decodes, ctx, lmax, attn)
        self._busy_s += dur
        self._work_prefill += prefill
        self._work_pairs += pairs
        self._work_decode += decodes
        return StepOutput(dur, first, tokens, finished, preempted, prefill, decodes,
                          self._first_timings(first_seqs, self._now + dur))

    @staticmethod
    def _first_timings(first_seqs: list, t_first: float) -> list:
        """One ``RequestTiming`` per request whose first token this step produced (done at ``t_first``)."""
        return [RequestTiming(s.id, s.uncached, max(0.0, s.sched_ts - s.ready), t_first - s.sched_ts)
                for s in first_seqs]

    def _finish(self, s: _Seq) -> None:
        """A request produced its last token: done, its blocks freed, forgotten."""
        s.status = _DONE
        self._free(s)
        del self._reqs[s.id]

    def _decode_step(self, running: list) -> StepOutput:
        """One iteration when every running request decodes and nothing waits (the common case).

        Exactly what :meth:`step` does for such a batch (same allocation order, same preemption
        victims, frees after all allocations, same duration expression), in one pass: each request
        takes one token; no admission can happen (nothing waits); an output block gets registered
        when it fills, if the request was given its hash (a decoding request registered all its full
        prompt blocks when its prefill completed).
        """
        B = self._B
        preempted = []
        tokens = []
        finished = None
        reg = None
        ctx = 0
        lmax = 0
        i = 0
        while i < len(running):
            s = running[i]
            c = s.num_computed + 1
            if c > s.num_blocks * B and not self._alloc(s, 1):
                if not self._make_room(s, 1, running, preempted):
                    break
            s.num_computed = c
            s.num_tokens = c + 1
            ctx += c
            if c > lmax:
                lmax = c
            if s.next_hash < len(s.hashes) and c // B > s.next_hash:
                # a full output block whose hash was given (EngineRequest): registered after every
                # allocation of the step, as _apply does (registering may free a duplicate block)
                if reg is None:
                    reg = [s]
                else:
                    reg.append(s)
            o = s.num_output + 1
            s.num_output = o
            tokens.append(s.id)
            if o >= s.max_out:
                if finished is None:
                    finished = [s]
                else:
                    finished.append(s)
            i += 1
        self._waiting_reported = len(self._waiting)
        if not tokens:
            return StepOutput(0.0, preempted=preempted)
        decodes = len(tokens)
        fin_ids = []
        if reg is not None:  # batch order: each request registers, then is freed if finished (as _apply)
            regs = set(map(id, reg))
            done = set(map(id, finished)) if finished is not None else ()
            for s in running[:i]:
                if id(s) in regs:
                    self._register_blocks(s, s.num_computed)
                if id(s) in done:
                    self._finish(s)
        elif finished is not None:
            for s in finished:
                self._finish(s)
        if finished is not None:
            fin_ids = [s.id for s in finished]
            self._running = [s for s in running if s.status == _RUNNING]
            self._num_finished += len(finished)
        self._num_steps += 1
        dur = self._step.time_of(decodes, 0, decodes, ctx, lmax, 0.0)
        self._busy_s += dur
        self._work_decode += decodes
        return StepOutput(dur, [], tokens, fin_ids, preempted, 0, decodes)

    # ------------------------------------------------------------------ observability
    def cached_prefix_tokens(self, block_hashes: Sequence[int]) -> int:
        """Leading prompt tokens whose blocks are in this engine's prefix cache now."""
        if not self._caching:
            return 0
        cached = self._cached
        n = 0
        for h in block_hashes:
            if h not in cached:
                break
            n += 1
        return n * self._B

    def stats(self) -> dict:
        """What a vLLM replica exposes through its SchedulerStats."""
        used = self._total_blocks - self._num_free - len(self._lru)
        return {
            "num_waiting": self._waiting_reported,
            "num_running": len(self._running),
            "kv_cache_usage": used / self._total_blocks,
            "prefix_cache_queries": self._q_tokens,
            "prefix_cache_hits": self._hit_tokens,
            "num_preempted": self._num_preempted,
            "num_gpu_blocks": self._total_blocks,
            "max_num_seqs": self._max_seqs,
            "block_tokens": self._B,
            # cumulative step work since the engine started (what vLLM's per-iteration stats add up to):
            # a router differences two reports and fits busy time on steps, prefill and decode tokens and
            # prefill-attention pairs (a chunk of P tokens after c computed ones attends to P * (c + P/2))
            "engine_work": {"steps": self._num_steps, "prefill_tokens": self._work_prefill,
                            "decode_tokens": self._work_decode, "busy_s": self._busy_s,
                            "prefill_pairs": self._work_pairs},
        }

    @property
    def num_unfinished(self) -> int:
        return len(self._reqs)

    def generated_tokens(self, request_id: str) -> Optional[int]:
        """Output tokens generated so far for a request still in this engine (None: not here)."""
        s = self._reqs.get(request_id)
        return None if s is None else s.num_output

    def step_time(self, chunks=(), decode_contexts=()) -> float:
        """``profile.step_time``: seconds of a step with these prefill chunks and decode contexts."""
        return self.profile.step_time(chunks, decode_contexts)

    def _check_invariants(self) -> None:
        """Block accounting (O(#blocks); for tests only)."""
        total = self._total_blocks
        assert 0 <= self._num_free <= total, self._num_free
        anon = 0
        refs: dict = {}
        for s in self._running:
            assert s.status == _RUNNING
            assert len(s.hashed) <= s.num_blocks
            assert s.num_blocks * self._B >= s.num_computed
            anon += s.num_blocks - len(s.hashed)
            for h in s.hashed:
                refs[h] = refs.get(h, 0) + 1
        for s in self._waiting:
            assert s.num_blocks == 0 and not s.hashed
        for h, c in self._cached.items():
            assert c == refs.get(h, 0), (h, c, refs.get(h, 0))
            assert (c == 0) == (h in self._lru)
        assert len(self._lru) <= len(self._cached)
        assert self._num_free + len(self._cached) + anon == total, (
            self._num_free, len(self._cached), anon, total)
        assert len(self._running) <= self._max_seqs
