"""Global-view oracle: a central cache-aware LB with perfect knowledge of every replica's *real* prefix
cache. Not an upper bound (a policy that places requests differently can hit more); the simulator's
ideal bound is ``ray_geolb/sim/observe.py``.

Needs ``cache_probe(target, req) -> cached prefix tokens`` (the simulator passes the engines'
``cached_prefix_tokens``). Picks the available replica with the most cached tokens; ties and
misses go to the least loaded. Selective pushing by pending requests by default.
"""

from typing import Literal

from ..base import Decision, Policy, least_loaded
from ..config import PolicyConfig


class Oracle(Policy):
    name = "oracle"
    default_availability = "sp-p"

    class Config(PolicyConfig):
        name: Literal["oracle"] = "oracle"

    def _pick(self, req, eligible, now):
        if self.cache_probe is None:
            raise RuntimeError("the oracle policy needs cache_probe(target, request) (a global cache view)")
        best, best_v = [], 0
        for t in eligible:
            v = self.cache_probe(t, req)
            if v > best_v:
                best, best_v = [t], v
            elif v == best_v and v > 0:
                best.append(t)
        if not best:
            return Decision(least_loaded(eligible, self.tracker, self.rng), 0, "no_match")
        return Decision(least_loaded(best, self.tracker, self.rng), best_v * 4, "oracle")
