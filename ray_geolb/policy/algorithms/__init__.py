"""One short file per routing algorithm. Importing this package registers them all.

Single-region (layer-2) policies — each picks a replica among the eligible ones:

=====================  ===============================================================  =========
name                   algorithm                                                        pushing
=====================  ===============================================================  =========
round_robin            RR (SkyLB baseline)                                              blind
least_load             LL: fewest outstanding requests (SkyLB baseline)                 blind
power_of_two           Ray Serve's default: 2 random, fewer in flight                   blind
consistent_hash        CH: ring hash on the session key (SkyLB baseline)                blind
sglang                 SGLang router cache-aware (cache/balance thresholds)             blind
ray_prefix             Ray PrefixCacheAffinityRouter-like                               blind
oracle                 global view of every replica's real prefix cache (upper bound)   SP-P
skylb                  SkyLB: longest approximate prefix match among available          SP-P
skylb_ch               SkyLB-CH: ring walk skipping unavailable replicas                SP-P
=====================  ===============================================================  =========

The region layer (SkyLB's two layers) is in ``policy/two_layer.py``.
"""

from . import (  # noqa: F401
    consistent_hash,
    least_load,
    oracle,
    power_of_two,
    ray_prefix,
    round_robin,
    sglang,
    skylb,
    skylb_ch,
)
