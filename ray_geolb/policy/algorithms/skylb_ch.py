"""SkyLB-CH (SkyLB §3.2, Listing 1 lines 23-26): consistent hashing on the session key, walking
the ring past replicas that are not available under selective pushing by pending requests."""

from typing import Literal

from ..base import register
from .consistent_hash import ConsistentHash


@register
class SkyLBCH(ConsistentHash):
    name = "skylb_ch"
    default_availability = "sp-p"

    class Config(ConsistentHash.Config):
        name: Literal["skylb_ch"] = "skylb_ch"
