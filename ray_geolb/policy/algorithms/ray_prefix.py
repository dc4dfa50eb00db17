"""Ray Serve's PrefixCacheAffinityRouter, re-implemented as a pure policy (blind pushing).

Ray 2.60 (``prefix_aware_router.py``): if the queue-length spread exceeds ``imbalanced_threshold``,
fall back to power of two; otherwise match the prompt in the prefix tree; if the match rate is below
``match_rate_threshold`` pick among the targets with the smallest trees, else among the best
matches; within the chosen set, power of two on queue length. Ray keeps its tree in a separate
actor and calls it synchronously; here the tree is in process.
"""

import math
from typing import Literal

from pydantic import Field

from ..base import Decision
from ..config import PolicyConfig, PrefixIndexConfig
from ..prefix_policy import PrefixPolicy


class RayPrefixAffinity(PrefixPolicy):
    name = "ray_prefix"
    default_availability = "bp"

    class Config(PolicyConfig):
        name: Literal["ray_prefix"] = "ray_prefix"
        prefix: PrefixIndexConfig = PrefixIndexConfig()
        imbalanced_threshold: float = Field(math.inf, ge=0)
        match_rate_threshold: float = Field(0.1, ge=0.0, le=1.0)

    def _two(self, cands):
        if len(cands) == 1:
            return cands[0]
        a, b = self.rng.sample(cands, 2)
        out = self.tracker.outstanding
        return a if out(a) <= out(b) else b

    def _pick(self, req, eligible, now):
        cfg = self.config
        loads = self.tracker.outstanding_of(eligible)
        if max(loads) - min(loads) > cfg.imbalanced_threshold:
            return Decision(self._two(eligible), reason="imbalanced")
        p = self.prepared(req)
        best, matched = self.index.longest(p, self.available_view(eligible))
        if not best or matched / max(1, p.length) < cfg.match_rate_threshold:
            size = self.index.chars_of
            smallest = min(size(t) for t in eligible)
            return Decision(self._two([t for t in eligible if size(t) == smallest]), 0, "smallest_tree")
        return Decision(self._two(self.in_target_order(best)), matched, "prefix")
