"""Configuration of one region's ingress: :class:`IngressConfig` (JSON-able; built by
``app.build_region_apps``) and the :class:`RegistryOptions` of its registry link.

The region layer's deployment defaults -- the peer selector (by the default policy, GeoPrefix's 'cost'
selector), peer staleness, the registry's heartbeat period, the RTT probe period, the queue bound, the
wait limit and the Retry-After of a refusal -- are not set here but read from the policy core's
:data:`~ray_geolb.policy.region.config.REGION_LAYER`, the object the simulator builds its per-region
LBs from (``tests/sim/test_simulator_runs_the_serve_region_layer_config.py`` compares both sides)."""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ray_geolb.policy.region import REGION_LAYER, CostSelectorConfig, TwoLayerConfig
from ray_geolb.policy.region.config import RegionLayerSettings
from ray_geolb.serve.registry import DEFAULT_NAME, DEFAULT_NAMESPACE

__all__ = ["INGRESS_DEPLOYMENT", "IngressConfig", "RegistryOptions"]

#: the Serve deployment name of every region's ingress (peers address each other by app name + this)
INGRESS_DEPLOYMENT = "RegionIngress"


class RegistryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    #: one heartbeat + peer-table read per period (``REGION_LAYER.heartbeat_period_s``)
    period_s: float = Field(REGION_LAYER.heartbeat_period_s, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    config: Optional[dict] = None  # RegistryState kwargs if this ingress creates the actor
    #: regions that run a standby registry beside this one, each its own actor (``standby_name``): every
    #: heartbeat goes to each, every table is applied (``REGION_LAYER.registry_standbys``; registry_client.py)
    standbys: List[str] = Field(default_factory=lambda: list(REGION_LAYER.registry_standbys))
    #: create each standby pinned to its region's nodes (``build_region_apps``: as its ``pin_to_region``)
    pin_standbys: bool = True

    @field_validator("standbys")
    @classmethod
    def _check_standbys(cls, v):
        RegionLayerSettings(registry_standbys=v)  # one rule for names and duplicates (a ValueError names it)
        return v


class IngressConfig(BaseModel):
    """Configuration of one region's ingress (JSON-able; built by ``app.build_region_apps``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(..., min_length=1)
    model_name: str = "geolb-emulated"
    #: peer region -> its Serve application name (its ingress is ``INGRESS_DEPLOYMENT`` there)
    peers: Dict[str, str] = Field(default_factory=dict)
    #: TwoLayerConfig fields except ``region`` (tau, remote, max_hops, peer_stale_s, snapshot, ...); default:
    #: the default policy's region layer, ``REGION_LAYER.two_layer()`` (GeoPrefix: the 'cost' selector).
    #: A plain dict on the wire (a Serve config's YAML, the deployment's arguments), checked as a
    #: ``TwoLayerConfig`` when this config is built (:meth:`two_layer_config`): a bad field is named then,
    #: on the driver, not later in the ingress replica. ``{"steal": {"enabled": true}}`` turns on
    #: cross-region work stealing (``TwoLayerConfig.steal``; ``steal.py``); ``build_region_apps`` merges
    #: these fields into the policy's region layer, so the rest stays the default
    two_layer: dict = Field(default_factory=REGION_LAYER.two_layer)
    #: "router": read the GeoPrefixRouter's availability; "always": every request is local-available
    #: (baselines with Ray's own routers, which have no availability notion)
    local_availability: Literal["router", "always"] = "router"
    max_queue: int = Field(REGION_LAYER.max_queue, ge=0,
                           description="requests that may wait at this ingress (more -> 429)")
    max_wait_s: float = Field(REGION_LAYER.max_wait_s, gt=0, description="longest wait at this ingress (then 503)")
    retry_after_s: float = Field(REGION_LAYER.retry_after_s, ge=0)
    poll_s: float = Field(0.02, gt=0, description="re-decide period of the head of the queue")
    registry: Optional[RegistryOptions] = RegistryOptions()
    latency: Optional[dict] = None  # LatencyInjector.from_spec; None = default table, scale 1
    rtt_probe_period_s: float = Field(REGION_LAYER.rtt_probe_period_s, gt=0)
    #: EWMA weight of the RTT probes; set, it becomes ``two_layer.cost.rtt_alpha`` (the weight of
    #: RegionRouter's one RTT estimate) unless ``two_layer.cost`` sets that itself
    rtt_ewma: float = Field(CostSelectorConfig.model_fields["rtt_alpha"].default, gt=0, le=1)
    snapshot_period_s: float = Field(1.0, gt=0)
    #: with several ingress replicas in the region, each one's prefix inserts reach the others through the
    #: registry's heartbeats (one affinity view per region: ``siblings.py``); False keeps a tree per replica
    share_sibling_inserts: bool = True
    #: rows of the regional snapshot one heartbeat may carry (``policy/region/snapshot_sync.py``; ~100 bytes each)
    snapshot_max_rows: int = Field(2000, ge=1, le=100_000)
    default_max_tokens: int = Field(16, ge=1)
    max_tokens_limit: int = Field(8192, ge=1)
    #: one deadline per request, from its arrival at the origin to the start of its response (non-streamed:
    #: the whole response; streamed: the first token), carried across the hop as the time left and never
    #: restarted by a retry. A client may shorten it with the header ``x-geolb-timeout-s``. Passed while
    #: the request waits for capacity: 503 ``wait_timeout``; while a replica or peer works on it: 504
    #: ``deadline_exceeded`` (the work is cancelled, never retried elsewhere: nothing is served twice)
    request_timeout_s: float = Field(300.0, gt=0)
    #: (the ingress's own deadline is ``deadlines.DEADLINE_RESERVE_S`` earlier -- at most a quarter of it --
    #: for the time it cannot see: the proxy before the handler, and the way back; ``deadlines.py``)
    #: retries of forwards that could not reach their peer (another peer or local; retry_budget.py):
    #: each request earns this share of a retry, and this many more are earned per second
    retry_budget_ratio: float = Field(0.2, ge=0, le=10)
    retry_budget_min_per_s: float = Field(3.0, ge=0)
    #: the most one forward attempt may take (within the request's deadline)
    forward_timeout_s: float = Field(300.0, gt=0)
    #: streams: the first item (a forward's metadata, a local stream's first token) must come within
    #: this, and then each next token within ``stream_idle_timeout_s``; else the stream ends with a
    #: typed error (before the headers: 504; after: an error event and finish_reason "error")
    first_token_timeout_s: float = Field(120.0, gt=0)
    stream_idle_timeout_s: float = Field(60.0, gt=0)
    #: the request header that names the tenant (set by the operator's auth proxy, e.g. "x-tenant-id");
    #: a tenant listed in ``two_layer.tenant_regions`` is served only in its regions. None: no tenants
    tenant_header: Optional[str] = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")
    #: HTTP requests this ingress replica serves at once (queued ones included); more -> 429
    max_concurrent: int = Field(1024, ge=1)
    #: input bounds, checked before anything is routed or indexed (openai.validate_body)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="larger request bodies -> 413")
    max_json_depth: int = Field(64, ge=4, le=1000, description="deeper JSON nesting -> 400 (tool schemas nest)")
    max_model_len: Optional[int] = Field(
        None, ge=1, description="the model's context length (build_region_apps sets it from the LLMConfig or the "
                                "emulated profile): a prompt that cannot fit -> 400 context_length_exceeded")
    max_chars_per_token: float = Field(
        8.0, gt=0, description="the most characters a token holds, for the context-length check (a prompt of "
                               "N characters has at least N / this many tokens; the engine checks exactly)")
    #: Privacy. By default a response tells the client only where it was served (``x-geolb-region``,
    #: ``-route``, ``-origin``): no per-request cache figure (matched prefix, cached tokens, replica,
    #: reason, queue wait), which would let a client learn what *others* sent (guessing a prompt byte
    #: by byte from the matched length). ``debug=True`` adds them to every response and opens
    #: ``/v1/geolb/state`` and the detailed ``/healthz`` to anyone (local development only); a request
    #: carrying the admin token (header ``x-geolb-admin-token``) gets them without ``debug``.
    debug: bool = False
    #: the admin token; None: the environment variable ``admin_token_env`` of the ingress process
    #: (unset: no token, so the state endpoint needs ``debug``). Never shown by the state endpoint.
    admin_token: Optional[str] = Field(None, min_length=16)
    admin_token_env: str = "GEOLB_ADMIN_TOKEN"
    #: 'cost' region layer: the measured wait for a local engine slot in the cost of staying -- the
    #: policy core's ``CostSelectorConfig.stay_slot_wait`` / ``drain_window_s`` / ``drain_min_samples``
    #: (see ``policy/region/cost_selector.py``; the simulator runs the same term). None: ``two_layer.cost``'s value
    #: (``GEOPREFIX_COST`` turns it on, ``GORGO_COST`` leaves it off); a value here overrides it
    #: (``stay_slot_wait=False``: the stay cost without the slot wait).
    stay_slot_wait: Optional[bool] = None
    drain_window_s: Optional[float] = Field(None, gt=0, allow_inf_nan=False,
                                            description="window of the local drain-rate estimate")
    drain_min_samples: Optional[int] = Field(None, ge=2, description="completions the drain-rate estimate needs")

    @model_validator(mode="after")
    def _check_two_layer(self):
        try:
            self.two_layer_config()
        except ValidationError as e:  # name the field inside two_layer, as two_layer.<field>
            errs = "; ".join(f"two_layer.{'.'.join(str(x) for x in er['loc'])}: {er['msg']}" for er in e.errors())
            raise ValueError(errs) from None
        return self

    def two_layer_config(self) -> TwoLayerConfig:
        tl = dict(self.two_layer)
        if "region" in tl and tl["region"] != self.region:
            raise ValueError(f"two_layer.region {tl['region']!r} differs from region {self.region!r}")
        tl["region"] = self.region
        over = {k: getattr(self, k) for k in _SLOT_WAIT_FIELDS if getattr(self, k) is not None}
        if over or "rtt_ewma" in self.model_fields_set:
            cost = tl.get("cost") or {}
            cost = cost.model_dump() if isinstance(cost, BaseModel) else dict(cost)
            if "rtt_ewma" in self.model_fields_set:  # the probes' EWMA is now RegionRouter's (observe_rtt)
                cost.setdefault("rtt_alpha", self.rtt_ewma)
            cost.update(over)
            tl["cost"] = cost
        return TwoLayerConfig.model_validate(tl)


_SLOT_WAIT_FIELDS = ("stay_slot_wait", "drain_window_s", "drain_min_samples")
