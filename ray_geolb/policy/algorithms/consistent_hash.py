"""Blind consistent hashing (SkyLB baseline CH): ring hash on the session key, ignoring load
(the ring walk is :class:`~ray_geolb.policy.ring_policy.RingPolicy`)."""

from typing import Literal

from ..ring_policy import RingConfig, RingPolicy


class ConsistentHash(RingPolicy):
    name = "consistent_hash"

    class Config(RingConfig):
        name: Literal["consistent_hash"] = "consistent_hash"
