"""Least load (SkyLB baseline LL): the target with the fewest outstanding requests."""

from typing import Literal

from ..base import Decision, Policy, least_loaded
from ..config import PolicyConfig


class LeastLoad(Policy):
    name = "least_load"

    class Config(PolicyConfig):
        name: Literal["least_load"] = "least_load"

    def _pick(self, req, eligible, now):
        return Decision(least_loaded(eligible, self.tracker, self.rng), reason="least_load")
