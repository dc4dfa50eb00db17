"""The region layer (SkyLB's layer 1): one region's load balancer over its peer regions.

``router.py`` (RegionRouter, PeerState, RegionDecision), ``config.py`` (TwoLayerConfig, the cost
selector's config and presets, and RegionLayerSettings / REGION_LAYER: how a region's LB is deployed),
one file per peer selector behind ``peer_selector.PeerSelector``, ``estimators.py`` (RTT, drain rate),
``local_layer.py`` (what it may ask of the local policy), ``prefix_summary.py`` (the hash-only summary
of its replicas' prefixes a region publishes to its peers), ``queue_rule.py`` (the LB queue's go / wait /
refuse) and ``heartbeat.py`` (the heartbeat message), the last two run by the Serve ingress and the
simulator's LB alike.
"""

from .config import (
    GEOPREFIX_COST,
    GORGO_COST,
    REGION_LAYER,
    REGION_PATTERN,
    CostSelectorConfig,
    RegionLayerSettings,
    TwoLayerConfig,
)
from .cost_selector import CostSelector
from .estimators import DrainRate, RttTable
from .local_layer import LocalLayer, LocalLoad
from .peer_selector import PeerSelector
from .prefix_summary import PrefixSummary
from .router import PEER_SELECTORS, PeerState, RegionDecision, RegionRouter

__all__ = ["GEOPREFIX_COST", "GORGO_COST", "PEER_SELECTORS", "REGION_LAYER", "REGION_PATTERN", "CostSelector",
           "CostSelectorConfig", "DrainRate", "LocalLayer", "LocalLoad", "PeerSelector", "PeerState", "PrefixSummary",
           "RegionDecision", "RegionLayerSettings", "RegionRouter", "RttTable", "TwoLayerConfig"]
