"""BalanceRoute's data-parallel routers (README table): ``vllm_default``, ``jsq_load``, ``br0``.

All three push blindly (a DP router never holds a request) and combine the replica's last stats
report with the work this router dispatched *after* that report (which the report cannot show).

* ``vllm_default`` — vLLM's DP load balancer: ``score = 4·(waiting + unseen) + running``; lowest
  score wins, ties to the first replica (vLLM counts its own not-yet-reported dispatches as waiting).
* ``jsq_load`` — join the shortest queue by KV load:
  ``load = (kv_cache_usage·C + Σ prompt tokens dispatched since the report) / C``, where ``C`` is the
  replica's KV capacity in tokens (``num_gpu_blocks × block_tokens`` from stats, else
  ``capacity_tokens``). Without a reported usage, the router's own in-flight prompt tokens / C.
  Ties: fewer outstanding, then replica order.
* ``br0`` — BR-0-style overflow score with a JSQ-load tie-break. The README names the score but
  not its formula; we implement the *marginal expected KV overflow*:

      P(r)  = K(r) + Σ_{j in flight at r} max(0, ô_j − age_j · decode_tps)
      F(r)  = max(0, P(r) + L + ô − C(r)) − max(0, P(r) − C(r))

  ``K(r)`` is the KV in use now (as for ``jsq_load``); the sum is the KV the outstanding requests
  will still add if their outputs grow to their expected lengths ``ô_j`` (``output_tokens_hint``, or
  ``default_output_tokens``), less what ``decode_tps`` tokens/s per request have already produced
  since dispatch; ``L + ô`` is the new request's own peak KV. ``F`` is the overflow (tokens that will
  not fit — preemption/recompute in vLLM) *added by* this request. Why marginal rather than total:
  a replica that already overflows would otherwise look as bad as one where the request alone
  causes the overflow, and totals make every choice equal once all replicas overflow; the marginal
  form prefers room where it exists and, when every replica has room (F = 0 everywhere, the usual
  case at moderate load), falls through to the JSQ-load tie-break, as BalanceRoute's router does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Decision, Policy
from ..config import PolicyConfig
from ..ttft_model import WorkItem, WorkTracker

__all__ = ["VllmDefault", "JsqLoad", "BR0"]


class _DPConfig(PolicyConfig):
    capacity_tokens: int = Field(65536, ge=1, description="KV capacity (tokens) when stats do not report it")


class _DPPolicy(Policy):
    default_availability = "bp"

    def __init__(self, config=None, targets=(), **kw):
        self.work = WorkTracker()
        super().__init__(config, targets=targets, **kw)

    def _record(self, req, target, now):
        self.work.add(WorkItem(req.request_id, target, now, req.prompt_tokens, req.prompt_tokens,
                               req.output_tokens_hint))

    def on_complete(self, request_id, target=None, now=None, ttft_s=None, ok=True, req=None):
        self.work.pop(request_id)
        super().on_complete(request_id, target, now, ttft_s=ttft_s, ok=ok, req=req)

    def _forget(self, target):
        self.work.remove_target(target)

    # -------------------------------------------------------------- signals
    def capacity(self, t) -> float:
        s = self.tracker.stats(t)
        if s is not None and s.num_gpu_blocks and s.block_tokens:
            return float(s.num_gpu_blocks * s.block_tokens)
        return float(self.config.capacity_tokens)

    def kv_tokens(self, t) -> float:
        """KV tokens in use now: reported usage + prompt tokens dispatched since the report."""
        s = self.tracker.stats(t)
        if s is None or s.kv_cache_usage is None:
            return float(sum(it.prompt_tokens for it in self.work.items(t)))
        _, unseen_tokens, _ = self.work.unseen(t, s.timestamp)
        return s.kv_cache_usage * self.capacity(t) + unseen_tokens

    def kv_load(self, t) -> float:
        return self.kv_tokens(t) / self.capacity(t)

    def _min(self, eligible, key):
        best, best_k = None, None
        for t in eligible:  # first minimum in replica order
            k = key(t)
            if best_k is None or k < best_k:
                best, best_k = t, k
        return best


class VllmDefault(_DPPolicy):
    name = "vllm_default"

    class Config(_DPConfig):
        name: Literal["vllm_default"] = "vllm_default"

    def score(self, t) -> int:
        s = self.tracker.stats(t)
        waiting = s.num_waiting if s is not None else 0
        running = s.num_running if s is not None else 0
        return 4 * (waiting + self.tracker.unseen(t)) + running

    def _pick(self, req, eligible, now):
        return Decision(self._min(eligible, self.score), reason="vllm_default")


class JsqLoad(_DPPolicy):
    name = "jsq_load"

    class Config(_DPConfig):
        name: Literal["jsq_load"] = "jsq_load"

    def _pick(self, req, eligible, now):
        out = self.tracker.outstanding
        return Decision(self._min(eligible, lambda t: (self.kv_load(t), out(t))), reason="jsq_load")


class BR0(_DPPolicy):
    name = "br0"

    class Config(_DPConfig):
        name: Literal["br0"] = "br0"
        default_output_tokens: int = Field(256, ge=0, description="expected output length when a request has no hint")
        decode_tps: float = Field(25.0, ge=0.0,
                                  description="tokens/s one running request decodes (outputs already produced)")

    def _expected_out(self, hint: int) -> int:
        return hint if hint and hint > 0 else self.config.default_output_tokens

    def projected(self, t, now: float) -> float:
        """P(r): KV in use + what the outstanding requests' outputs will still add."""
        rate = self.config.decode_tps
        grow = 0.0
        for it in self.work.items(t):
            o = self._expected_out(it.output_tokens)
            grow += max(0.0, o - max(0.0, now - it.t) * rate)
        return self.kv_tokens(t) + grow

    def overflow(self, t, req, now: float) -> float:
        """F(r): KV overflow (tokens) added by placing ``req`` on ``t``."""
        c = self.capacity(t)
        p = self.projected(t, now)
        s = req.prompt_tokens + self._expected_out(req.output_tokens_hint)
        return max(0.0, p + s - c) - max(0.0, p - c)

    def _pick(self, req, eligible, now):
        out = self.tracker.outstanding
        t = self._min(eligible, lambda t: (self.overflow(t, req, now), self.kv_load(t), out(t)))
        return Decision(t, reason="br0")
