"""SkyLB-CH (SkyLB §3.2, Listing 1 lines 23-26): consistent hashing on the session key, walking
the ring past replicas that are not available under selective pushing by pending requests."""

from typing import Literal

from ..ring_policy import RingConfig, RingPolicy


class SkyLBCH(RingPolicy):
    name = "skylb_ch"
    default_availability = "sp-p"

    class Config(RingConfig):
        name: Literal["skylb_ch"] = "skylb_ch"
