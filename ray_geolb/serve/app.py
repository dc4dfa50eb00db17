"""Region apps from an ``LLMConfig``: one Ray Serve application per region, ``geolb-<region>`` at route
prefix ``/<region>``.

Each application is

* a :class:`~ray_geolb.serve.ingress.RegionIngress` (OpenAI HTTP; layer 1: this region or a peer),
* bound to Ray Serve LLM's ``LLMServer`` deployment built from the ``LLMConfig`` by Ray's own
  ``build_llm_deployment`` (layer 2: a replica of this region, picked by its request router).

Per region, the ``LLMConfig`` is copied and given: the region's replica count (unless it autoscales),
``ray_actor_options.label_selector`` on ``ray.io/availability-region`` (``pin_to_region``; every bundle of
each replica's placement group is pinned there too: :func:`bundles_pinned_to_region`), the
request router (``router="geo"``: :class:`~ray_geolb.serve.router.GeoPrefixRouter` with ``policy`` and
the region; ``"pow2"``: Ray's default power-of-two, region-local; ``"ray_prefix"``: Ray's
PrefixCacheAffinityRouter, region-local), the region in ``experimental_configs["geolb"]``, and -- if
it names none -- ``server_cls = GeoVLLMServer``, the vLLM server whose reports carry the engine's load
(selective pushing needs it). Without an ``LLMConfig`` the builder uses the emulated engine's
(``llm_server.emulated_llm_config``: ``EmulatedLLMServer``, the same ``LLMServer`` code with the
engine replaced), so CI and the demo run the code path a GPU deployment runs.

Builders:

* :func:`build_region_apps` -- every region's app (Python);
* :func:`region_app` -- one region's app from JSON-able ``args``: the ``import_path`` of a
  ``serve run`` / ``serve deploy`` config (``examples/serve_three_regions.yaml``);
* :func:`deploy_region_apps` / :func:`delete_region_apps`.

The regions cooperate through the registry actor, which the first ingress creates if it does not
exist. Several ingress replicas per region (``ingress_replicas``) each run a GeoPrefixRouter over the
same replicas; each takes its share of every report's headroom (see ``router.py``), so they never
grant one engine slot twice, and they share one prefix view through the registry
(``ingress/siblings.py``). The default is 1 (the one-machine demo); a production config runs 2 for
availability (``examples/serve_three_regions.yaml``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from ray_geolb.policy.region.config import REGION_LAYER
from ray_geolb.serve.direct_streaming import refuse_direct_streaming
from ray_geolb.serve.emulated import REGION_LABEL, REGION_OPTIONS_KEY
from ray_geolb.serve.ingress import INGRESS_DEPLOYMENT, IngressConfig, RegionIngress
from ray_geolb.serve.latency import LatencyInjector

__all__ = [
    "APP_PREFIX", "GEO_ROUTER", "REGION_LABEL", "ROUTERS", "RegionApp", "build_region_apps", "deploy_region_apps",
    "delete_region_apps", "model_deployment_name", "model_replica_actors", "ray_prefix_router_class", "region_app",
    "region_llm_config",
]

APP_PREFIX = "geolb-"
GEO_ROUTER = "ray_geolb.serve.router.GeoPrefixRouter"
RAY_PREFIX_ROUTER = ("ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router."
                     "PrefixCacheAffinityRouter")
ROUTERS = ("geo", "pow2", "ray_prefix")
#: the emulated engine's options when no LLMConfig is given (``EmulatedEngine`` keyword arguments)
EMULATED_DEFAULTS = {"profile": "llama3.1-8b-h100", "time_scale": 0.01, "output_tokens": 16}


@dataclass
class RegionApp:
    region: str
    name: str
    route_prefix: str
    app: Any  # a bound Serve Application
    router: str
    config: Dict[str, Any] = field(default_factory=dict)  # the ingress config (JSON-able)


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


def model_deployment_name(llm_config: Any) -> str:
    """The name ``build_llm_deployment`` gives the model deployment of ``llm_config``."""
    cls = llm_config.server_cls
    cls_name = cls if isinstance(cls, str) else getattr(cls, "__name__", "LLMServer")
    return f"{cls_name.rpartition('.')[2] or 'LLMServer'}:{llm_config.model_id.replace('/', '--').replace('.', '_')}"


def _check_regions(regions: Dict[str, int]) -> Dict[str, int]:
    from ray_geolb.policy.region.config import REGION_PATTERN
    from ray_geolb.policy.region.registry_state import MAX_REGION_NAME

    if not isinstance(regions, dict) or not regions:
        raise ValueError("regions must be a non-empty dict {region: num_replicas}")
    for r, n in regions.items():
        if not isinstance(r, str) or not re.fullmatch(REGION_PATTERN, r) or "/" in r or len(r) > MAX_REGION_NAME:
            raise ValueError(f"regions: invalid region name {r!r} (1-{MAX_REGION_NAME} letters, digits, _ . : -)")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"regions[{r!r}]: num_replicas must be a positive integer, got {n!r}")
    return dict(regions)


# ---------------------------------------------------------------------------------------------- LLMConfig per region
def _router_config(router: str, region: str, policy: Any, router_kwargs: Optional[dict], stats_period_s: float,
                   user: Optional[dict]) -> Optional[dict]:
    """The model deployment's ``request_router_config`` (None: Ray's default power-of-two)."""
    if router == "pow2":
        return None
    user = dict(user or {})
    cls = GEO_ROUTER
    kw: Dict[str, Any] = {}
    if router == "ray_prefix":
        cls = ray_prefix_router_class()
        if cls is None:  # ray[llm] without the prefix-aware router: our re-implementation, still region-local
            cls, policy = GEO_ROUTER, "ray_prefix"
    if cls == GEO_ROUTER:
        from ray_geolb.serve.router import DEFAULT_POLICY

        kw = {**(user.get("request_router_kwargs") or {}), "region": region, **(router_kwargs or {})}
        kw["policy"] = policy if policy is not None else kw.get("policy", DEFAULT_POLICY)
    return {"request_routing_stats_period_s": stats_period_s, "request_routing_stats_timeout_s": 5.0,
            **{k: v for k, v in user.items() if k not in ("request_router_class", "request_router_kwargs")},
            "request_router_class": cls, "request_router_kwargs": kw}


def region_llm_config(llm_config: Any, region: str, num_replicas: int, *, router: str = "geo", policy: Any = None,
                      router_kwargs: Optional[dict] = None, stats_period_s: float = 0.5, pin_to_region: bool = True):
    """``llm_config`` as region ``region`` deploys it (see the module docstring)."""
    dc = dict(llm_config.deployment_config or {})
    if "autoscaling_config" not in dc:
        dc["num_replicas"] = num_replicas
    rao = dict(dc.get("ray_actor_options") or {})
    if pin_to_region:
        rao["label_selector"] = {**(rao.get("label_selector") or {}), REGION_LABEL: region}
    dc["ray_actor_options"] = rao
    rrc = _router_config(router, region, policy, router_kwargs, stats_period_s, dc.get("request_router_config"))
    if rrc is None:
        dc.pop("request_router_config", None)
    else:
        dc["request_router_config"] = rrc
    ex = dict(llm_config.experimental_configs or {})
    ex[REGION_OPTIONS_KEY] = {**(ex.get(REGION_OPTIONS_KEY) or {}), "region": region}
    update: Dict[str, Any] = {"deployment_config": dc, "experimental_configs": ex}
    if llm_config.server_cls is None:
        from ray_geolb.serve.stats_plugin import GeoVLLMServer  # vLLM's server, reporting the engine's load

        update["server_cls"] = GeoVLLMServer
    cfg = llm_config.model_copy(update=update, deep=True)
    if router == "geo":
        refuse_direct_streaming(f"region app {region!r}", cfg)
    return cfg


def _emulated_config(model: str, engine: Dict[str, Any]):
    from ray_geolb.serve.llm_server import emulated_llm_config

    return emulated_llm_config(model, router_class=None, **{**EMULATED_DEFAULTS, **engine})


def model_len(llm_config: Any) -> Optional[int]:
    """The context length an ``LLMConfig``'s engine runs with, where the config says it: vLLM's
    ``engine_kwargs.max_model_len``, or the emulated engine's profile (and its overrides); None when
    only the model's own config knows (the ingress then leaves the check to the engine)."""
    kw = getattr(llm_config, "engine_kwargs", None) or {}
    if isinstance(kw.get("max_model_len"), int):
        return kw["max_model_len"]
    from ray_geolb.serve.llm_server import ENGINE_OPTIONS_KEY

    emu = (getattr(llm_config, "experimental_configs", None) or {}).get(ENGINE_OPTIONS_KEY)
    if isinstance(emu, dict):
        over = emu.get("engine_overrides") or {}
        if isinstance(over.get("max_model_len"), int):
            return over["max_model_len"]
        from ray_geolb.engine.profiles import get_profile

        return get_profile(emu.get("profile") or EMULATED_DEFAULTS["profile"]).max_model_len
    return None


