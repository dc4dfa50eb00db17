"""Config models of the region layer (SkyLB's layer 1): :class:`TwoLayerConfig`, the 'cost' peer
selector's :class:`CostSelectorConfig` with its two presets, and :class:`RegionLayerSettings` -- how every
region's load balancer is *deployed* (one object for the Serve ingress and the simulator: ``REGION_LAYER``).

* ``GORGO_COST`` (``remote_queue=False``): GORGO's code leaves the peer's queue out;
* ``GEOPREFIX_COST``: the peer's queue (staleness-inflated), aged and minimum-length matches, the
  residual prefill's cost to the requests in flight (``w_shared``) and the wait for a local slot
  (``stay_slot_wait``); its own forwards priced instead of capped (``forwards_cap_peers=False``) and
  layer 1 by expected TTFT also before saturation (``forward_before_saturation``, 1 s margin), and
  the peers' hash-only prefix summaries priced as their matches (``peer_summary``), and the in-flight
  term's residual at least a mean-sized prompt's (``shared_size="at_least_mean"``).
  What each term means: ``region/cost_selector.py``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, FrozenSet, List, Literal, Optional

from pydantic import Field, field_validator

from ..config import PrefixIndexConfig, _Strict
from ..ttft_model import TtftModelConfig

__all__ = ["REGION_PATTERN", "MAX_OFFER_SLOTS", "StealConfig", "CostSelectorConfig", "GORGO_COST", "GEOPREFIX_COST",
           "REGION_LAYER", "RegionLayerSettings", "TwoLayerConfig"]

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
    forwards_cap_peers: bool = Field(
        True, description="a forward RegionRouter.note_forward counts in a peer's queue also counts against that "
                          "peer's tau (availability) until its next heartbeat; False: this selector's own "
                          "forwarded-since-heartbeat accounting (Q_fwd in the remote queue, the in-flight count) "
                          "prices those forwards and availability reads the heartbeat's queue (no double counting)")
    forward_before_saturation: bool = Field(
        False, description="also price a forward when a local replica IS available (layer 1 by expected TTFT): "
                           "forward when the best peer is cheaper than staying by forward_margin_s")
    forward_margin_s: float = Field(0.25, ge=0.0, allow_inf_nan=False,
                                    description="saving (s of expected TTFT) a forward before saturation needs")
    forward_hysteresis: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False,
                                      description="while forwarding to a peer before saturation, keep doing so "
                                                  "while the saving exceeds this fraction of forward_margin_s")
    shared_size: Literal["prompt", "at_most_mean", "at_least_mean", "mean"] = Field(
        "prompt", description="the prompt size the in-flight term (w_shared) prices each side's residual at, the same "
                              "scale on every side of one comparison: 'prompt' its own; 'at_most_mean' a prompt past "
                              "the mean as a mean-sized one (min(1, mean / L): measured in benchmarks/RESULTS.md "
                              "section 43b, not adopted); 'at_least_mean' a prompt under the mean as a mean-sized one "
                              "(max(1, mean / L): section 46); 'mean' every prompt as a mean-sized one (mean / L: "
                              "section 46). The unscaled term grows with the prompt, so a busy region forwards its "
                              "longest prompts only and keeps every short one: its engines then ran twice the "
                              "others' decodes (section 46)")
    peer_summary: bool = Field(
        False, description="publish this region's prefix summary (region/prefix_summary.py: a Bloom filter over its "
                           "prefix index's recent block keys) with each heartbeat, and price a forward's residual "
                           "prefill at the peer's summary match too")
    summary_max_keys: int = Field(2048, ge=1, le=16384, description="block keys a published summary holds at most")
    summary_bits_per_key: int = Field(10, ge=4, le=32, description="Bloom filter bits per key (10: 7 hashes, "
                                                                   "<= 0.82 % false positives at full load)")
    home_key_chars: Optional[int] = Field(
        None, ge=1, description="a long prompt (at least this many bytes of canonical text) that no region is known "
                                "to hold to that depth, and of which this region knows no more than every peer "
                                "(nor any peer more than the others: home_needs_common_preamble), "
                                "has a home region: the highest rendezvous hash of its prefix key at this depth "
                                "over this region and its peers, the same in every region without any message; a "
                                "home peer is priced as if it held the prompt and needs no margin, so a new shared "
                                "context that arrives in several regions at once is prefilled once (None: off)")
    home_needs_common_preamble: bool = Field(
        True, description="the home rule also needs every peer to know no more of the prompt than 1.25x what the "
                          "region that knows least knows (+ min_match_chars): a peer that knows more was sent the "
                          "prompt's history, and its match decides; False: only this region's knowledge is checked "
                          "(before benchmarks/RESULTS.md section 43a, when a home peer priced as holding the whole "
                          "prompt outbid a peer that held most of it)")
    ttft: TtftModelConfig = TtftModelConfig()


#: the most slots one steal offer may carry (a bound on what a victim hands over at once)
MAX_OFFER_SLOTS = 1024


class StealConfig(_Strict):
    """``TwoLayerConfig.steal``: whether this region steals and is stolen from, and the exchange's bounds."""

    enabled: bool = Field(False, description="offer free slots to peers with held requests, and hand held "
                                             "requests over to a peer's offer")
    offer_ttl_s: float = Field(1.0, gt=0.0, allow_inf_nan=False,
                               description="an offer's slots are held this long; a stolen request arriving later "
                                           "is refused (it goes back to its victim's queue)")
    max_in_flight: int = Field(16, ge=1, le=MAX_OFFER_SLOTS,
                               description="requests one victim has handed to one thief and not yet seen settled")
    min_gain_s: float = Field(0.0, ge=0.0, allow_inf_nan=False,
                              description="a request moves only if the thief's expected TTFT plus the RTT beats "
                                          "its expected TTFT here by this much")
    scan: int = Field(64, ge=1, le=4096, description="held requests (oldest first) a victim considers per offer")


