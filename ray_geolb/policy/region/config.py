"""Config models of the region layer (SkyLB's layer 1): :class:`TwoLayerConfig` and the 'cost' peer
selector's :class:`CostSelectorConfig`, with its two presets.

* ``GORGO_COST`` (``remote_queue=False``): GORGO's code leaves the peer's queue out;
* ``GEOPREFIX_COST``: the peer's queue (staleness-inflated), aged and minimum-length matches, the
  residual prefill's cost to the requests in flight (``w_shared``) and the wait for a local slot
  (``stay_slot_wait``). What each term means: ``region/cost_selector.py``.
"""

from __future__ import annotations

import re
from typing import Dict, FrozenSet, Literal, Optional

from pydantic import Field, field_validator

from ..config import PrefixIndexConfig, _Strict
from ..ttft_model import TtftModelConfig

__all__ = ["REGION_PATTERN", "CostSelectorConfig", "GORGO_COST", "GEOPREFIX_COST", "TwoLayerConfig"]

REGION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


class CostSelectorConfig(_Strict):
    remote_queue: bool = Field(True, description="count the peer's queue (GeoPrefix); False = GORGO")
    w_rtt: float = Field(1.0, ge=0.0)
    w_prefill: float = Field(1.0, ge=0.0)
    q_hat: float = Field(1.0, ge=0.0, description="weight of queue-wait terms (GORGO's q̂)")
    chars_per_token: float = Field(4.0, gt=0.0)
    min_match_chars: int = Field(0, ge=0, description="snapshot/local matches shorter than this are ignored")
    match_half_life_s: Optional[float] = Field(None, gt=0.0, description="discount a match by its age (None: off)")
    staleness_scale_s: Optional[float] = Field(None, gt=0.0,
                                               description="inflate a peer queue by (1 + age/scale) (None: off)")
    rtt_alpha: float = Field(0.3, gt=0.0, le=1.0, description="EWMA weight of a new RTT probe sample")
    unknown_rtt_s: float = Field(0.25, ge=0.0, description="RTT assumed for a peer never measured")
    stay_local: bool = Field(True, description="hold locally when staying is estimated cheaper than any forward")
    w_shared: float = Field(0.0, ge=0.0, description="price the residual prefill's slowdown of the requests in "
                                                     "flight per replica there (peer: heartbeat 'inflight'); 0 = off")
    stay_slot_wait: bool = Field(False, description="add q̂·(ahead+1)/drain_rate to staying when no local replica "
                                                    "is available (the wait for a local engine slot)")
    drain_window_s: float = Field(10.0, gt=0.0, allow_inf_nan=False,
                                  description="window of the local drain-rate estimate (stay_slot_wait)")
    drain_min_samples: int = Field(4, ge=2, description="completions in the window the drain rate needs (else unknown)")
    ttft: TtftModelConfig = TtftModelConfig()


GORGO_COST = {"remote_queue": False}
GEOPREFIX_COST = {"remote_queue": True, "min_match_chars": 256, "match_half_life_s": 600.0, "staleness_scale_s": 2.0,
                  "w_shared": 1.0, "stay_slot_wait": True}


class TwoLayerConfig(_Strict):
    region: str = Field(..., min_length=1, pattern=REGION_PATTERN, description="this LB's region name")
    tau: int = Field(2, ge=0, description="a peer whose LB queue is longer than this is unavailable")
    remote: Literal["prefix", "ring", "nearest", "cost"] = Field(
        "prefix", description="how a peer is chosen (region/router.py: PEER_SELECTORS)")
    max_hops: int = Field(1, ge=0, le=1, description="0 = region-local (never forward), 1 = SkyLB")
    peer_stale_s: float = Field(10.0, gt=0, description="a peer heartbeat older than this is ignored")
    snapshot: PrefixIndexConfig = PrefixIndexConfig(max_nodes=100_000)
    virtual_nodes: int = Field(256, ge=1)
    cost: CostSelectorConfig = Field(CostSelectorConfig(), description="the 'cost' selector's settings (remote='cost')")
    tenant_regions: Dict[str, FrozenSet[str]] = Field(default_factory=dict,
                                                      description="tenant -> regions its requests may be served in")

    @field_validator("tenant_regions")
    @classmethod
    def _check_tenants(cls, v):
        for tenant, regions in v.items():
            if not regions:
                raise ValueError(f"tenant {tenant!r} has an empty region set (omit the tenant for 'any region')")
            for r in regions:
                if not re.match(REGION_PATTERN, r):
                    raise ValueError(f"tenant {tenant!r}: invalid region name {r!r}")
        return v
