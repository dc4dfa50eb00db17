"""Blind consistent hashing (SkyLB baseline CH): ring hash on the session key, ignoring load.

The key is the request's session key (user id, session id, question id); without one, the first
``fallback_key_chars`` characters of the prompt.
"""

from typing import Literal

from pydantic import Field

from ..base import Decision, Policy, register
from ..config import PolicyConfig
from ..hash_ring import HashRing


def ring_key(req, fallback_chars: int) -> str:
    return req.session_key if req.session_key else req.text[:fallback_chars]


@register
class ConsistentHash(Policy):
    name = "consistent_hash"

    class Config(PolicyConfig):
        name: Literal["consistent_hash"] = "consistent_hash"
        virtual_nodes: int = Field(1024, ge=1)
        fallback_key_chars: int = Field(256, ge=1)

    def _targets_changed(self):
        if not hasattr(self, "ring"):
            self.ring = HashRing(virtual_nodes=self.config.virtual_nodes)
        self.ring.set_targets(self._targets)

    def _pick(self, req, eligible, now):
        key = ring_key(req, self.config.fallback_key_chars)
        t = self.ring.next_available(key, self.tracker.available if len(eligible) == len(self._targets) else set(eligible))
        return Decision(t if t is not None else eligible[0], reason="ring")