#: the two presets of the 'cost' selector, as config instances (frozen; ``preset.model_copy(update={...})``
#: for a variant). ``model_dump(exclude_unset=True)`` is what a preset sets beyond the defaults.
GORGO_COST = CostSelectorConfig(remote_queue=False)
GEOPREFIX_COST = CostSelectorConfig(remote_queue=True, min_match_chars=256, match_half_life_s=600.0,
                                    staleness_scale_s=2.0, w_shared=1.0, stay_slot_wait=True,
                                    forwards_cap_peers=False, forward_before_saturation=True, forward_margin_s=1.0,
                                    peer_summary=True, home_key_chars=8000, shared_size="at_least_mean")


class RegionLayerSettings(_Strict):
    """How one region's load balancer is deployed, wherever it runs: the Serve ingress takes its defaults
    from here (``serve/ingress/config.py``: ``IngressConfig`` and its ``RegistryOptions``), and the
    simulator builds every per-region LB from it (``sim/deploy.py``: ``DeploymentSpec.region_layer``).
    ``tests/sim/test_simulator_runs_the_serve_region_layer_config.py`` compares the two field by field.

    What each field means on the two sides:

    * ``peer_stale_s`` -- ``TwoLayerConfig.peer_stale_s`` (its default is this one);
    * ``heartbeat_period_s`` -- each LB sends its heartbeat to the registry and reads the peer table
      back in one call, once per period (Serve: ``RegistryOptions.period_s``, ``RegistryClient``; the
      simulator: the same ``RegistryState`` in one region, each leg paying the one-way delay);
    * ``registry_standbys`` -- regions that run a standby registry beside the primary one (the home
      region's). Each LB sends each heartbeat to every registry and applies every table it gets back; a
      peer's state is the freshest any registry reported (``RegionRouter.update_peer`` keeps the newer
      timestamp), so the regions keep forwarding through the loss of any one registry's region, and no
      failover or fail-back decision exists to go wrong after a partition heals. The primary alone mirrors
      the regional snapshot (Serve: ``RegistryOptions.standbys``, ``PeerMesh``; the simulator:
      ``RegionLB.on_heartbeat``). Empty by default: one registry;
    * ``rtt_probe_period_s`` -- each LB pings its peers one after another, then waits this long; the
      samples feed ``RegionRouter.observe_rtt`` and travel to the peers through the registry (the
      heartbeat's ``PeerState.rtt_s``: this region's measurement, else the peer's, else unknown);
    * ``note_forwards`` -- after each forward the LB counts one request in that peer's queue until the
      next peer table replaces the entry (``RegionRouter.note_forward``; Serve: ``RequestPath._forward``),
      so a burst stops going to a peer after ~``tau`` forwards per table instead of herding there
      (for SkyLB's selectors and GORGO's; GeoPrefix's cost selector prices those forwards itself and
      sets ``CostSelectorConfig.forwards_cap_peers=False``: the count stays, the availability cap goes);
    * ``forward_past_queue`` -- the LB queue is FCFS for *local* capacity only: a newcomer behind
      waiting requests, and a waiting request that is not the head, may still be forwarded (or
      rejected) -- each decided with the real number of requests ahead of it, which is what the
      'cost' selector's slot wait prices (Serve: ``AdmissionQueue``). Off: strict FCFS, only the
      head is decided (the simulator's central LBs, which are not this ingress);
    * ``max_queue`` / ``max_wait_s`` / ``retry_after_s`` -- a request that must wait when ``max_queue``
      already wait is refused (Serve: HTTP 429); one that waited ``max_wait_s`` is refused (HTTP 503);
      both tell the client to retry after ``retry_after_s``. The simulator's clients do (counters
      ``lb_queue_full`` / ``lb_wait_timeout``; the request stays in flight);
    * ``default_policy`` -- the local policy of a region app that names none (Serve:
      ``serve.router.DEFAULT_POLICY``);
    * ``peer_selectors`` -- local policy -> the ``TwoLayerConfig`` fields of its region layer (the peer
      selector and its settings); a policy not listed gets SkyLB's prefix selector (the default).

    ``note_forwards`` and ``forward_past_queue`` are code paths in Serve, not options; the flags let
    the simulator switch them off for an ablation, and the comparison test checks that the Serve code
    still does what the defaults say."""

    peer_stale_s: float = Field(2.0, gt=0, description="a peer heartbeat older than this is ignored")
    heartbeat_period_s: float = Field(0.25, gt=0, description="heartbeat + peer-table read through the registry")
    registry_standbys: List[str] = Field(
        default_factory=list,
        description="regions that run a standby registry beside the primary: each heartbeat goes to every "
                    "registry and every table is applied, a peer's freshest state winning")
    rtt_probe_period_s: float = Field(1.0, gt=0, description="pause between two rounds of RTT probes")
    note_forwards: bool = Field(True, description="count each forward in the peer's queue until the next table")
    forward_past_queue: bool = Field(True, description="a request behind waiting ones may still be forwarded")
    max_queue: int = Field(256, ge=0, description="requests that may wait at one LB (more: refused, HTTP 429)")
    max_wait_s: float = Field(30.0, gt=0, description="longest wait at one LB (then refused, HTTP 503)")
    retry_after_s: float = Field(1.0, ge=0, description="Retry-After of a refusal (simulated clients honour it)")
    default_policy: str = Field("geoprefix", min_length=1, description="local policy of an app that names none")
    peer_selectors: Dict[str, Dict[str, Any]] = Field(
        default_factory=lambda: {
            "geoprefix": {"remote": "cost", "cost": GEOPREFIX_COST.model_dump(exclude_unset=True)},
            "gorgo": {"remote": "cost", "cost": GORGO_COST.model_dump(exclude_unset=True)},
            "skylb_ch": {"remote": "ring"},
        },
        description="local policy -> TwoLayerConfig fields of its region layer (others: the prefix selector)")

    @field_validator("registry_standbys")
    @classmethod
    def _check_standbys(cls, v):
        for r in v:
            if not re.match(REGION_PATTERN, r):
                raise ValueError(f"registry_standbys: invalid region name {r!r}")
        if len(set(v)) != len(v):
            raise ValueError(f"registry_standbys lists a region twice: {v}")
        return v

    def two_layer(self, policy: Optional[str] = None) -> Dict[str, Any]:
        """The ``TwoLayerConfig`` fields (no ``region``) of a region LB whose local policy is ``policy``
        (None: ``default_policy``): ``peer_stale_s`` and the policy's peer selector. A fresh dict."""
        sel = self.peer_selectors.get(self.default_policy if policy is None else policy, {})
        out: Dict[str, Any] = {"peer_stale_s": self.peer_stale_s}
        out.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in sel.items()})
        return out


