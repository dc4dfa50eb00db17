"""The region layer (SkyLB's layer 1): one region's load balancer over its peer regions.

``router.py`` (RegionRouter, PeerState, RegionDecision), ``config.py`` (TwoLayerConfig, the cost
selector's config and presets, and RegionLayerSettings / REGION_LAYER: how a region's LB is deployed),
one file per peer selector behind ``peer_selector.PeerSelector``, ``estimators.py`` (RTT, drain rate)
and ``local_layer.py`` (what it may ask of the local policy).
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
from .router import PEER_SELECTORS, PeerState, RegionDecision, RegionRouter

__all__ = ["GEOPREFIX_COST", "GORGO_COST", "PEER_SELECTORS", "REGION_LAYER", "REGION_PATTERN", "CostSelector",
           "CostSelectorConfig", "DrainRate", "LocalLayer", "LocalLoad", "PeerSelector", "PeerState", "RegionDecision",
           "RegionLayerSettings", "RegionRouter", "RttTable", "TwoLayerConfig"]