# ---------------------------------------------------------------------------------------------- apps
def _ingress_config(region: str, regions: Dict[str, int], model_id: str, router: str, policy: Any, lat,
                    ingress: Optional[dict], registry: Any, app_prefix: str, pin: bool = True) -> dict:
    """The region ingress's config (validated now, so a bad field is named at build time)."""
    region_local = router != "geo"
    icfg: Dict[str, Any] = {
        "region": region, "model_name": model_id, "latency": lat.to_spec(),
        "peers": {} if region_local else {p: f"{app_prefix}{p}" for p in regions if p != region},
    }
    extra = dict(ingress or {})
    # the region layer of the local policy, as deployed everywhere (REGION_LAYER: the simulator's too)
    two_layer = REGION_LAYER.two_layer(policy_name(policy if policy is not None else _default_policy()))
    two_layer.update(extra.pop("two_layer", {}))
    if region_local:
        two_layer["max_hops"] = 0
        icfg["local_availability"] = "always"  # Ray's routers have no availability notion
        icfg["registry"] = None
    elif registry is False:
        icfg["registry"] = None
    else:
        icfg["registry"] = _registry_options(registry, regions, pin)
    icfg["two_layer"] = two_layer
    icfg.update(extra)
    return IngressConfig.model_validate(icfg).model_dump()


