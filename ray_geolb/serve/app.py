"""Build one Ray Serve application per region: ``geolb-<region>`` at route prefix ``/<region>``.

Each application = a :class:`~ray_geolb.serve.ingress.RegionIngress` (OpenAI HTTP, layer 1) bound to
an :class:`~ray_geolb.serve.llm_server.EmulatedEngineServer` deployment (the emulated GPU engine) whose
request router is chosen by ``router``:

* ``"geo"``        -- :class:`ray_geolb.serve.router.GeoPrefixRouter` with ``policy`` (default
  GeoPrefix: SP-P + prefix tree + per-request TTFT cost with t_p learned from the replicas' TTFT
  reports); the ingress forwards to peer regions when its region is saturated, choosing the peer
  (or to keep waiting) by the ``cost`` selector fed by the peers' heartbeat extras relayed through
  the registry (for ``skylb``: SkyLB's regional prefix snapshot).
* ``"pow2"``       -- Ray Serve's default PowerOfTwoChoicesRequestRouter, region-local (no forwarding:
  what one gets by deploying stock Ray Serve per region).
* ``"ray_prefix"`` -- Ray's PrefixCacheAffinityRouter, region-local; if it cannot be imported, our
  re-implementation (policy ``ray_prefix``) inside GeoPrefixRouter, still region-local.

Both deployments are pinned to the region's nodes with ``label_selector`` on
``ray.io/availability-region`` (``pin_to_region=True``) and use ``num_cpus=0``.

Usage::

    apps = build_region_apps({"us": 2, "eu": 1, "asia": 1}, router="geo", time_scale=0.01)
    deploy_region_apps(apps)            # serve.run for each; POST /us/v1/chat/completions ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ray_geolb.serve.ingress import INGRESS_DEPLOYMENT, IngressConfig, RegionIngress
from ray_geolb.serve.latency import LatencyInjector

__all__ = [
    "APP_PREFIX", "MODEL_DEPLOYMENT", "REGION_LABEL", "ROUTERS", "RegionApp", "build_region_apps",
    "deploy_region_apps", "delete_region_apps", "ray_prefix_router_class",
]

APP_PREFIX = "geolb-"
MODEL_DEPLOYMENT = "Model"
REGION_LABEL = "ray.io/availability-region"
GEO_ROUTER = "ray_geolb.serve.router.GeoPrefixRouter"
RAY_PREFIX_ROUTER = ("ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router."
                     "PrefixCacheAffinityRouter")
ROUTERS = ("geo", "pow2", "ray_prefix")


def policy_name(policy: Any) -> Optional[str]:
    """The name of a policy spec (a name, or a config dict / pydantic config with ``name``)."""
    if isinstance(policy, str):
        return policy
    if isinstance(policy, dict):
        return policy.get("name")
    return getattr(policy, "name", None)


def ray_prefix_router_class() -> Optional[str]:
    """Dotted path of Ray's PrefixCacheAffinityRouter if importable here, else None."""
    try:
        import importlib

        mod, _, cls = RAY_PREFIX_ROUTER.rpartition(".")
        getattr(importlib.import_module(mod), cls)
        return RAY_PREFIX_ROUTER
    except Exception:  # noqa: BLE001 - ray[llm] missing or broken
        return None


@dataclass
class RegionApp:
    region: str
    name: str
    route_prefix: str
    app: Any  # a bound Serve Application
    router: str
    config: Dict[str, Any] = field(default_factory=dict)  # the ingress config (JSON-able)


def _check_regions(regions: Dict[str, int]) -> Dict[str, int]:
    import re

    from ray_geolb.policy.region.config import REGION_PATTERN

    if not isinstance(regions, dict) or not regions:
        raise ValueError("regions must be a non-empty dict {region: num_replicas}")
    for r, n in regions.items():
        if not isinstance(r, str) or not re.match(REGION_PATTERN, r) or "/" in r:
            raise ValueError(f"regions: invalid region name {r!r} (letters, digits, _ . : -)")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"regions[{r!r}]: num_replicas must be a positive integer, got {n!r}")
    return dict(regions)


