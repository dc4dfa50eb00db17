"""FlowKV's load-aware scheduler (Appendix B, Algorithm 1) for colocated (non-disaggregated) replicas.

Per node ``i`` a comprehensive load score (Alg. 1 line 10, the signals we have):

    C_i = w_r·L_r/N + w_w·(L_w + U)/N + w_kv·KV_u + w_t·min(1, T_b)

* ``L_r``, ``L_w`` running / waiting requests, normalised by ``max_num_seqs`` (``N``, from stats or
  config); ``KV_u`` KV-cache usage; ``T_b`` token-budget use = waiting requests × mean prompt
  tokens / ``token_budget`` (``max_num_batched_tokens``) — each *smoothed* by a sliding window over
  the node's stats reports (mean of the reports within ``window_s``, at most ``window_samples``),
  as B.2 prescribes against bursty instantaneous samples;
* ``U`` (and its uncached tokens, added to ``T_b``): requests this router dispatched since the
  node's last report, added unsmoothed (``count_unseen``; the report cannot contain them — without
  this, every request between two reports herds onto the same node).

System score ``C = mean_i C_i`` (line 14) decides the scenario (lines 17-31):

* **normal** (``C ≤ eps_low``): line 19 — the node with the least estimated TTFT given its prefix
  hit and state: ``t_p·(L − L_hit) + t_p·Q`` (the shared cost of :mod:`.gorgo`: residual prefill plus
  queued tokens × t_p, t_p learned online);
* **imbalanced** (``eps_low < C ≤ eps_high``): line 25 — ``idle = {i | C_i < idle_threshold}``;
  route to the least-TTFT node *among idle nodes* (least ``C_i`` if none is idle);
* **extreme** (``C > eps_high``): least ``C_i`` (pure load), and once the state has lasted
  ``extreme_duration_s``, ``scale_signal = "up"`` (lines 29-30: an autoscaler reads it from
  ``describe()``); a system score ``≤ eps_scale_down`` for that long gives ``"down"`` (low load).

Gaps, stated: FlowKV is P/D-disaggregated — with colocated replicas there are no prefill/decode
roles, so the scores ``C^p``/``C^d`` collapse into one ``C``, "switch idle nodes' roles" (imbalanced)
becomes "send the work to the idle nodes", decode-node selection (line 22) has no counterpart, and
swapped/sending queues, GPU and memory-bandwidth utilisation are not reported by the engine (their
weights are 0). The paper does not publish its weights or thresholds ("determined through several
experiments"); the defaults here are ours and configurable.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, Hashable, Literal, Tuple

from pydantic import Field, model_validator

from ..base import Decision
from ..cost_policy import CostConfig, CostPolicy

__all__ = ["FlowKV"]


class FlowKV(CostPolicy):
    name = "flowkv"
    default_availability = "bp"

    class Config(CostConfig):
        name: Literal["flowkv"] = "flowkv"
        w_running: float = Field(0.3, ge=0.0)
        w_waiting: float = Field(0.4, ge=0.0)
        w_kv: float = Field(0.2, ge=0.0)
        w_token: float = Field(0.1, ge=0.0)
        window_s: float = Field(5.0, gt=0.0, description="sliding window over stats reports (seconds)")
        window_samples: int = Field(16, ge=1, description="most reports kept per node")
        eps_low: float = Field(0.5, ge=0.0, description="system score at or below which the load is normal")
        eps_high: float = Field(0.85, ge=0.0, description="system score above which the load is extreme")
        idle_threshold: float = Field(0.3, ge=0.0, description="C_i below this: an idle node (imbalanced state)")
        eps_scale_down: float = Field(0.05, ge=0.0, description="system score at or below which the load is low")
        extreme_duration_s: float = Field(10.0, ge=0.0, description="how long a state lasts before scale_signal")
        max_num_seqs: int = Field(256, ge=1, description="normaliser when stats do not report max_num_seqs")
        token_budget: int = Field(8192, ge=1, description="max_num_batched_tokens: the token-budget normaliser")
        count_unseen: bool = Field(True, description="add dispatches the last report has not seen (unsmoothed)")

        @model_validator(mode="after")
        def _order(self):
            if self.eps_high < self.eps_low:
                raise ValueError(f"eps_high ({self.eps_high}) must be >= eps_low ({self.eps_low})")
            if self.w_running + self.w_waiting + self.w_kv + self.w_token <= 0:
                raise ValueError("w_running + w_waiting + w_kv + w_token must be > 0")
            return self

    def __init__(self, config=None, targets=(), **kw):
        self._samples: Dict[Hashable, Deque[Tuple[float, float, float, float, float]]] = {}
        super().__init__(config, targets=targets, **kw)
        self.state = "normal"
        self.scale_signal = None
        self._state_since = None
        self._low_since = None
        self.system_score = 0.0

    # ------------------------------------------------------------ signals
    def on_stats(self, target, stats):
        super().on_stats(target, stats)
        if target not in self._target_set or self.tracker.stats(target) is not stats:
            return
        cfg = self.config
        n = stats.max_num_seqs or cfg.max_num_seqs
        kv = stats.kv_cache_usage or 0.0
        tb = stats.num_waiting * self.mean_prompt_tokens / cfg.token_budget
        q = self._samples.get(target)
        if q is None:
            q = self._samples[target] = deque(maxlen=cfg.window_samples)
        q.append((stats.timestamp, stats.num_running / n, stats.num_waiting / n, kv, tb))

    def _forget(self, target):
        super()._forget(target)
        self._samples.pop(target, None)

    def smoothed(self, target) -> Tuple[float, float, float, float]:
        """Window means of (running/N, waiting/N, KV usage, token-budget use)."""
        q = self._samples.get(target)
        if not q:
            return 0.0, 0.0, 0.0, 0.0
        horizon = q[-1][0] - self.config.window_s
        rows = [s for s in q if s[0] >= horizon]
        k = len(rows)
        return tuple(sum(r[i] for r in rows) / k for i in range(1, 5))

    def node_score(self, target) -> float:
        cfg = self.config
        r, w, kv, tb = self.smoothed(target)
        if cfg.count_unseen:
            s = self.tracker.stats(target)
            n = (s.max_num_seqs if s is not None and s.max_num_seqs else cfg.max_num_seqs)
            cnt, _, unc = self.work.unseen(target, s.timestamp if s is not None else None)
            w += cnt / n
            tb += unc / cfg.token_budget
        return cfg.w_running * r + cfg.w_waiting * w + cfg.w_kv * kv + cfg.w_token * min(1.0, tb)

    def update_state(self, now: float) -> Dict[Hashable, float]:
        cfg = self.config
        scores = {t: self.node_score(t) for t in self._targets}
        c = sum(scores.values()) / len(scores) if scores else 0.0
        self.system_score = c
        state = "normal" if c <= cfg.eps_low else ("imbalanced" if c <= cfg.eps_high else "extreme")
        if state != self.state or self._state_since is None:
            self.state, self._state_since = state, now
        low = c <= cfg.eps_scale_down
        if not low:
            self._low_since = None
        elif self._low_since is None:
            self._low_since = now
        if state == "extreme" and now - self._state_since >= cfg.extreme_duration_s:
            self.scale_signal = "up"
        elif low and now - self._low_since >= cfg.extreme_duration_s:
            self.scale_signal = "down"
        else:
            self.scale_signal = None
        return scores

    # ------------------------------------------------------------ routing
    def _pick(self, req, eligible, now, hits=None):
        scores = self.update_state(now)
        cfg = self.config
        if self.state == "extreme":
            return Decision(self._argmin({t: scores[t] for t in eligible}), 0, "extreme_least_score")
        cands = eligible
        reason = "normal_ttft"
        if self.state == "imbalanced":
            idle = [t for t in eligible if scores[t] < cfg.idle_threshold]
            if not idle:
                return Decision(self._argmin({t: scores[t] for t in eligible}), 0, "imbalanced_least_score")
            cands, reason = idle, "imbalanced_idle_ttft"
        d = super()._pick(req, cands, now, hits)
        d.reason = reason
        return d

    def describe(self) -> dict:
        d = super().describe()
        d.update(state=self.state, system_score=self.system_score, scale_signal=self.scale_signal)
        return d
