"""Base of the consistent-hashing policies (blind CH, SkyLB-CH): a ring hash on the session key.

The key is the request's session key (user id, session id, question id); without one, the first
``fallback_key_chars`` characters of the prompt. The pick is the first replica clockwise from the
key that is eligible (with blind pushing every replica is; SkyLB-CH walks past unavailable ones).
"""

from pydantic import Field

from .base import Decision, Policy
from .config import PolicyConfig
from .hash_ring import HashRing

__all__ = ["RingConfig", "RingPolicy", "ring_key"]


def ring_key(req, fallback_chars: int) -> str:
    return req.session_key if req.session_key else req.text[:fallback_chars]


class RingConfig(PolicyConfig):
    """Fields shared by the ring policies."""

    virtual_nodes: int = Field(1024, ge=1)
    fallback_key_chars: int = Field(256, ge=1)


class RingPolicy(Policy):
    """A hash ring over the targets; ``_pick`` walks it from the request's key."""

    def _targets_changed(self):
        if not hasattr(self, "ring"):
            self.ring = HashRing(virtual_nodes=self.config.virtual_nodes)
        self.ring.set_targets(self._targets)

    def _pick(self, req, eligible, now):
        key = ring_key(req, self.config.fallback_key_chars)
        t = self.ring.next_available(key, self.tracker.available if len(eligible) == len(self._targets)
                                     else set(eligible))
        return Decision(t if t is not None else eligible[0], reason="ring")