def _registry_options(registry: Optional[dict], regions: Dict[str, int], pin: bool = True) -> dict:
    """``RegistryOptions`` fields with the deployment's regions in the registry's config (``regions``):
    the registry refuses heartbeats from any other region, and -- registered with their replica counts,
    ``{region: replicas}`` (an autoscaling region's ``max_replicas``) -- heartbeats that claim more
    available replicas than the region has. A list given in ``registry["config"]`` must hold every region
    of the deployment (it may name more, e.g. regions deployed separately); it registers names only.
    Standby registries (``standbys``) must sit in regions of the deployment; they are pinned there when
    the apps are (``pin``)."""
    reg = dict(registry or {})
    outside = sorted(set(reg.get("standbys") or ()) - set(regions))
    if outside:
        raise ValueError(f"registry.standbys names region(s) {outside} outside the deployment's {sorted(regions)}")
    reg.setdefault("pin_standbys", pin)
    cfg = dict(reg.get("config") or {})
    listed = cfg.setdefault("regions", {r: regions[r] for r in sorted(regions)})
    if listed is not None:
        missing = sorted(set(regions) - set(listed))
        if missing:
            raise ValueError(f"registry.config.regions {sorted(listed)} lacks the deployment's region(s) {missing}")
        cfg["regions"] = {r: listed[r] for r in sorted(listed)} if isinstance(listed, dict) else sorted(set(listed))
    reg["config"] = cfg
    return reg