def build_region_apps(
    regions: Optional[Dict[str, int]] = None,
    model: str = "geolb-emulated",
    policy: Any = None,
    engine_profile: str = "llama3.1-8b-h100",
    time_scale: float = 0.01,
    *,
    router: str = "geo",
    output_tokens: int = 16,
    engine_overrides: Optional[dict] = None,
    latency: Any = None,
    ingress: Optional[dict] = None,
    registry: Any = None,
    router_kwargs: Optional[dict] = None,
    pin_to_region: bool = True,
    stats_period_s: float = 0.5,
    max_ongoing_requests: int = 1000,
    app_prefix: str = APP_PREFIX,
) -> List[RegionApp]:
    """One :class:`RegionApp` per region (see the module docstring).

    ``latency``: :meth:`LatencyInjector.from_spec` spec (``{"scale": 0.1}``; ``{"scale": 0}`` = off).
    ``ingress``: extra :class:`IngressConfig` fields (``max_queue``, ``max_wait_s``, ``two_layer``...).
    ``registry``: ``RegistryOptions`` fields as a dict, or ``False`` for no registry (no forwarding).
    ``router_kwargs``: extra GeoPrefixRouter kwargs (``queue_bound``, ``wait_limit_s``...).
    ``policy``: the GeoPrefixRouter policy (name or config dict; None = the router's
    ``DEFAULT_POLICY``, GeoPrefix). With ``geoprefix`` the ingress's region layer defaults to
    GeoPrefix's own (``geoprefix_two_layer``: ``remote="cost"`` with ``GEOPREFIX_COST``), as in the
    simulator; ``ingress={"two_layer": {...}}`` overrides any of it.
    """
    regions = _check_regions({"us": 2, "eu": 1, "asia": 1} if regions is None else regions)
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    if not (isinstance(time_scale, (int, float)) and time_scale > 0):
        raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
    lat = LatencyInjector.from_spec(latency)
    lat.check_regions(list(regions))
    from ray import serve

    from ray_geolb.serve.llm_server import EmulatedEngineServer
    from ray_geolb.serve.router import DEFAULT_POLICY

    region_local = router != "geo"
    geo_policy = DEFAULT_POLICY if policy is None else policy
    router_class: Optional[str] = GEO_ROUTER
    if router == "pow2":
        router_class = None
    elif router == "ray_prefix":
        router_class = ray_prefix_router_class()
        if router_class is None:
            router_class, geo_policy = GEO_ROUTER, "ray_prefix"

    apps = []
    for region, n in regions.items():
        name = f"{app_prefix}{region}"
        icfg: Dict[str, Any] = {
            "region": region,
            "model_name": model,
            "peers": {} if region_local else {p: f"{app_prefix}{p}" for p in regions if p != region},
            "latency": lat.to_spec(),
        }
        extra = dict(ingress or {})
        two_layer = {"peer_stale_s": 2.0}
        if router_class == GEO_ROUTER and policy_name(geo_policy) == "geoprefix":
            from ray_geolb.policy.algorithms.geoprefix import geoprefix_two_layer

            two_layer.update(geoprefix_two_layer(region))
            two_layer.pop("region")
        two_layer.update(extra.pop("two_layer", {}))
        if region_local:
            two_layer["max_hops"] = 0
        icfg["two_layer"] = two_layer
        if router_class != GEO_ROUTER:
            icfg["local_availability"] = "always"
        if registry is False or region_local:
            icfg["registry"] = None
        elif registry is not None:
            icfg["registry"] = dict(registry)
        icfg.update(extra)
        icfg = IngressConfig.model_validate(icfg).model_dump()  # validate now, with field names

        actor_opts: Dict[str, Any] = {"num_cpus": 0}
        if pin_to_region:
            actor_opts["label_selector"] = {REGION_LABEL: region}
        model_opts: Dict[str, Any] = dict(
            name=MODEL_DEPLOYMENT, num_replicas=n, max_ongoing_requests=max_ongoing_requests,
            ray_actor_options=dict(actor_opts), health_check_period_s=1.0,
        )
        if router_class is not None:
            kw: Dict[str, Any] = {}
            if router_class == GEO_ROUTER:
                kw = {"policy": geo_policy, "region": region, **(router_kwargs or {})}
            model_opts["request_router_config"] = {
                "request_router_class": router_class,
                "request_router_kwargs": kw,
                "request_routing_stats_period_s": stats_period_s,
                "request_routing_stats_timeout_s": 5.0,
            }
        server = serve.deployment(EmulatedEngineServer, **model_opts).bind(
            profile=engine_profile, time_scale=time_scale, output_tokens=output_tokens,
            engine_overrides=engine_overrides, region=region)
        # One ingress replica per region: its in-process GeoPrefixRouter holds the region's SP-P credits
        # and FCFS hold queue; N replicas would be N routers each granting a replica's full headroom.
        ing = RegionIngress.options(name=INGRESS_DEPLOYMENT, num_replicas=1, ray_actor_options=dict(actor_opts))
        apps.append(RegionApp(region, name, f"/{region}", ing.bind(server, icfg), router, icfg))
    return apps


def deploy_region_apps(apps: List[RegionApp]) -> Dict[str, Any]:
    """Deploy every region app in one ``serve.run_many`` (deployed together, so peers come up together;
    peer handles are resolved lazily anyway). Returns region -> ingress handle."""
    from ray import serve
    from ray.serve.api import RunTarget

    # Create the registry actor from here first (it lands on this driver's node -- the head, i.e. the
    # home region -- unless told otherwise), so the ingresses' first heartbeats find it ready.
    from ray_geolb.serve.registry import get_or_create_registry

    seen = set()
    for a in apps:
        reg = a.config.get("registry")
        if reg and (reg["name"], reg["namespace"]) not in seen:
            seen.add((reg["name"], reg["namespace"]))
            get_or_create_registry(reg["name"], reg["namespace"], reg.get("config"))
    targets = [RunTarget(target=a.app, name=a.name, route_prefix=a.route_prefix) for a in apps]
    handles = serve.run_many(targets)
    return {a.region: h for a, h in zip(apps, handles)}


def delete_region_apps(apps: List[RegionApp]) -> None:
    from ray import serve

    for a in apps:  # ask for all deletions first, then wait for them together
        try:
            serve.delete(a.name, _blocking=False)
        except Exception:  # noqa: BLE001 - already gone
            pass
