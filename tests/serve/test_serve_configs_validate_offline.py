"""The `serve run` / `serve deploy` configs in examples/ validate and build offline (no cluster, no GPU).

Each YAML is checked the way Serve checks it (``ServeDeploySchema``), and each application is built
with its own ``import_path`` and ``args`` exactly as Serve's build task would: the region apps with
:func:`ray_geolb.serve.app.region_app`, the one-region app with Ray Serve LLM's ``build_openai_app``.
What is checked on the built apps is what a GPU deployment depends on: the model deployment is
Ray Serve LLM's, routed by GeoPrefixRouter, served by the load-reporting GeoVLLMServer, and pinned to
its region's nodes."""

from __future__ import annotations

import importlib

import pytest
import yaml
from fakes import offline_router

from ray_geolb.serve.llm_server import guard_broken_torch_extras
from repo import REPO

guard_broken_torch_extras()

from ray.serve.schema import ServeDeploySchema  # noqa: E402

from ray_geolb.serve.app import region_app  # noqa: E402
from ray_geolb.serve.emulated import REGION_LABEL  # noqa: E402
from ray_geolb.serve.ingress import INGRESS_DEPLOYMENT  # noqa: E402
from ray_geolb.serve.router import GeoPrefixRouter  # noqa: E402
from ray_geolb.serve.stats_plugin import GeoVLLMServer  # noqa: E402

YAMLS = sorted((REPO / "examples").glob("serve_*.yaml"))
ROUTER_PATH = "ray_geolb.serve.router.GeoPrefixRouter"


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def import_attr(path: str):
    mod, _, attr = path.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(mod), attr)


def model_deployment(app):
    """The model deployment bound into a region app's ingress (its first argument)."""
    ingress = app._bound_deployment
    assert ingress.name == INGRESS_DEPLOYMENT
    return ingress.init_args[0]._bound_deployment


def test_there_are_serve_configs():
    assert {p.name for p in YAMLS} >= {"serve_three_regions.yaml", "serve_geoprefix.yaml"}


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_serve_schema_accepts_the_config_and_its_import_paths_resolve(path):
    schema = ServeDeploySchema.model_validate(load(path))
    assert schema.applications
    for app in schema.applications:
        assert callable(import_attr(app.import_path)), app.import_path


def test_three_region_config_builds_one_llmserver_app_per_region():
    cfg = load(REPO / "examples" / "serve_three_regions.yaml")
    apps = cfg["applications"]
    regions = apps[0]["args"]["regions"]
    assert [a["args"]["region"] for a in apps] == list(regions)  # one app per region, every region served
    assert len({a["route_prefix"] for a in apps}) == len(apps)
    for spec in apps:
        region = spec["args"]["region"]
        assert spec["args"]["regions"] == regions  # the YAML anchor gives every region the same topology
        model = model_deployment(region_app(spec["args"]))
        opts = model._deployment_config
        assert opts.request_router_config.request_router_class == ROUTER_PATH
        assert import_attr(ROUTER_PATH) is GeoPrefixRouter
        assert model._replica_config.ray_actor_options["label_selector"] == {REGION_LABEL: region}
        assert opts.num_replicas == regions[region]
        assert issubclass(model.func_or_class, GeoVLLMServer), model.func_or_class  # reports engine load
        llm_config = model.init_kwargs["llm_config"]
        assert llm_config.model_loading_config.model_id == "llama-3.1-8b"


def test_three_region_builder_names_a_bad_region():
    args = dict(load(REPO / "examples" / "serve_three_regions.yaml")["applications"][0]["args"], region="mars")
    with pytest.raises(ValueError, match="region 'mars' is not in regions"):
        region_app(args)


@pytest.mark.parametrize("two_layer, named", [({"tua": 3}, "two_layer.tua"), ({"remote": "x"}, "two_layer.remote"),
                                               ({"cost": {"w_rtt": -1}}, "two_layer.cost.w_rtt")])
def test_a_bad_region_layer_is_named_when_the_app_is_built(two_layer, named):
    # on the driver, at build time -- not later, inside the ingress replica
    args = load(REPO / "examples" / "serve_three_regions.yaml")["applications"][0]["args"]
    args = dict(args, ingress={**(args.get("ingress") or {}), "two_layer": two_layer})
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        region_app(args)


def test_one_region_config_is_ray_serve_llms_own_app_with_geoprefix():
    from ray.serve.llm import LLMConfig

    cfg = load(REPO / "examples" / "serve_geoprefix.yaml")
    (spec,) = cfg["applications"]
    assert spec["import_path"] == "ray.serve.llm:build_openai_app"
    (raw,) = spec["args"]["llm_configs"]
    llm = LLMConfig.model_validate(raw)
    rc = llm.deployment_config["request_router_config"]
    assert import_attr(rc["request_router_class"]) is GeoPrefixRouter
    router = offline_router(**rc["request_router_kwargs"])  # the kwargs the router will get, validated by it
    assert router.policy.name == rc["request_router_kwargs"]["policy"]
    assert import_attr(raw["server_cls"]) is GeoVLLMServer
    app = import_attr(spec["import_path"])(spec["args"])
    assert app is not None


def test_the_central_router_app_spans_every_region_from_one():
    """The demo's central row: one app at /central in us, one model deployment of every region's
    replicas (not pinned: each stands for its region by rank and pays the RTT from us to it), routed
    by Ray's prefix-aware router, behind an ingress that never forwards."""
    from ray_geolb.serve.app import build_central_app, ray_prefix_router_class
    from ray_geolb.serve.emulated import REGION_OPTIONS_KEY
    from ray_geolb.serve.llm_server import ENGINE_OPTIONS_KEY

    app = build_central_app({"us": 2, "eu": 1, "asia": 1}, home="us", latency={"scale": 0.5})
    assert (app.route_prefix, app.region, app.name) == ("/central", "us", "geolb-central")
    model = model_deployment(app.app)
    assert model._deployment_config.num_replicas == 4
    assert "label_selector" not in model._replica_config.ray_actor_options
    llm = model.init_kwargs["llm_config"]
    assert llm.experimental_configs[REGION_OPTIONS_KEY] == {"regions": ["us", "us", "eu", "asia"]}
    net = llm.experimental_configs[ENGINE_OPTIONS_KEY]["network"]
    assert net["caller"] == "us" and net["latency"]["scale"] == 0.5
    cls = model._deployment_config.request_router_config.request_router_class
    expected = ray_prefix_router_class()
    if expected is not None:
        assert import_attr(cls) is import_attr(expected) if isinstance(expected, str) else expected
    assert app.config["peers"] == {} and app.config["local_availability"] == "always"
    assert app.config["registry"] is None
    with pytest.raises(ValueError, match="home 'mars'"):
        build_central_app({"us": 1}, home="mars")
    with pytest.raises(ValueError, match="Ray's routers"):
        build_central_app({"us": 1}, router="geo")
