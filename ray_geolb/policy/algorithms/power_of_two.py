"""Power of two choices (Ray Serve's default router): two random targets, the less loaded one.

Load is the router's own in-flight count (Ray uses the replica's queue length, which for an LLM
deployment with ``max_ongoing_requests=1e9`` is the same number).
"""

from typing import Literal

from ..base import Decision, Policy
from ..config import PolicyConfig


class PowerOfTwo(Policy):
    name = "power_of_two"

    class Config(PolicyConfig):
        name: Literal["power_of_two"] = "power_of_two"

    def _pick(self, req, eligible, now):
        if len(eligible) == 1:
            return Decision(eligible[0], reason="power_of_two")
        a, b = self.rng.sample(eligible, 2)
        out = self.tracker.outstanding
        return Decision(a if out(a) <= out(b) else b, reason="power_of_two")
