"""Pure routing-policy core: no Ray import anywhere below this package.

The simulator (``ray_geolb.sim``) and the Ray Serve adapters (``ray_geolb.serve``) drive these same
objects, so a simulated result is a result about the shipped code.
"""

from .availability import LoadTracker, ReplicaStats
from .base import Decision, Policy, RouteRequest, UnknownPolicyError
from .canonical import PromptFormatError, canonical_text
from .config import AvailabilityConfig, PolicyConfig, PrefixIndexConfig
from .factory import POLICY_CLASSES, build_policy, config_for, parse_policy_config, policy_class, policy_names
from .hash_ring import HashRing
from .prefix_index import PrefixIndex
from .region.config import TwoLayerConfig
from .region.router import PeerState, RegionDecision, RegionRouter

__all__ = [
    "AvailabilityConfig",
    "Decision",
    "HashRing",
    "POLICY_CLASSES",
    "LoadTracker",
    "PeerState",
    "Policy",
    "PolicyConfig",
    "PrefixIndex",
    "PrefixIndexConfig",
    "PromptFormatError",
    "RegionDecision",
    "RegionRouter",
    "ReplicaStats",
    "RouteRequest",
    "TwoLayerConfig",
    "UnknownPolicyError",
    "build_policy",
    "canonical_text",
    "config_for",
    "parse_policy_config",
    "policy_class",
    "policy_names",
]
