"""One short file per routing algorithm; ``policy/factory.py`` lists them all by name (importing this
package imports none of them).

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
oracle                 central LB, perfect knowledge of every replica's prefix cache    SP-P
skylb                  SkyLB: longest approximate prefix match among available          SP-P
skylb_ch               SkyLB-CH: ring walk skipping unavailable replicas                SP-P
gorgo                  GORGO: min RTT + t_p·(L − L_hit) + q̂·t_p·queued tokens          SP-P
gorgo_proxy            GORGO-proxy: the same cost over all regions' replicas (+ RTT)    SP-P
gorgo2                 GORGO v2: w_rtt·RTT + w_prefill·uncached + w_load·queued, ES-tuned blind
vllm_default           vLLM DP LB (BalanceRoute table): 4·waiting + running             blind
jsq_load               BalanceRoute JSQ-Load: least KV load (usage + unseen tokens)     blind
br0                    BR-0-style marginal KV overflow, JSQ-load tie-break              blind
flowkv                 FlowKV load-aware: windowed load score, normal/imbalanced/extreme blind
geoprefix              GeoPrefix (ours): TTFT cost, min match, aged matches             SP-P
=====================  ===============================================================  =========

Shared bases live beside the factory, not here: ``prefix_policy.py`` (prefix index), ``cost_policy.py``
(TTFT cost), ``ring_policy.py`` (hash ring), and the match helpers in ``matching.py``; an algorithm file
imports only those, never another algorithm's file.

The region layer (SkyLB's two layers) is the ``policy/region/`` package: ``RegionRouter`` and one
peer selector per ``TwoLayerConfig.remote`` (``remote="cost"``: GORGO's and GeoPrefix's cost over
staying vs. peers).
"""

