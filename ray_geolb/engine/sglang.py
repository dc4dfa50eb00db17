"""SGLang's admission semantics for the engine model (``admission="sglang"`` in a profile).

Checked against SGLang v0.4.6.post5 (the release of the month SkyLB's references were accessed,
May 2025); paths below are in that wheel under ``sglang/``. The vLLM model (engine.py) reserves no
KV for output it has not produced yet; SGLang does, so it admits fewer requests and queues earlier.
What this model does, and where SGLang does it:

* **One kind of batch per step** (``srt/managers/scheduler.py:1289-1337``, ``get_next_batch_to_run``):
  a prefill batch if ``get_new_batch_prefill`` returns one, else a decode step of every running
  request. Running requests do not decode during a prefill step (``enable_mixed_chunk`` is off by
  default, ``srt/server_args.py:167``; not modelled).
* **Admission** (``scheduler.py:1345-1497`` and ``PrefillAdder``, ``srt/managers/schedule_policy.py:268-506``):
  with ``A`` = free + evictable (unlocked prefix-cache) tokens,

      reserved = sum over running r of min(r.max_new - r.output, clip) * new_token_ratio     (:297-306)
               + sum over requests admitted in this batch of (extend + min(max_new, clip))    (:336-346)

  a waiting request (FCFS, head first) is admitted while ``extend + min(max_new, clip) < A - reserved``
  (``add_one_req`` :445-506; "NO_TOKEN" latches ``batch_is_full`` and stops, :1420-1430). New
  requests reserve their whole clipped ``max_new`` (ratio 1); v0.4.6 does not subtract the output a
  retracted request already produced. A prompt longer than the chunk budget is prefilled in chunks
  (``chunked_req``; its ``max_new`` is reserved with its last chunk, ``add_chunked_req`` :348-365),
  and the chunked request always continues first.
* **batch_is_full** stays set until the running batch shrinks: a finish or a retraction, seen by the
  next decode step's ``filter_batch`` (``scheduler.py:1503-1531``), or a prefill request that
  finished (the merge, :1309-1311). The ratio decaying does not clear it.
* **Decode memory and retraction** (``srt/managers/schedule_batch.py:1317-1430``): a decode step needs
  one new token slot per running request (here: one block per request whose last block is full).
  If free + evictable cannot give them, requests are **retracted**: sorted by (output tokens, -prompt
  tokens) descending and popped from the end (fewest outputs, longest prompt first), at least one,
  then while ``available < retract_decode_steps * remaining``, never the last one. A retracted
  request frees its blocks (its prompt stays in the prefix cache), keeps its output, and goes to the
  **end** of the waiting queue (``scheduler.py:1068-1075``); then
  ``new_token_ratio = min(1, (sum output + 20 * n) / sum max_new)`` over the requests left.
* **new_token_ratio schedule** (``scheduler.py:393-406``, ``srt/global_config.py:23-35``): starts at
  ``init = min(0.7 * conservativeness, 1)``; every decode step without retraction lowers it by
  ``(init - init * 0.14) / 600`` down to ``init * 0.14``; prefill steps leave it; an idle engine resets
  it to ``init`` (``scheduler.py:648-651``).
* ``max_new_tokens`` without a client ``max_tokens`` is ``max_req_len - prompt - 1``
  (``scheduler.py:1019-1026``, ``max_req_len = min(context_len - 1, pool tokens - 1)``,
  ``srt/managers/tp_worker.py:129-132``); the reservation clips it at 4096
  (``CLIP_MAX_NEW_TOKENS_ESTIMATION``, ``schedule_policy.py:34-36``).

Reports (``stats()``): ``num_waiting`` is the waiting queue after the step's admissions, retracted
requests included (SGLang's ``num_queue_reqs``, ``scheduler.py:1170``); ``num_running`` counts the
running batch, not the request being prefilled in chunks (as SGLang's ``num_running_reqs``);
``kv_cache_usage`` is used / total without reservations (SGLang's ``token_usage``); the extra key
``new_token_ratio`` is the current ratio.

Differences, by design: KV is allocated in blocks of ``block_tokens`` (SGLang's page is 1 token), so
a request may hold up to ``block_tokens - 1`` tokens more, and an admission that passes SGLang's
token check but not the block check counts as "no token"; decode steps and prefix hits are the
engine model's (engine.py); finished requests leave the reservation at once (SGLang filters them
at the next decode step); the overlap scheduler's one-step lag is not modelled.
"""

