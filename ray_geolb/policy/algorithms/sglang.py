"""SGLang router, cache-aware policy (sgl-router ``cache_aware``), with blind pushing.

Per request:
1. if the load is imbalanced — ``max - min > balance_abs_threshold`` and
   ``max > balance_rel_threshold * min`` over outstanding requests — go to the least loaded target;
2. otherwise match the prompt in the approximate prefix tree; if the match rate
   (matched / prompt length) exceeds ``cache_threshold``, go to the best-matching target;
3. otherwise go to the target whose tree is smallest (least cached text).
Defaults are sgl-router's (cache_threshold 0.5, balance_abs_threshold 32, balance_rel_threshold 1.0001).
"""

from typing import Literal

from pydantic import Field

from ..base import Decision, least_loaded
from ..config import PolicyConfig, PrefixIndexConfig
from ..prefix_policy import PrefixPolicy


class SGLangCacheAware(PrefixPolicy):
    name = "sglang"
    default_availability = "bp"

    class Config(PolicyConfig):
        name: Literal["sglang"] = "sglang"
        prefix: PrefixIndexConfig = PrefixIndexConfig()
        cache_threshold: float = Field(0.5, ge=0.0, le=1.0)
        balance_abs_threshold: int = Field(32, ge=0)
        balance_rel_threshold: float = Field(1.0001, ge=1.0)

    def _pick(self, req, eligible, now):
        cfg = self.config
        loads = self.tracker.outstanding_of(eligible)
        lo, hi = min(loads), max(loads)
        if hi - lo > cfg.balance_abs_threshold and hi > cfg.balance_rel_threshold * lo:
            return Decision(least_loaded(eligible, self.tracker, self.rng), reason="imbalanced")
        p = self.prepared(req)
        best, matched = self.index.longest(p, self.available_view(eligible))
        if best and matched / max(1, p.length) > cfg.cache_threshold:
            t = best[0] if len(best) == 1 else least_loaded(self.in_target_order(best), self.tracker, self.rng)
            return Decision(t, matched, "prefix")
        size = self.index.chars_of
        smallest = min(size(t) for t in eligible)
        return Decision(least_loaded([t for t in eligible if size(t) == smallest], self.tracker, self.rng), 0,
                        "smallest_tree")
