"""GORGO (§3.4): least estimated TTFT, and GORGO-proxy (one central LB with a global view).

For each available replica ``r`` (selective pushing, as GORGO routes locally when it can admit):

    cost(r) = w_rtt · RTT(r)                          0 locally; ``rtt_of_target`` hook for the proxy
            + w_prefill · t_p(r) · (L − L_hit(r))     residual prefill
            + q̂ · t_p(r) · Q(r)                       admission delay: queued tokens × t_p

* ``L`` = the request's prompt tokens; ``L_hit(r)`` = the prefix this LB already sent to ``r`` (the
  approximate prefix index), in tokens at ``chars_per_token`` (4) characters per token, capped at L;
* ``t_p(r)`` = seconds per prefill token learned online from observed TTFTs
  (:mod:`~ray_geolb.policy.ttft_model`, prior GORGO Table 1) — fed by ``on_complete(..., ttft_s=)``
  (simulator: the TTFT the LB sees, x = its dispatch-time estimate of uncached tokens) or by
  ``observe_ttft`` (Ray Serve: samples the replicas measure and report, x = the engine's own count);
* ``Q(r)`` = tokens queued ahead at ``r``: the replica's reported waiting requests × the mean prompt
  length, plus the uncached tokens of requests this LB dispatched since that report.

The region layer (local vs. peers, peer queues left out as in GORGO's code) is the ``cost`` selector
of :mod:`~ray_geolb.policy.region.cost_selector` with ``remote_queue=False`` (``GORGO_COST``).

``gorgo_proxy`` is the same cost over every replica of every region behind one central LB: the
simulator sets ``policy.rtt_of_target = fn`` where ``fn(target)`` (or ``fn(target, request)``, if
it takes two arguments, for the client's region) returns the RTT in seconds to that replica.
"""

from __future__ import annotations

from typing import Literal

from ..cost_policy import CostConfig, CostPolicy

__all__ = ["Gorgo", "GorgoProxy"]


class Gorgo(CostPolicy):
    name = "gorgo"

    class Config(CostConfig):
        name: Literal["gorgo"] = "gorgo"


class GorgoProxy(CostPolicy):
    name = "gorgo_proxy"

    class Config(CostConfig):
        name: Literal["gorgo_proxy"] = "gorgo_proxy"