def _default_policy():
    from ray_geolb.serve.router import DEFAULT_POLICY

    return DEFAULT_POLICY


def _one_app(region: str, regions: Dict[str, int], llm_config: Any, *, router: str, policy: Any, lat, ingress,
             registry, router_kwargs, pin_to_region: bool, stats_period_s: float, ingress_replicas: int,
             app_prefix: str) -> RegionApp:
    cfg = region_llm_config(llm_config, region, regions[region], router=router, policy=policy,
                            router_kwargs=router_kwargs, stats_period_s=stats_period_s, pin_to_region=pin_to_region)
    return _bind_app(region, regions, cfg, f"{app_prefix}{region}", f"/{region}", router=router, policy=policy,
                     lat=lat, ingress=ingress, registry=registry, app_prefix=app_prefix,
                     ingress_replicas=ingress_replicas, pin_ingress=pin_to_region, pin_model=pin_to_region)


def _bind_app(region: str, regions: Dict[str, int], cfg: Any, name: str, route_prefix: str, *, router: str,
              policy: Any, lat, ingress, registry, app_prefix: str, ingress_replicas: int,
              pin_ingress: bool, pin_model: bool) -> RegionApp:
    """A region ingress in ``region`` bound in front of the model deployment of LLMConfig ``cfg``
    (``pin_model``: its replicas' placement groups pinned to ``region`` too)."""
    from ray.serve.llm import build_llm_deployment

    length = model_len(cfg)
    ingress = {"max_model_len": length, **(ingress or {})} if length is not None else ingress
    icfg = _ingress_config(region, regions, cfg.model_id, router, policy, lat, ingress, registry, app_prefix,
                           pin_ingress)
    actor_opts: Dict[str, Any] = {"num_cpus": 0}
    if pin_ingress:
        actor_opts["label_selector"] = {REGION_LABEL: region}
    ing = RegionIngress.options(name=INGRESS_DEPLOYMENT, num_replicas=ingress_replicas, ray_actor_options=actor_opts)
    pinned = bundles_pinned_to_region(cfg, region) if pin_model else None
    model = build_llm_deployment(cfg, override_serve_options=pinned)
    return RegionApp(region, name, route_prefix, ing.bind(model, icfg), router, icfg)


def bundles_pinned_to_region(cfg: Any, region: str) -> Optional[Dict[str, Any]]:
    """The deployment option that pins every bundle of every LLM replica's placement group to ``region``
    (``placement_group_bundle_label_selector``), or None when the server asks for no placement group.

    Ray Serve LLM places each LLM replica (its actor and the engine's workers) in a placement group
    built from ``placement_group_config`` (``LLMServer.get_deployment_options``). The replica actor's
    ``label_selector`` does not move that group: without this, the group of a region's replica can be
    reserved on another region's node, where the pinned actor can never be placed, and the replica is
    never scheduled (or its engine runs in the wrong region). A user's own bundle selectors are kept,
    with the region label added to each."""
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    opts = (cfg.server_cls or LLMServer).get_deployment_options(cfg)
    bundles = opts.get("placement_group_bundles")
    if not bundles:
        return None
    selectors = list(opts.get("placement_group_bundle_label_selector") or [{}])
    return {"placement_group_bundle_label_selector": [{**(s or {}), REGION_LABEL: region} for s in selectors]}