from __future__ import annotations

from typing import Optional

from .admission import max_new as _max_new
from .admission import max_req_len as _max_req_len
from .admission import sglang_reservation
from .engine import _DONE, _RUNNING, _WAITING, EngineModel, StepOutput

__all__ = ["SGLangEngineModel", "sglang_reservation"]


class SGLangEngineModel(EngineModel):
    """:class:`EngineModel` with SGLang's scheduler (module docstring); built by ``make_engine(profile)``
    (engine/factory.py) when the profile's (or config's) ``admission`` is ``"sglang"``."""

    def __init__(self, profile, config=None):
        super().__init__(profile, config)
        c = self.config
        init = min(c.sgl_init_new_token_ratio * c.sgl_schedule_conservativeness, 1.0)
        self._ratio_init = init
        self._ratio_min = min(init * c.sgl_min_new_token_ratio_factor, 1.0)
        self._ratio_decay = (init - self._ratio_min) / c.sgl_new_token_ratio_decay_steps
        self._ratio = init
        self._clip = c.sgl_clip_max_new_tokens
        self._retract_steps = c.sgl_retract_decode_steps
        self._max_prefill = c.sgl_max_prefill_tokens
        self._batch_full = False  # SGLang's running_batch.batch_is_full
        self._shrunk = False  # the running batch lost a request since the last decode step
        self._chunk = None  # the request being prefilled in chunks (SGLang's chunked_req)

    # ------------------------------------------------------------------ requests
    def add_request(self, req, now: float) -> None:
        """As :meth:`EngineModel.add_request`, and also rejects what SGLang could never admit: output
        beyond its ``max_req_len``, or a prompt plus its reservation larger than the whole cache."""
        c = self.config
        p, o, m = req.prompt_tokens, req.output_tokens, req.max_new_tokens
        if type(p) is int and type(o) is int and p >= 1 and o >= 1:
            if m is None and _max_new(c, p, None) < o:
                raise ValueError(f"request {req.request_id!r}: {p} prompt + {o} output tokens exceed SGLang's "
                                 f"max_req_len {_max_req_len(c)}")
            if (m is None or type(m) is int) and p + sglang_reservation(c, p, m) >= c.num_gpu_blocks * c.block_tokens:
                raise ValueError(f"request {req.request_id!r} can never be admitted: {p} prompt tokens + "
                                 f"{sglang_reservation(c, p, m)} reserved output tokens do not fit the KV cache "
                                 f"of {c.num_gpu_blocks * c.block_tokens} tokens")
        super().add_request(req, now)
        self._reqs[req.request_id].max_new = _max_new(c, p, m)

    def abort(self, request_id: str, now: Optional[float] = None) -> bool:
        s = self._reqs.get(request_id)
        if s is None:
            return False
        if s is self._chunk:
            del self._reqs[request_id]
            s.status = _DONE
            self._free(s)
            self._chunk = None
            return True
        if s.status == _RUNNING:
            self._shrunk = True
        return super().abort(request_id, now)

    def next_ready_time(self) -> Optional[float]:
        if self._chunk is not None:
            return self._now
        return super().next_ready_time()

    # ------------------------------------------------------------------ stepping
    def step(self, now: float) -> StepOutput:
        """One SGLang scheduler iteration: a prefill batch if one can be formed, else a decode step."""
        self._now = now
        if self._pending and self._pending[0][0] <= now:
            self._release_pending(now)
        if not self._running:
            self._batch_full = False  # an empty running batch is never full
        if not self._running and not self._waiting and self._chunk is None:
            self._ratio = self._ratio_init
            self._waiting_reported = 0
            return StepOutput(0.0)
        batch = self._prefill_batch()
        if batch:
            self._waiting_reported = len(self._waiting)
            out = self._run_prefill(batch)
        else:
            out = self._run_decode()
        if not self._running and not self._waiting and self._chunk is None:
            self._ratio = self._ratio_init  # idle: scheduler.py:648-651
        return out

    def _reserved(self) -> float:
        """KV tokens the running batch keeps for its expected output (schedule_policy.py:297-306)."""
        r, clip = self._ratio, self._clip
        off = 0.0
        for s in self._running:
            left = s.max_new - s.num_output
            off += (left if left < clip else clip) * r
        return off

    def _prefill_batch(self) -> list:
        """SGLang's ``get_new_batch_prefill``: the requests to prefill this step, each with ``sched``
        set to its tokens this step (the chunked request first); [] if none."""
        waiting, chunk = self._waiting, self._chunk
        if (self._batch_full or not waiting) and chunk is None:
            return []
        nrun = len(self._running)
        if self._max_seqs - nrun <= 0 and chunk is None:
            self._batch_full = True
            return []
        B = self._B
        budget = {"avail": (self._num_free + len(self._lru)) * B, "off": self._reserved(), "cur": 0,
                  "in": self._max_prefill, "chunk": self._max_tokens if self._chunked else 1 << 62}
        batch = []
        if chunk is not None and not self._continue_chunk(chunk, budget, batch):
            return []
        while waiting:
            if len(batch) >= self._max_seqs - nrun:
                self._batch_full = True
                break
            res = self._try_admit(waiting[0], budget, batch)
            if res != "continue":
                if res == "no_token":
                    self._batch_full = True
                break
        return batch

    def _continue_chunk(self, s, budget: dict, batch: list) -> bool:
        """``add_chunked_req``: the next chunk of the request being prefilled (it stays ``self._chunk``
        until its last chunk). False if its blocks cannot be had (SGLang's accounting rules that out;
        block rounding may not: it then waits for a decode step to free some)."""
        ext = s.num_tokens - s.num_computed
        n = ext if ext <= budget["chunk"] else budget["chunk"]
        need = (s.num_computed + n + self._B - 1) // self._B - s.num_blocks
        if need > 0 and not self._alloc(s, need):
            return False
        if n == ext:
            self._chunk = None
        res = min(s.max_new, self._clip) if n == ext else 0
        budget["off"] += n + res
        budget["cur"] += n
        budget["in"] -= n
        budget["chunk"] -= n
        s.sched = n
        batch.append(s)
        return True

    def _try_admit(self, s, budget: dict, batch: list) -> str:
        """``PrefillAdder.add_one_req`` for the head of the waiting queue: 'continue', 'no_token' or 'other'."""
        B = self._B
        hits, in_lru = self._prefix_hits(s)
        computed = hits * B
        ext = s.num_tokens - computed
        total = ext + min(s.max_new, self._clip)
        if total >= budget["avail"] - budget["off"]:
            return "no_token"  # schedule_policy.py:460
        if ext > budget["in"] and batch:
            return "other"  # :463
        avail = budget["avail"] - in_lru * B  # locking the matched prefix makes it unevictable
        if total > avail - budget["off"]:
            return "no_token"  # :467
        n = ext if ext <= budget["chunk"] else budget["chunk"]
        if n <= 0:
            return "other"
        need = (computed + n + B - 1) // B - hits
        if need > self._num_free + len(self._lru) - in_lru:
            return "no_token"  # block rounding (SGLang's page is one token)
        self._admit(s, hits, need, n)
        budget["avail"] = avail
        budget["off"] += n + (total - ext if n == ext else 0)
        budget["cur"] += n
        budget["in"] -= n
        budget["chunk"] -= n
        batch.append(s)
        if n < ext:
            self._chunk = s
            return "other"
        if budget["avail"] - budget["off"] <= 0 or budget["avail"] - budget["cur"] <= 0:
            return "no_token"  # budget_state, :325-334
        if budget["in"] <= 0 or budget["chunk"] <= 0:
            return "other"
        return "continue"

    def _admit(self, s, hits: int, need: int, n: int) -> None:
        """Move the head of the waiting queue into the prefill batch: lock its cached prefix, allocate."""
        self._waiting.popleft()
        self._lock_prefix(s, hits)
        s.num_computed = hits * self._B
        if need > 0:
            self._alloc(s, need)  # checked by the caller
        if not s.resumed:
            self._q_tokens += s.prompt
            self._hit_tokens += hits * self._B
        if s.sched_ts < 0.0:
            s.sched_ts = self._now
            s.uncached = s.prompt - hits * self._B
        s.status = _RUNNING
        s.sched = n

    def _run_prefill(self, batch: list) -> StepOutput:
        """A prefill-only step: prompts advance by their ``sched`` tokens; a finished prompt samples its
        token and joins the running batch (or finishes); the unfinished one stays the chunked request."""
        prefill = 0
        attn = pairs = 0.0
        q, m = self._q, self._m
        first, first_seqs, tokens, finished = [], [], [], []
        running = self._running
        for s in batch:
            n = s.sched
            before = s.num_computed
            c = before + n
            pr = n * (before + 0.5 * n)
            pairs += pr
            pr *= q
            rd = m * c
            attn += pr if pr > rd else rd
            prefill += n
            s.num_computed = c
            if self._caching and s.next_hash < len(s.hashes):
                self._register_blocks(s, c)
            if c < s.num_tokens:
                continue  # a chunk: self._chunk
            s.num_tokens += 1
            o = s.num_output + 1
            s.num_output = o
            tokens.append(s.id)
            if o == 1:
                first.append(s.id)
                first_seqs.append(s)
            if o >= s.max_out:
                finished.append(s.id)
                s.status = _DONE
                self._free(s)
                del self._reqs[s.id]
            else:
                running.append(s)
        if finished:
            self._num_finished += len(finished)
            self._batch_full = False  # the merge saw the prefill batch shrink (scheduler.py:1309-1311)
        self._num_steps += 1
        dur = self._step.time_of(prefill, len(batch), 0, 0, 0, attn)
        self._busy_s += dur
        self._work_prefill += prefill
        self._work_pairs += pairs
        return StepOutput(dur, first, tokens, finished, [], prefill, 0,
                          self._first_timings(first_seqs, self._now + dur))

    def _run_decode(self) -> StepOutput:
        """``update_running_batch``: clear ``batch_is_full`` if the batch shrank, check decode memory
        (retract if short, else decay the ratio), then one decode token for every running request."""
        if self._shrunk:
            self._batch_full = False
            self._shrunk = False
        running = self._running
        if not running:
            self._waiting_reported = len(self._waiting)
            return StepOutput(0.0)
        B = self._B
        need = 0
        for s in running:
            if s.num_computed + 1 > s.num_blocks * B:
                need += 1
        retracted = []
        if need > self._num_free + len(self._lru):
            retracted = self._retract()
            self._batch_full = False
        else:
            r = self._ratio - self._ratio_decay
            self._ratio = r if r > self._ratio_min else self._ratio_min
        out = self._decode_step(self._running)
        if retracted:
            out.preempted = retracted + out.preempted
        if out.finished:
            self._shrunk = True
        return out

    def _retract(self) -> list:
        """``retract_decode`` (schedule_batch.py:1337-1430): free the fewest-output, longest-prompt
        requests until ``retract_decode_steps`` tokens per remaining request are available (at least
        one, never the last); they go to the end of the waiting queue. Returns their ids."""
        B = self._B
        running = self._running
        order = sorted(running, key=lambda s: (s.num_output, -s.prompt), reverse=True)
        steps = self._retract_steps
        out = []
        first = True
        while first or (self._num_free + len(self._lru)) * B < steps * len(order):
            if len(order) == 1:
                break
            first = False
            v = order.pop()
            self._free(v)
            v.num_computed = 0
            v.next_hash = 0
            v.status = _WAITING
            v.resumed = True
            self._waiting.append(v)
            out.append(v.id)
            self._num_preempted += 1
        self._running = [s for s in running if s.status == _RUNNING]
        left = self._running
        self._ratio = min(1.0, (sum(s.num_output for s in left) + steps * len(left)) /
                          sum(s.max_new for s in left))
        return out

    # ------------------------------------------------------------------ observability
    def stats(self) -> dict:
        st = super().stats()
        st["new_token_ratio"] = self._ratio
        return st

    def _check_invariants(self) -> None:
        running = self._running
        if self._chunk is not None:
            assert self._chunk.status == _RUNNING and self._chunk not in running
            self._running = running + [self._chunk]
        try:
            super()._check_invariants()
        finally:
            self._running = running
