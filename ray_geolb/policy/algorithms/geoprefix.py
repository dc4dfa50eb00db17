"""GeoPrefix (ours): SkyLB's two layers and selective pushing, with a per-request TTFT cost.

Local layer (this policy; selective pushing by pending requests, as SkyLB): among the *available*
replicas,

    cost(r) = w_prefill · t_p · (L − L_hit(r)) + q̂ · t_p · Q(r) + w_shared · t_p · (L − L_hit(r)) · n(r)

* ``L_hit(r)`` — the prefix this LB already sent to ``r``, in tokens (``chars_per_token``), **ignored
  when shorter than ``min_match_chars``** (a shared system prompt alone must not pile every request
  onto one replica, vLLM production-stack #957) and **discounted by its age**
  (``0.5 ** (age/match_half_life_s)``: an old prefix is likely evicted from the engine's cache);
* ``Q(r)`` — the prefill tokens ahead of the request at ``r``: reported waiting × mean prompt +
  the uncached tokens of requests dispatched since that report (the report's staleness is
  corrected exactly by counting what it cannot have seen);
* ``t_p`` — learned online (shared :class:`~ray_geolb.policy.ttft_model.TtftModel`) from the engines' own
  step work between two reports (``ttft.source="engine_steps"``: busy time over steps, prefill and decode
  tokens -- prefill time, not TTFT, so queueing does not enter it; a report without ``engine_work``
  leaves the prior),
  **pooled over this LB's replicas** (``tp_scope="pooled"``): the replicas of one deployment run the
  same model on the same hardware, so their prefill rate is one number; a per-replica fit from
  observed TTFTs absorbs that replica's recent *queueing* (TTFT = queue + prefill), which makes a busy
  replica look slow per token and double-counts the queue that ``Q(r)`` already prices.

* ``n(r)`` — the requests this LB has in flight at ``r``, **at most 32** (``w_shared_max_inflight``). The
  residual prefill is not only this request's TTFT: in a continuous-batching engine every step that carries
  its prefill chunk is slower by ``t_p`` per token for every sequence in the batch, so recomputing a prefix
  at a busy replica costs everyone there. Pricing that (``w_shared = 1``) keeps a request on its cached
  replica unless another replica is cheaper *including* the recompute it would impose; with only
  the request's own TTFT, short-lived imbalance (``Q``) kept breaking affinity. Uncapped, with a few
  hundred requests in flight the term dwarfed any queue: a replica holding a prefix took every request
  that matched it, queued them for most of a second, and its sibling idled. The cap is measured, not
  derived (32, chosen over 64 on one demand's tuning seeds): RESULTS.md section 42b.
* **the cached context's attention** (``price_cached_context``, on): a prefill chunk attends to every
  token before it, so ``R = L − L_hit(r)`` uncached tokens after ``c = L_hit(r)`` cached ones cost
  ``t_p·R + q·R·(c + R/2)``, more than ``R`` tokens from zero, and a replica holding a long prefix saves
  ``t_p·c + q·c²/2`` against one that prefills the whole prompt (the linear price: ``t_p·c``). ``q`` is
  learned online with ``t_p`` from the engines' step work when their reports carry ``prefill_pairs``
  (:func:`~ray_geolb.policy.ttft_model.work_fit_pairs`; no profile constant); until then ``q = 0``.
* ``t_p`` is **floored at the prior** (``tp_floor="prior"``, GORGO Table 1's 0.0938 ms/token):
  observed TTFTs under load are mostly queueing, and the Theil–Sen slope then often clamps to 0;
  with ``t_p = 0`` every replica costs 0, ties go to the fewest outstanding requests and prefix
  affinity vanishes (and the region layer's stay cost drops to 0).

The measurements behind each term (pooled ``t_p``, ``w_shared``, the floor, ``min_match_chars``,
the slot wait) are in ``benchmarks/RESULTS.md`` section 8.

**SP-P as GeoPrefix runs it** (benchmarks/RESULTS.md sections 16, 44 and 45): a report with up to 8 requests
waiting still grants its slots less those; a request spends the share of its prompt the replica does not hold of a
slot, at least a quarter (``slots_by_uncached_share``); and **the holder pass** (``holder_pass_share`` = 0.5):
while some replica has a slot, a replica with none left still competes, priced by its queue, for a request whose
prompt it holds at least half of, if it has KV room and a free sequence slot (``CostPolicy.choose``). At a peak
the replica holding many conversations keeps taking their turns instead of sending them to replicas that prefill
them in full. ``geoprefix-one-slot`` in the simulator is GeoPrefix without either.

The minimum wins; ties go to the fewest outstanding requests. Every request trades its match
against each replica's load in the same units (seconds) — there is no fleet-wide "balance mode"
switch that flips all requests to load balancing at once (vllm-project/router #238).

Remote layer: ``TwoLayerConfig(remote="cost", cost=GEOPREFIX_COST)`` — the peer's LB queue,
queued tokens and replica count from its heartbeat, forwards sent since the heartbeat, staleness
inflation, RTT EWMA and the snapshot match, the requests in flight per replica on each side (their
term prices a prompt under the mean as a mean-sized one, ``shared_size="at_least_mean"``, so a busy
region forwards short prompts too: ``benchmarks/RESULTS.md`` section 46), and, in the cost of staying
when no local replica is available, the wait for a local engine slot (``stay_slot_wait``:
``q̂·(ahead+1)/drain_rate``, the measured local completion rate; the simulator and the Serve ingress feed it
alike through ``RegionRouter.on_local_complete``) (see :mod:`~ray_geolb.policy.region.cost_selector`). Data
residency: ``TwoLayerConfig.tenant_regions`` and ``RouteRequest.allowed_regions`` bound every forward.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from ..cost_policy import CostConfig, CostPolicy
from ..region.config import GEOPREFIX_COST
from ..ttft_model import TtftModelConfig

__all__ = ["GeoPrefix", "geoprefix_two_layer"]


class GeoPrefix(CostPolicy):
    name = "geoprefix"
    default_availability = "sp-p"
    #: SP-P as measured for GeoPrefix (benchmarks/RESULTS.md section 16): a report with up to 8 requests
    #: waiting still grants its slots less those -- SkyLB's strict rule (anything waiting: no slot until the
    #: next report) held requests at the router while KV-bound engines could have started them, and near
    #: its capacity the deployment collapsed into refusals
    default_pending_allowance = 8
    #: SP-P's slots spent by each prompt's uncached share (section 44), with the holder pass below (section 45)
    default_slots_by_uncached_share = True

    class Config(CostConfig):
        name: Literal["geoprefix"] = "geoprefix"
        min_match_chars: int = Field(256, ge=0, description="matches shorter than this count as no match")
        match_half_life_s: Optional[float] = Field(600.0, gt=0.0, description="discount a match by its age (None: off)")
        tp_scope: Literal["target", "pooled"] = Field("pooled", description="one t_p fit over this LB's replicas")
        tp_floor: Literal["none", "prior"] = Field("prior", description="t_p never below ttft.prior_tp_s")
        w_shared: float = Field(1.0, ge=0.0, description="price the residual prefill's slowdown of the requests "
                                                         "in flight at the replica")
        w_shared_max_inflight: Optional[int] = Field(
            32, ge=1, description="the shared term counts at most this many requests in flight (None: all): past a "
                                  "few dozen it outweighed any queue, so a replica holding a prefix kept taking work "
                                  "while its sibling idled (benchmarks/RESULTS.md section 42b)")
        ttft: TtftModelConfig = Field(TtftModelConfig(source="engine_steps"),
                                      description="t_p fitted on the engines' step work (prefill time, not TTFT)")
        learn_replies: bool = Field(
            True, description="index each finished request's prompt + reply at its replica (Policy.learn_reply): "
                              "the engine cached the reply, and a conversation's next turn starts with both")
        infer_replies: bool = Field(
            True, description="a replica this router sent a chat's previous turn to is credited with that turn's "
                              "reply too (matching.through_reply): what a sibling router's reply, not heard yet, says")
        holder_pass_share: Optional[float] = Field(
            0.5, gt=0.0, le=1.0,
            description="while some replica has a slot, a replica with none left still competes (priced by its "
                        "queue) for a request whose prompt it holds at least this share of, if it has KV room and a "
                        "free sequence slot (None: off; off under the region gate unless set, benchmarks/RESULTS.md "
                        "section 45)")
        price_cached_context: bool = Field(
            True, description="residual prefill priced t_p·R + q·R·(c + R/2) with q (per prefill-attention pair) "
                              "learned from the engines' prefill_pairs; False: the linear t_p·R of before")

    @property
    def learns_replies(self) -> bool:
        return self.config.learn_replies

    @property
    def infers_replies(self) -> bool:
        return self.config.infer_replies


def geoprefix_two_layer(region: str, **over) -> dict:
    """The ``TwoLayerConfig`` fields GeoPrefix uses: ``remote="cost"`` with the remote queue."""
    cfg = {"region": region, "remote": "cost", "cost": GEOPREFIX_COST.model_dump(exclude_unset=True)}
    cfg.update(over)
    return cfg
