"""SkyLB (§3.2-3.3, Algorithm 1): selective pushing by pending requests + the longest match in an
approximate prefix tree, among available replicas only.

Ties (and requests that match nowhere) go to the available replica with the fewest outstanding
requests. ``min_match_chars`` (0 = the paper's behaviour) ignores matches shorter than that, so a
shared system prompt alone does not pile every request onto one replica.
"""

from typing import Literal

from pydantic import Field

from ..base import Decision, least_loaded
from ..config import PolicyConfig, PrefixIndexConfig
from ..prefix_policy import PrefixPolicy


class SkyLB(PrefixPolicy):
    name = "skylb"
    default_availability = "sp-p"

    class Config(PolicyConfig):
        name: Literal["skylb"] = "skylb"
        prefix: PrefixIndexConfig = PrefixIndexConfig()
        min_match_chars: int = Field(0, ge=0)

    def _pick(self, req, eligible, now):
        best, matched = self.index.longest(self.prepared(req), self.available_view(eligible))
        if matched < max(1, self.config.min_match_chars):
            return Decision(least_loaded(eligible, self.tracker, self.rng), 0, "no_match")
        t = best[0] if len(best) == 1 else least_loaded(self.in_target_order(best), self.tracker, self.rng)
        return Decision(t, matched, "prefix")
