"""Deployments for the simulator: where the replicas are, where the load balancers are, which policy.

A :class:`DeploymentSpec` is plain data (JSON-able via :meth:`DeploymentSpec.to_dict`):

* ``replicas``: ``{region: count}`` (balanced ``us=4,eu=4,asia=4``, unbalanced ``us=3,eu=3,asia=2``...);
* ``lb_kind``:
    - ``"per-region"``: one load balancer per region that has replicas, each a
      :class:`~ray_geolb.policy.region.router.RegionRouter` (SkyLB's two layers, ``max_hops=1``);
    - ``"region-local"``: the same LBs with ``max_hops=0`` (never forward; SkyLB Fig. 10 baseline);
    - ``"central"``: ONE load balancer in ``central_region`` whose policy sees every replica of every
      region (SkyLB §5.1 baselines RR/LL/CH/SGL, "a single load balancer in the US").
* ``policy``: a policy name or config dict for :func:`ray_geolb.policy.build_policy`;
* ``region_layer``: overrides of :class:`~ray_geolb.policy.region.config.RegionLayerSettings` fields; the
  per-region and region-local LBs are deployed as ``REGION_LAYER`` with these changes (:attr:`settings`):
  the Serve ingress's region layer -- peer selector by local policy, peer staleness, heartbeats through
  a registry every ``heartbeat_period_s``, RTT probes, per-forward accounting, forwards past a waiting
  queue, the queue bound (429) and the wait limit (503). The central LBs are not that ingress (they
  model SkyLB's single-LB baselines and the DP front-ends): strict FCFS, unbounded, no peers;
* ``two_layer``: :class:`~ray_geolb.policy.region.config.TwoLayerConfig` fields (``tau``, ``remote``...)
  over the policy's own (``settings.two_layer(policy)``, filled in by the constructor for per-region
  and region-local LBs, so ``two_layer`` is the effective config);
* ``profile``: engine profile name (default ``llama3.1-8b-l4``, SkyLB's hardware);
* ``stats_period_s`` / ``stats_jitter`` / ``stats_lag_s``: replica reports reach their LB(s) every
  period (+-jitter) after the lag (Ray Serve: controller poll + broadcast);
* the registry LBs heartbeat through sits in ``central_region`` (the home region: Serve's
  ``deploy_region_apps`` creates it from the driver, on the head node) if that region is in the
  network, else in the first LB region (:meth:`DeploymentSpec.registry_region`); standby registries sit
  in ``region_layer``'s ``registry_standbys`` (none by default; :meth:`DeploymentSpec.registry_regions`).
* ``network``: a :class:`~ray_geolb.engine.network.RegionNetwork` (default ``RegionNetwork.default()``),
  or (through :func:`deployment_for` / :func:`resolve_network`) a name in ``NETWORKS`` or a plain dict
  ``{"regions": [...], "rtt_ms": [[a, b, ms], ...], "intra_ms": 0}`` so a run dict stays JSON-able;
* ``rtt_aware``: the central LB's cost policy gets ``rtt_of_target`` = the RTT client -> LB -> replica
  (GORGO-proxy; see the simulator).
* ``standby_region``: where a central system's standby LB sits, the one that takes over when clients
  cannot reach the central LB (a run with faults only: ``sim/faults.py``); None: :meth:`DeploymentSpec.standby`
  picks the region nearest ``central_region`` (one with replicas if there is one).

Clients are sent to the LB of their own region; a region without an LB sends its clients to the
LB with the smallest RTT.

A *system* name maps to a deployment recipe (``SYSTEMS``): ``skylb``, ``skylb-ch``, ``rr``, ``ll``,
``ch``, ``sgl``, ``p2c``, ``ray-prefix``, ``region-local``, ``oracle``, ``bp``, ``sp-o`` (cap 8;
``sp-o-16`` / ``sp-o-32`` / ``sp-o-50``: other caps), ``sp-p``, and
the issue-5 systems, each with its paper's intended deployment:

* ``gorgo`` — GORGO (§3.3): one LB per region, local GORGO cost policy (SP-P admission), layer 1 =
  the ``cost`` selector with ``GORGO_COST`` (``REGION_LAYER.peer_selectors["gorgo"]``: RTT + residual
  prefill; the peer's queue left out, as in GORGO's code; staying is an option when the local queue
  estimate is cheaper). ``t_p`` is GORGO's measured constant (§4.2, Table 1: the TTFT-vs-input-tokens
  slope of the serving engine), here the deployment's engine profile's batch-1 TTFT line: the
  least-squares line through its batch-1 TTFTs of 16..2,048-token prompts (``EngineProfile.ttft_line``,
  :func:`gorgo_ttft_line`; on ``mistral-7b-a100`` 148.97 ms + 0.0988 ms/token, within 5 % of GORGO's
  150.72 ms + 0.0938 ms/token: the engine's prefill attention bends the line up a little);
* ``gorgo-online`` — the same with ``t_p`` learned online from observed TTFTs (no floor), the
  variant this project ran as ``gorgo`` before;
* ``gorgo-proxy`` — GORGO-proxy (§4.4): ONE central HTTP proxy running the GORGO cost over every
  replica of every region, network term = RTT client -> proxy -> replica, constant ``t_p`` as ``gorgo``;
* ``gorgo2`` — GORGO v2 (the rewritten 2026 paper, :mod:`~ray_geolb.policy.algorithms.gorgo_v2`): ONE
  central proxy (the paper's only deployment) scoring ``w_rtt·RTT_ms + w_prefill·uncached + w_load·queued``
  tokens over every replica, ``(w_rtt, w_load)`` tuned online by a (1+1)-ES on p95 TTFT;
  ``gorgo2-static``: the same with the paper's learned weights frozen (w_rtt 0.276, w_queue 0.5);
* ``geoprefix`` — ours: per-region LBs, ``geoprefix`` local policy, ``cost`` selector with
  ``GEOPREFIX_COST`` (remote queue included; ``REGION_LAYER.peer_selectors["geoprefix"]``, as the
  Serve app's default); ``geoprefix-steal`` the same with cross-region work stealing on,
  ``geoprefix-strict`` with SkyLB's strict SP-P (GeoPrefix before its pending allowance), ``geoprefix-cap`` with
  SP-P's unreported-work cap (``AvailabilityConfig.prefill_budget_reports``), ``geoprefix-burst`` with SP-P
  granting up to 128 requests per replica report instead of 32 (``AvailabilityConfig.max_burst``) and
  ``geoprefix-bp`` with blind pushing in place of SP-P (ablations: ``benchmarks/RESULTS.md`` section 40),
  ``geoprefix-gate`` with SP-P's region gate (``AvailabilityConfig.gate="region"``: the slots decide whether to
  send, the cost decides where among the replicas with KV room; section 41), ``geoprefix-uncapped`` with the
  shared-prefill term counting every request in flight (GeoPrefix's default before ``w_shared_max_inflight=32``;
  section 42), ``geoprefix-ln`` / ``geoprefix-gate-ln`` with the region layer's length-neutral in-flight term
  (``CostSelectorConfig.shared_size="at_most_mean"``; section 43b) and ``geoprefix-home-local`` with the home rule's
  check of this region's knowledge only (``home_needs_common_preamble=False``, the default before section 43a);
  ``geoprefix-one-slot`` with one SP-P slot per request and no holder pass (the default before section 45),
  ``geoprefix-hit-slots`` without the holder pass only, and ``geoprefix-hit-pass`` with GeoPrefix's defaults
  spelt out (sections 44-45); ``geoprefix-mean`` / ``geoprefix-mean-w2`` with the region layer's in-flight term
  priced per mean-sized request (``CostSelectorConfig.shared_size="mean"``; ``w_shared`` 1 and 2; section 46),
  ``geoprefix-floor`` with a prompt under the mean priced as a mean-sized one (``shared_size="at_least_mean"``,
  GeoPrefix's default since section 46, spelt out) and ``geoprefix-prompt-sized`` with every prompt at its own
  size (``shared_size="prompt"``, the default before);
* ``vllm-default`` / ``jsq-load`` / ``br0`` — BalanceRoute's DP routers. A DP router is one
  front-end process in front of all data-parallel ranks (vLLM's DP coordinator / BalanceRoute's
  proxy), so they run as ONE central LB over every replica, like SkyLB's single-LB baselines (a
  per-region deployment of a blind-pushing router would never forward, i.e. be region-local);
* ``flowkv`` — FlowKV's global controller (Alg. 1): one central scheduler over all nodes.

A recipe's ``policy`` may be a function of the deployment's :class:`EngineProfile` (GORGO's constant
``t_p`` is the engine's); :func:`deployment_for` resolves it, so ``DeploymentSpec.policy`` is plain data.

New systems are one :func:`register_system` call each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ray_geolb.engine.network import RegionNetwork
from ray_geolb.engine.profiles import PROFILES, EngineProfile, get_profile
from ray_geolb.policy.region.config import GEOPREFIX_COST, REGION_LAYER, RegionLayerSettings

__all__ = [
    "DeploymentSpec", "SystemRecipe", "SYSTEMS", "register_system", "system_names", "deployment_for",
    "parse_regions", "LB_KINDS", "DEFAULT_PROFILE", "NETWORKS", "resolve_network", "gorgo_ttft_line",
]

LB_KINDS = ("per-region", "region-local", "central")
#: the LB kinds deployed as the Serve ingress (``DeploymentSpec.settings`` applies)
INGRESS_LB_KINDS = ("per-region", "region-local")
DEFAULT_PROFILE = "llama3.1-8b-l4"


@dataclass
class DeploymentSpec:
    replicas: Dict[str, int]
    lb_kind: str = "per-region"
    policy: Any = "skylb"
    central_region: str = "us"
    two_layer: Dict[str, Any] = field(default_factory=dict)
    profile: str = DEFAULT_PROFILE
    stats_period_s: float = 0.5
    stats_jitter: float = 0.1
    stats_lag_s: float = 0.3
    region_layer: Dict[str, Any] = field(default_factory=dict)
    network: Optional[RegionNetwork] = None
    system: str = ""
    rtt_aware: bool = False
    standby_region: Optional[str] = None
    #: routers per region (Serve: the region app's ``ingress_replicas``): each a separate policy over the
    #: region's replicas with a 1/N headroom share, its own hold queue, heartbeat source and RTT probes; a
    #: request reaches one of them at random (sim/region_lb.py's module docstring). Per-region LBs only.
    ingress_replicas: int = 1
    #: with several routers per region: each router's prefix-index inserts reach its sibling routers this many
    #: seconds later (a per-region channel), so they share one affinity view; None: each keeps its own tree.
    #: A design candidate measured in the simulator (benchmarks/bench_ingress_replicas.py), not run in Serve.
    sibling_inserts_s: Optional[float] = None
    #: with several routers per region: share their inserts as Serve does (``IngressConfig.share_sibling_inserts``,
    #: on there by default): hash-only rows with each heartbeat to the primary registry, the siblings' back
    #: with its table (``policy/region/sibling_inserts.py``), so at the heartbeat's period and delays. Off
    #: here by default, so that the runs with several routers recorded before it stay as they were.
    share_sibling_inserts: bool = False
    #: with several routers per region: a steal hand-over that reaches a sibling of the router that made the
    #: offer is taken there while it has a free slot and nothing waiting (``Thief.take``'s ``sibling_room``),
    #: as Serve does; False: refused there, as before (the "before" of RESULTS section 31)
    region_wide_offers: bool = True
    #: with several routers per region: a router with no free local slot borrows the unused slots its siblings
    #: hold (``LoadTracker.lend_slot``) at once -- the upper bound of one load view per region, measured in the
    #: simulator, not run in Serve. False: each keeps its share of each report.
    sibling_headroom: bool = False
    #: the region layer's settings: ``REGION_LAYER`` with ``region_layer``'s changes (set by the constructor)
    settings: RegionLayerSettings = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.lb_kind not in LB_KINDS:
            raise ValueError(f"lb_kind must be one of {LB_KINDS}, got {self.lb_kind!r}")
        if not isinstance(self.replicas, dict) or not self.replicas:
            raise ValueError("replicas must be a non-empty {region: count} dict")
        for r, n in self.replicas.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"replicas[{r!r}] must be an int >= 0, got {n!r}")
        if sum(self.replicas.values()) < 1:
            raise ValueError("a deployment needs at least one replica")
        if self.profile not in PROFILES:
            raise ValueError(f"unknown engine profile {self.profile!r}; known: {', '.join(sorted(PROFILES))}")
        if not self.stats_period_s > 0:
            raise ValueError(f"stats_period_s must be > 0, got {self.stats_period_s!r}")
        try:
            self.settings = RegionLayerSettings.model_validate({**REGION_LAYER.model_dump(), **self.region_layer})
        except Exception as e:
            raise ValueError(f"region_layer: {e}") from None
        if self.ingress_lbs:  # the policy's own region layer, then the deployment's changes
            self.two_layer = {**self.settings.two_layer(_policy_name(self.policy)), **self.two_layer}
        if self.stats_lag_s < 0:
            raise ValueError(f"stats_lag_s must be >= 0, got {self.stats_lag_s!r}")
        if not 0 <= self.stats_jitter < 1:
            raise ValueError(f"stats_jitter must be in [0, 1), got {self.stats_jitter!r}")
        if self.network is None:
            self.network = RegionNetwork.default()
        elif not isinstance(self.network, RegionNetwork):
            self.network = resolve_network(self.network)
        if self.rtt_aware and self.lb_kind != "central":
            raise ValueError("rtt_aware applies to a central LB only (per-region LBs see only local replicas)")
        for r in self.replicas:
            if r not in self.network:
                raise ValueError(f"replica region {r!r} is not in the network {self.network.regions}")
        if self.lb_kind == "central" and self.central_region not in self.network:
            raise ValueError(f"central_region {self.central_region!r} is not in the network {self.network.regions}")
        primary = self.registry_region()
        for r in self.settings.registry_standbys:
            if r not in self.network or r == primary:
                raise ValueError(f"region_layer.registry_standbys: {r!r} must be a region of the network "
                                 f"{self.network.regions} other than the primary registry's, {primary!r}")
        n = self.ingress_replicas
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"ingress_replicas must be a positive integer, got {n!r}")
        s = self.sibling_inserts_s
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < float("inf")):
            raise ValueError(f"sibling_inserts_s must be None or a finite number of seconds >= 0, got {s!r}")
        for name in ("sibling_headroom", "share_sibling_inserts", "region_wide_offers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.share_sibling_inserts and self.sibling_inserts_s is not None:
            raise ValueError("share_sibling_inserts (through the registry) and sibling_inserts_s (a fixed delay) "
                             "are two models of one channel: set one")
        if n > 1 and not self.ingress_lbs:
            raise ValueError(f"ingress_replicas={n}: several routers per region need per-region LBs "
                             f"(lb_kind 'per-region' or 'region-local'), not {self.lb_kind!r}")
        if self.standby_region is not None:
            if self.lb_kind != "central":
                raise ValueError("standby_region applies to a central LB only (per-region systems fail over to "
                                 "another region's LB)")
            if self.standby_region not in self.network or self.standby_region == self.central_region:
                raise ValueError(f"standby_region {self.standby_region!r} must be a region of the network "
                                 f"{self.network.regions} other than central_region {self.central_region!r}")

    @property
    def ingress_lbs(self) -> bool:
        """Whether the LBs are deployed as the Serve ingress (per-region / region-local; not central)."""
        return self.lb_kind in INGRESS_LB_KINDS

    def registry_region(self) -> str:
        """Where the registry the LBs heartbeat through sits (see the module docstring)."""
        return self.central_region if self.central_region in self.network else self.lb_regions()[0]

    def registry_regions(self) -> List[str]:
        """Every registry's region: the primary (:meth:`registry_region`), then the standbys
        (``settings.registry_standbys``, ``RegionLayerSettings``)."""
        return [self.registry_region()] + list(self.settings.registry_standbys)

    @property
    def replica_regions(self) -> List[str]:
        return [r for r, n in self.replicas.items() if n > 0]

    def lb_regions(self) -> List[str]:
        if self.lb_kind == "central":
            return [self.central_region]
        return self.replica_regions

    def standby(self) -> Optional[str]:
        """A central system's standby LB region: ``standby_region``, else the region nearest
        ``central_region`` among those with replicas (else among all); None if not central or no other region."""
        if self.lb_kind != "central":
            return None
        if self.standby_region is not None:
            return self.standby_region
        others = [r for r in self.replica_regions if r != self.central_region] or \
            [r for r in self.network.regions if r != self.central_region]
        return self.network.nearest(self.central_region, others) if others else None

    def lb_for_client(self, region: str) -> str:
        """The LB a client of ``region`` is sent to (its own region's, else the nearest by RTT)."""
        lbs = self.lb_regions()
        if region in lbs:
            return region
        if region not in self.network:
            raise ValueError(f"client region {region!r} is not in the network {self.network.regions}")
        return self.network.nearest(region, lbs)

    def to_dict(self) -> dict:
        return {
            "system": self.system,
            "replicas": dict(self.replicas),
            "lb_kind": self.lb_kind,
            "policy": self.policy,
            "central_region": self.central_region if self.lb_kind == "central" else None,
            "two_layer": dict(self.two_layer),
            "profile": self.profile,
            "stats_period_s": self.stats_period_s,
            "stats_jitter": self.stats_jitter,
            "stats_lag_s": self.stats_lag_s,
            "region_layer": self.settings.model_dump() if self.ingress_lbs else None,
            "rtt_aware": self.rtt_aware,
            **({"standby_region": self.standby_region} if self.standby_region is not None else {}),
            **({"ingress_replicas": self.ingress_replicas} if self.ingress_replicas > 1 else {}),
            **({"sibling_inserts_s": self.sibling_inserts_s} if self.sibling_inserts_s is not None else {}),
            **({"sibling_headroom": True} if self.sibling_headroom else {}),
            **({"share_sibling_inserts": True} if self.share_sibling_inserts else {}),
            **({"region_wide_offers": False} if not self.region_wide_offers else {}),
            "network_rtt_ms": {f"{a}-{b}": self.network.rtt_ms(a, b)
                               for i, a in enumerate(self.network.regions)
                               for b in self.network.regions[i + 1:]},
        }


@dataclass(frozen=True)
class SystemRecipe:
    """How a system name becomes a deployment: LB kind, policy, two-layer overrides."""

    name: str
    lb_kind: str
    policy: Any
    two_layer: Dict[str, Any] = field(default_factory=dict)
    single_region: bool = False  # Fig. 9 variants: all replicas in one region
    description: str = ""
    rtt_aware: bool = False


SYSTEMS: Dict[str, SystemRecipe] = {}


def register_system(name: str, lb_kind: str, policy: Any, description: str = "", *,
                    two_layer: Optional[Dict[str, Any]] = None, single_region: bool = False,
                    rtt_aware: bool = False) -> SystemRecipe:
    """Add a system: ``register_system("gorgo", "per-region", "gorgo", "GORGO cost routing")``."""
    if lb_kind not in LB_KINDS:
        raise ValueError(f"lb_kind must be one of {LB_KINDS}, got {lb_kind!r}")
    if rtt_aware and lb_kind != "central":
        raise ValueError("rtt_aware applies to a central LB only")
    rec = SystemRecipe(name, lb_kind, policy, dict(two_layer or {}), single_region, description, rtt_aware)
    SYSTEMS[name] = rec
    return rec


register_system("skylb", "per-region", "skylb", "SkyLB: per-region LBs, prefix tree + SP-P, snapshot forwarding")
register_system("skylb-ch", "per-region", "skylb_ch", "SkyLB-CH: per-region LBs, ring + SP-P, ring over regions")
register_system("region-local", "region-local", "skylb", "per-region SkyLB LBs that never forward (Fig. 10 baseline)",
                two_layer={"max_hops": 0})
register_system("rr", "central", "round_robin", "one LB in the US, round robin, blind pushing")
register_system("ll", "central", "least_load", "one LB in the US, least outstanding, blind pushing")
register_system("ch", "central", "consistent_hash", "one LB in the US, consistent hashing on the session key")
register_system("sgl", "central", "sglang", "one LB in the US, SGLang cache-aware router")
register_system("p2c", "central", "power_of_two", "one LB in the US, power of two choices (Ray Serve default)")
register_system("ray-prefix", "central", "ray_prefix", "one LB in the US, Ray PrefixCacheAffinityRouter-like")
register_system("oracle", "central", "oracle",
                "central cache-aware LB with perfect knowledge: one LB in the US that sees every replica's real "
                "prefix cache (not an upper bound: the ideal bound is sim/observe.py)")
register_system("bp", "central", {"name": "sglang", "availability": {"mode": "bp"}},
                "one region, SGLang router, blind pushing (Fig. 9)", single_region=True)
register_system("sp-o", "central", {"name": "sglang", "availability": {"mode": "sp-o"}},
                "one region, SGLang router, selective pushing by outstanding requests, cap 8 (Fig. 9)",
                single_region=True)
for _cap in (16, 32, 50):  # SkyLB §3.3: 20-50 outstanding per L4; Fig. 9's SP-O cap is not given
    register_system(f"sp-o-{_cap}", "central",
                    {"name": "sglang", "availability": {"mode": "sp-o", "max_outstanding": _cap}},
                    f"one region, SGLang router, SP-O with at most {_cap} outstanding per replica", single_region=True)
register_system("sp-p", "central", {"name": "sglang", "availability": {"mode": "sp-p"}},
                "one region, SGLang router, selective pushing by pending requests (Fig. 9)", single_region=True)
def gorgo_ttft_line(profile: EngineProfile) -> Dict[str, Any]:
    """GORGO's constant TTFT line on ``profile`` (§4.2: measured offline, TTFT vs input tokens at batch 1):
    the ``ttft`` config of a cost policy that does not learn online."""
    base, slope = profile.ttft_line()
    return {"online": False, "prior_tp_s": slope, "prior_base_s": base}


def _gorgo_fixed(name: str) -> Callable[[EngineProfile], Dict[str, Any]]:
    def policy(profile: EngineProfile) -> Dict[str, Any]:
        return {"name": name, "ttft": gorgo_ttft_line(profile)}

    return policy


register_system("gorgo", "per-region", _gorgo_fixed("gorgo"),
                "GORGO: per-region LBs, GORGO cost locally with the engine's constant t_p, cost selector without "
                "the peer's queue")
register_system("gorgo-online", "per-region", "gorgo",
                "GORGO with t_p learned online from observed TTFTs (no floor)")
register_system("gorgo-proxy", "central", _gorgo_fixed("gorgo_proxy"),
                "GORGO-proxy: one central proxy, GORGO cost (constant t_p) over every replica, "
                "RTT client->proxy->replica", rtt_aware=True)
register_system("gorgo2", "central", "gorgo2",
                "GORGO v2 (2026 paper): one central proxy, w_rtt*RTT_ms + w_prefill*uncached + w_load*queued tokens "
                "over every replica, (w_rtt, w_load) tuned online by a (1+1)-ES on p95 TTFT", rtt_aware=True)
register_system("gorgo2-static", "central",
                {"name": "gorgo2", "w_rtt": 0.276, "w_load": 0.5, "tune": {"enabled": False}},
                "GORGO v2 with the weights its paper learned and froze (w_rtt 0.276, w_queue 0.5), no tuning",
                rtt_aware=True)
register_system("geoprefix", "per-region", "geoprefix",
                "GeoPrefix (ours): per-region LBs, per-request TTFT cost, cost selector with the peer's queue")
register_system("geoprefix-steal", "per-region", "geoprefix",
                "GeoPrefix with cross-region work stealing (policy/region/steal.py): idle regions pull held requests",
                two_layer={"steal": {"enabled": True}})
register_system("geoprefix-strict", "per-region",
                {"name": "geoprefix", "availability": {"pending_allowance": 0}},
                "GeoPrefix with SkyLB's strict SP-P (nothing waiting): GeoPrefix before its pending allowance")
register_system("geoprefix-cap", "per-region", {"name": "geoprefix", "availability": {"prefill_budget_reports": 2}},
                "GeoPrefix with SP-P's unreported-work cap: 2 report intervals of prefill per replica")
register_system("geoprefix-burst", "per-region", {"name": "geoprefix", "availability": {"max_burst": 128}},
                "GeoPrefix with SP-P granting up to 128 requests per replica report (32 by default)")
register_system("geoprefix-bp", "per-region", {"name": "geoprefix", "availability": {"mode": "bp"}},
                "GeoPrefix with blind pushing in place of SP-P (the cost selector still forwards before saturation)")
register_system("geoprefix-gate", "per-region", {"name": "geoprefix", "availability": {"gate": "region"}},
                "GeoPrefix with SP-P's region gate: held while no replica has a slot left, else the cost picks "
                "among the replicas with KV room")
register_system("geoprefix-one-slot", "per-region",
                {"name": "geoprefix", "holder_pass_share": None, "availability": {"slots_by_uncached_share": False}},
                "GeoPrefix before section 45: one SP-P slot per request, and only a replica with a slot left competes")
register_system("geoprefix-hit-slots", "per-region",
                {"name": "geoprefix", "holder_pass_share": None, "availability": {"slots_by_uncached_share": True}},
                "GeoPrefix without the holder pass: SP-P's slots spent by the uncached share of each prompt (at least "
                "1/4 of a slot), and only a replica with a slot left competes")
register_system("geoprefix-hit-pass", "per-region",
                {"name": "geoprefix", "holder_pass_share": 0.5, "availability": {"slots_by_uncached_share": True}},
                "GeoPrefix's defaults spelt out: slots by uncached share, and a replica with no slot left still "
                "competes (priced by its queue) for a request it holds at least half of, while it has KV room and a "
                "free sequence slot")
register_system("geoprefix-uncapped", "per-region", {"name": "geoprefix", "w_shared_max_inflight": None},
                "GeoPrefix whose shared-prefill term counts every request in flight (its default before the cap)")


def _geoprefix_cost(**over) -> Dict[str, Any]:
    """GeoPrefix's cost selector settings (``GEOPREFIX_COST``) with ``over`` changed: a variant's
    ``two_layer["cost"]``."""
    return {**GEOPREFIX_COST.model_dump(exclude_unset=True), **over}


register_system("geoprefix-gate-ln", "per-region", {"name": "geoprefix", "availability": {"gate": "region"}},
                "GeoPrefix with the region gate and a length-neutral region layer (in-flight term scaled by "
                "min(1, mean prompt / prompt))",
                two_layer={"cost": _geoprefix_cost(shared_size="at_most_mean")})
#: GeoPrefix with its region layer's cost selector changed: name -> (GEOPREFIX_COST fields changed, description)
_REGION_COST_VARIANTS = {
    "geoprefix-ln": ({"shared_size": "at_most_mean"},
                     "GeoPrefix with a length-neutral region layer (in-flight term scaled by min(1, mean prompt / "
                     "prompt))"),
    "geoprefix-mean": ({"shared_size": "mean"},
                       "GeoPrefix whose region layer prices every request's in-flight term as a mean-sized prompt's "
                       "times its uncached share (shared_size='mean')"),
    "geoprefix-mean-w2": ({"shared_size": "mean", "w_shared": 2.0},
                          "geoprefix-mean with the in-flight term's weight doubled (w_shared 2)"),
    "geoprefix-floor": ({"shared_size": "at_least_mean"},
                        "GeoPrefix's default spelt out: its region layer prices a prompt under the mean as a "
                        "mean-sized one in its in-flight term (shared_size='at_least_mean'; a longer one as itself)"),
    "geoprefix-prompt-sized": ({"shared_size": "prompt"},
                               "GeoPrefix before section 46: its region layer prices every prompt's in-flight term at "
                               "the prompt's own size (shared_size='prompt')"),
    "geoprefix-home-local": ({"home_needs_common_preamble": False},
                             "GeoPrefix whose home rule checks only its own region's knowledge of a prompt (before "
                             "section 43)"),
}
for _name, (_over, _what) in _REGION_COST_VARIANTS.items():
    register_system(_name, "per-region", "geoprefix", _what, two_layer={"cost": _geoprefix_cost(**_over)})
register_system("vllm-default", "central", "vllm_default", "one LB (DP front-end), vLLM's DP load balancer score")
register_system("jsq-load", "central", "jsq_load", "one LB (DP front-end), BalanceRoute JSQ by KV load")
register_system("br0", "central", "br0", "one LB (DP front-end), BalanceRoute BR-0 marginal KV overflow")
register_system("flowkv", "central", "flowkv", "one central scheduler, FlowKV load-aware scenarios")

def _network_hard() -> RegionNetwork:
    from ray_geolb.engine.network import IBM_RTT_CSV

    # home / a near region / a far region, from the shipped IBM Cloud RTT table
    return RegionNetwork.from_csv(IBM_RTT_CSV, {"us-east": "Washington DC", "ca": "Toronto", "au": "Sydney"})


NETWORKS: Dict[str, Callable[[], RegionNetwork]] = {
    "default": RegionNetwork.default,
    "gorgo": RegionNetwork.gorgo,
    "network-hard": _network_hard,
}


def resolve_network(spec: Any) -> RegionNetwork:
    """A :class:`RegionNetwork` from itself, a name in ``NETWORKS`` or
    ``{"regions": [...], "rtt_ms": [[a, b, ms], ...], "intra_ms": 0.0}`` (ValueError naming the problem)."""
    if spec is None:
        return RegionNetwork.default()
    if isinstance(spec, RegionNetwork):
        return spec
    if isinstance(spec, str):
        if spec not in NETWORKS:
            raise ValueError(f"unknown network {spec!r}; known: {', '.join(sorted(NETWORKS))}")
        return NETWORKS[spec]()
    if isinstance(spec, dict):
        extra = set(spec) - {"regions", "rtt_ms", "intra_ms"}
        if extra or "regions" not in spec or "rtt_ms" not in spec:
            raise ValueError(f"network dict needs 'regions' and 'rtt_ms' (and optional 'intra_ms'), "
                             f"got keys {sorted(spec)}")
        pairs = {}
        for item in spec["rtt_ms"]:
            if not isinstance(item, (list, tuple)) or len(item) != 3:
                raise ValueError(f"network rtt_ms entries must be [region_a, region_b, ms], got {item!r}")
            pairs[(item[0], item[1])] = item[2]
        return RegionNetwork.from_pairs(spec["regions"], pairs, intra_ms=float(spec.get("intra_ms", 0.0)))
    raise ValueError(f"network must be a RegionNetwork, a name or a dict, got {type(spec).__name__}")


def _policy_name(policy: Any) -> Optional[str]:
    """The name of a policy spec: a name, a config dict's ``name``, a config object's ``name``."""
    if isinstance(policy, str):
        return policy
    if isinstance(policy, dict):
        return policy.get("name")
    return getattr(policy, "name", None)


def system_names() -> List[str]:
    return sorted(SYSTEMS)


def parse_regions(spec: str) -> Dict[str, int]:
    """``"us=4,eu=4,asia=4"`` -> ``{"us": 4, "eu": 4, "asia": 4}`` (ValueError naming the bad part)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("regions: expected REGION=COUNT[,REGION=COUNT...], e.g. us=4,eu=4,asia=4")
    out: Dict[str, int] = {}
    for part in spec.split(","):
        part = part.strip()
        name, eq, n = part.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ValueError(f"regions: {part!r} is not REGION=COUNT")
        try:
            k = int(n)
        except ValueError:
            raise ValueError(f"regions: count {n!r} of {name!r} is not an integer") from None
        if k < 0:
            raise ValueError(f"regions: count of {name!r} must be >= 0, got {k}")
        if name in out:
            raise ValueError(f"regions: {name!r} given twice")
        out[name] = k
    if sum(out.values()) < 1:
        raise ValueError("regions: at least one replica is needed")
    return out


def deployment_for(system: Any, replicas: Dict[str, int], *, network: Optional[RegionNetwork] = None,
                   central_region: str = "us", **overrides) -> DeploymentSpec:
    """The deployment of a system name (see ``SYSTEMS``) over ``replicas``.

    ``system`` may also be a policy name/dict not registered as a system: it then runs on per-region
    two-layer LBs. ``overrides`` are DeploymentSpec fields (profile, stats_lag_s, two_layer...).
    Single-region systems (bp / sp-o / sp-p) put every replica in the LB's region.
    """
    if isinstance(system, str) and system in SYSTEMS:
        rec = SYSTEMS[system]
    else:
        from ray_geolb.policy.factory import parse_policy_config

        try:
            parse_policy_config(system)
        except Exception as e:
            raise ValueError(f"unknown system {system!r}; known systems: {', '.join(system_names())} "
                             f"(or a policy: {e})") from None
        name = system if isinstance(system, str) else (system.get("name") if isinstance(system, dict) else str(system))
        rec = SystemRecipe(str(name), "per-region", system)
    reps = dict(replicas)
    creg = central_region
    if rec.single_region:
        regions = [r for r, n in reps.items() if n > 0]
        if len(regions) != 1:
            creg = regions[0] if central_region not in regions else central_region
            reps = {creg: sum(reps.values())}
        else:
            creg = regions[0]
    tl = dict(rec.two_layer)
    tl.update(overrides.pop("two_layer", {}) or {})
    network = resolve_network(overrides.pop("network", network))
    overrides.setdefault("rtt_aware", rec.rtt_aware)
    policy = overrides.pop("policy", rec.policy)
    if callable(policy):
        policy = policy(get_profile(overrides.get("profile", DEFAULT_PROFILE)))
    spec = DeploymentSpec(replicas=reps, lb_kind=rec.lb_kind, policy=policy,
                          central_region=creg, two_layer=tl, network=network, system=rec.name, **overrides)
    return spec

