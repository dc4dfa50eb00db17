"""Round robin (SkyLB baseline RR): the next eligible target in a fixed cycle."""

from typing import Literal

from ..base import Decision, Policy
from ..config import PolicyConfig


class RoundRobin(Policy):
    name = "round_robin"

    class Config(PolicyConfig):
        name: Literal["round_robin"] = "round_robin"

    _next = 0

    def _pick(self, req, eligible, now):
        allowed = set(eligible)
        targets = self._targets or eligible
        n = len(targets)
        for i in range(n):
            t = targets[(self._next + i) % n]
            if t in allowed:
                self._next = (self._next + i + 1) % n
                return Decision(t, reason="round_robin")
        return Decision(eligible[0], reason="round_robin")