def build_region_apps(
    regions: Optional[Dict[str, int]] = None,
    llm_config: Union[Any, Dict[str, Any], None] = None,
    *,
    router: str = "geo",
    policy: Any = None,
    model: str = "geolb-emulated",
    engine_profile: str = EMULATED_DEFAULTS["profile"],
    time_scale: float = EMULATED_DEFAULTS["time_scale"],
    output_tokens: int = EMULATED_DEFAULTS["output_tokens"],
    engine_overrides: Optional[dict] = None,
    latency: Any = None,
    ingress: Optional[dict] = None,
    registry: Any = None,
    router_kwargs: Optional[dict] = None,
    pin_to_region: bool = True,
    stats_period_s: float = 0.5,
    ingress_replicas: int = 1,
    app_prefix: str = APP_PREFIX,
) -> List[RegionApp]:
    """One :class:`RegionApp` per region of ``regions`` (``{region: replicas}``; see the module docstring).

    ``llm_config``: an ``LLMConfig`` for every region, or ``{region: LLMConfig}``; None: the emulated
    engine (``model``, ``engine_profile``, ``time_scale``, ``output_tokens``, ``engine_overrides``).
    ``latency``: :meth:`LatencyInjector.from_spec` spec (``{"scale": 0.1}``; ``{"scale": 0}`` = off).
    ``ingress``: extra :class:`IngressConfig` fields (``max_queue``, ``max_wait_s``, ``two_layer``...).
    ``registry``: ``RegistryOptions`` fields as a dict, or ``False`` for no registry (no forwarding).
    ``router_kwargs``: extra GeoPrefixRouter kwargs (``queue_bound``, ``wait_limit_s``...).
    ``policy``: the GeoPrefixRouter policy (None: the router's ``DEFAULT_POLICY``, GeoPrefix; its region
    layer is the one ``REGION_LAYER`` deploys for that policy, as in the simulator: GeoPrefix's cost
    selector for geoprefix, GORGO's for gorgo, the ring for skylb_ch, SkyLB's prefix snapshot otherwise).
    """
    regions = _check_regions({"us": 2, "eu": 1, "asia": 1} if regions is None else regions)
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    if not (isinstance(time_scale, (int, float)) and time_scale > 0):
        raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
    if isinstance(ingress_replicas, bool) or not isinstance(ingress_replicas, int) or ingress_replicas < 1:
        raise ValueError(f"ingress_replicas must be a positive integer, got {ingress_replicas!r}")
    lat = LatencyInjector.from_spec(latency)
    lat.check_regions(list(regions))
    if llm_config is None:
        engine = {"profile": engine_profile, "time_scale": time_scale, "output_tokens": output_tokens,
                  "engine_overrides": engine_overrides or {}}
        llm_config = _emulated_config(model, engine)
    per_region = llm_config if isinstance(llm_config, dict) else {r: llm_config for r in regions}
    missing = set(regions) - set(per_region)
    if missing:
        raise ValueError(f"llm_config: no LLMConfig for region(s) {sorted(missing)}")
    # an autoscaling region can grow to its max_replicas: that is what its heartbeats may claim
    regions = {r: _max_replicas(per_region[r], n) for r, n in regions.items()}
    return [_one_app(r, regions, per_region[r], router=router, policy=policy, lat=lat, ingress=ingress,
                     registry=registry, router_kwargs=router_kwargs, pin_to_region=pin_to_region,
                     stats_period_s=stats_period_s, ingress_replicas=ingress_replicas, app_prefix=app_prefix)
            for r in regions]


def _max_replicas(llm_config: Any, num_replicas: int) -> int:
    auto = (llm_config.deployment_config or {}).get("autoscaling_config")
    if not auto:
        return num_replicas
    top = auto.get("max_replicas") if isinstance(auto, dict) else getattr(auto, "max_replicas", None)
    return max(num_replicas, int(top)) if isinstance(top, int) and not isinstance(top, bool) else num_replicas