#: the one deployed default (the Serve ingress's defaults and the simulator's per-region LBs)
REGION_LAYER = RegionLayerSettings()


class TwoLayerConfig(_Strict):
    region: str = Field(..., min_length=1, pattern=REGION_PATTERN, description="this LB's region name")
    tau: int = Field(2, ge=0, description="a peer whose LB queue is longer than this is unavailable")
    remote: Literal["prefix", "ring", "nearest", "cost"] = Field(
        "prefix", description="how a peer is chosen (region/router.py: PEER_SELECTORS)")
    max_hops: int = Field(1, ge=0, le=1, description="0 = region-local (never forward), 1 = SkyLB")
    peer_stale_s: float = Field(REGION_LAYER.peer_stale_s, gt=0,
                                description="a peer heartbeat older than this is ignored (default: REGION_LAYER's)")
    snapshot: PrefixIndexConfig = PrefixIndexConfig(max_nodes=100_000)
    virtual_nodes: int = Field(256, ge=1)
    cost: CostSelectorConfig = Field(CostSelectorConfig(), description="the 'cost' selector's settings (remote='cost')")
    steal: StealConfig = Field(StealConfig(), description="cross-region work stealing (region/steal.py)")
    tenant_regions: Dict[str, FrozenSet[str]] = Field(default_factory=dict,
                                                      description="tenant -> regions its requests may be served in")
    ttft_slo_s: Optional[float] = Field(
        None, gt=0.0, allow_inf_nan=False,
        description="the P99 TTFT (s) this region is run to. With remote='cost' and forward_before_saturation, "
                    "a forward the cost rule chooses before saturation is not made when staying is expected to "
                    "meet it and the forward to miss it, both calibrated on this LB's stays "
                    "(region/slo_guard.py). None: off")

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