def region_app(args: Dict[str, Any]):
    """One region's application from JSON-able ``args`` -- the ``import_path`` builder of a ``serve run``
    config (``ray_geolb.serve.app:region_app``). ``args``: ``region``, ``regions`` (``{region: replicas}``,
    every region of the deployment), ``llm_config`` (an ``LLMConfig`` as a dict; absent: the emulated
    engine with ``emulated`` options), and any :func:`build_region_apps` keyword (``router``, ``policy``,
    ``latency``, ``ingress``, ``registry``, ``router_kwargs``, ``pin_to_region``, ``stats_period_s``,
    ``ingress_replicas``, ``app_prefix``)."""
    args = dict(args or {})
    try:
        region, regions = args.pop("region"), args.pop("regions")
    except KeyError as e:
        raise ValueError(f"region_app args: missing {e.args[0]!r} (region, regions are required)") from None
    if region not in (regions or {}):
        raise ValueError(f"region_app args: region {region!r} is not in regions {sorted(regions or {})}")
    raw = args.pop("llm_config", None)
    emulated = dict(args.pop("emulated", None) or {})
    if raw is not None:
        from ray_geolb.serve.llm_server import guard_broken_torch_extras

        guard_broken_torch_extras()  # this runs in Serve's build task, before anything imported vLLM
        from ray.serve.llm import LLMConfig

        args["llm_config"] = raw if not isinstance(raw, dict) else LLMConfig.model_validate(raw)
    else:
        args["llm_config"] = _emulated_config(emulated.pop("model", "geolb-emulated"), emulated)
    apps = build_region_apps(regions, **args)
    return next(a.app for a in apps if a.region == region)


def build_central_app(
    regions: Optional[Dict[str, int]] = None,
    *,
    home: str = "us",
    router: str = "ray_prefix",
    model: str = "geolb-emulated",
    engine_profile: str = EMULATED_DEFAULTS["profile"],
    time_scale: float = EMULATED_DEFAULTS["time_scale"],
    output_tokens: int = EMULATED_DEFAULTS["output_tokens"],
    engine_overrides: Optional[dict] = None,
    latency: Any = None,
    ingress: Optional[dict] = None,
    stats_period_s: float = 0.5,
    app_prefix: str = APP_PREFIX,
) -> RegionApp:
    """The alternative a user would consider first: **one central router over every region's replicas**.

    One app at ``/central`` in region ``home``: its ingress sends every request to one model deployment
    of ``sum(regions.values())`` emulated replicas, routed by one router (``router``: Ray's
    prefix-aware router by default, or ``pow2``). Replica ``k`` stands for a replica in
    ``regions``' k-th slot (us, us, eu, asia for the default), by replica rank
    (``emulated.replica_region``), and pays the injected RTT between ``home`` and its region on every
    request (the request's trip there and the first token's trip back: ``network`` in the engine
    options). Clients in other regions pay their RTT to ``home`` themselves (the demo's load does).
    """
    regions = _check_regions({"us": 2, "eu": 1, "asia": 1} if regions is None else regions)
    if home not in regions:
        raise ValueError(f"home {home!r} is not in regions {sorted(regions)}")
    if router not in ("ray_prefix", "pow2"):
        raise ValueError(f"a central app runs Ray's routers (ray_prefix, pow2), got {router!r}")
    lat = LatencyInjector.from_spec(latency)
    lat.check_regions(list(regions))

    engine = {"profile": engine_profile, "time_scale": time_scale, "output_tokens": output_tokens,
              "engine_overrides": engine_overrides or {}, "network": {"caller": home, "latency": lat.to_spec()}}
    slots = [r for r, n in regions.items() for _ in range(n)]
    cfg = region_llm_config(_emulated_config(model, engine), home, len(slots), router=router,
                            stats_period_s=stats_period_s, pin_to_region=False)
    ex = dict(cfg.experimental_configs)
    ex[REGION_OPTIONS_KEY] = {"regions": slots}  # by replica rank, not the node it landed on
    cfg = cfg.model_copy(update={"experimental_configs": ex})
    return _bind_app(home, {home: len(slots)}, cfg, f"{app_prefix}central", "/central", router=router, policy=None,
                     lat=lat, ingress=ingress, registry=False, app_prefix=app_prefix, ingress_replicas=1,
                     pin_ingress=True, pin_model=False)


def deploy_region_apps(apps: List[RegionApp], timeout_s: Optional[float] = None) -> Dict[str, Any]:
    """Deploy every region app in one ``serve.run_many`` (peers come up together; peer handles are
    resolved lazily anyway). Returns region -> ingress handle. ``timeout_s``: raise ``TimeoutError``
    naming every app not running by then, with Serve's own message (a replica that cannot be scheduled
    says so there); None waits as long as Serve does (for good)."""
    # Create the registry actor from here first (it lands on this driver's node -- the head, i.e. the
    # home region -- unless told otherwise), so the ingresses' first heartbeats find it ready. One that
    # already existed (an earlier deployment) keeps its region list: this deployment's regions are added.
    import ray
    from ray import serve
    from ray.serve.api import RunTarget

    from ray_geolb.serve.registry import get_or_create_registry, standby_name

    registries: Dict[tuple, Any] = {}
    listed: Dict[tuple, dict] = {}
    for a in apps:
        reg = a.config.get("registry")
        if not reg:
            continue
        regs = (reg.get("config") or {}).get("regions") or ()
        # the primary (on this driver's node), then each standby, pinned to its region
        for name, where in [(reg["name"], None)] + [(standby_name(reg["name"], r), r) for r in reg.get("standbys", ())]:
            key = (name, reg["namespace"])
            if key not in registries:
                sel = {REGION_LABEL: where} if where is not None and reg.get("pin_standbys", True) else None
                registries[key] = get_or_create_registry(name, reg["namespace"], reg.get("config"), sel)
            listed.setdefault(key, {}).update(regs if isinstance(regs, dict) else {r: None for r in regs})
    for key, actor in registries.items():
        if listed[key]:  # with their replica counts where every one is known (a list leaves counts as they are)
            known = all(n is not None for n in listed[key].values())
            ray.get(actor.add_regions.remote(dict(sorted(listed[key].items())) if known else sorted(listed[key])),
                    timeout=60)
    targets = [RunTarget(target=a.app, name=a.name, route_prefix=a.route_prefix) for a in apps]
    handles = serve.run_many(targets, wait_for_applications_running=timeout_s is None)
    if timeout_s is not None:
        _wait_running([a.name for a in apps], timeout_s)
    return {a.region: h for a, h in zip(apps, handles)}


def _wait_running(names: List[str], timeout_s: float) -> None:
    import time

    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        apps = serve.status().applications
        states = {n: apps[n] if n in apps else None for n in names}
        failed = {n: a.message for n, a in states.items() if a is not None and "FAILED" in str(a.status)}
        if failed:
            raise RuntimeError(f"region apps failed to deploy: {failed}")
        if all(a is not None and str(a.status).endswith("RUNNING") for a in states.values()):
            return
        if time.monotonic() > deadline:
            waiting = {n: (str(a.status), a.message, {d: s.message for d, s in a.deployments.items() if s.message})
                       if a is not None else "missing" for n, a in states.items()
                       if a is None or not str(a.status).endswith("RUNNING")}
            raise TimeoutError(f"region apps not running after {timeout_s:g} s: {waiting}")
        time.sleep(1.0)


def model_replica_actors(app_names: List[str]) -> Dict[str, Any]:
    """``{actor name: actor handle}`` of the model replicas of the given region apps (every
    deployment but the ingress), found by Serve's replica actor names -- to ask an engine directly
    (``record_routing_stats``), outside the routing path."""
    import ray

    out = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        name = a["name"] if isinstance(a, dict) else a
        ns = a.get("namespace", "serve") if isinstance(a, dict) else "serve"
        parts = name[len("SERVE_REPLICA::"):].split("#") if name.startswith("SERVE_REPLICA::") else []
        if len(parts) >= 2 and parts[0] in app_names and parts[1] != INGRESS_DEPLOYMENT:
            try:
                out[name] = ray.get_actor(name, namespace=ns)
            except ValueError:  # gone meanwhile
                continue
    return out


def delete_region_apps(apps: List[RegionApp]) -> None:
    from ray import serve

    for a in apps:  # ask for all deletions first, then wait for them together
        try:
            serve.delete(a.name, _blocking=False)
        except Exception:  # noqa: BLE001 - already gone
            pass
