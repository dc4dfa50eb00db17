"""A local multi-region Ray Serve cluster for the tests (one labelled Ray node per region), and the two
ways to put region apps on it: ``build_region_apps`` in Python, or a ``serve deploy`` config file.

``serve_config_on_cpu`` turns a deployment config written for GPUs (``examples/serve_three_regions.yaml``)
into the one CI deploys: the same ``import_path`` builders and ``LLMConfig``, with only the engine
replaced (``server_cls`` = the emulated-engine ``LLMServer`` subclass, no accelerator), one HTTP proxy on
the head at a free local port (every "region" is this machine), one ingress replica per region, and the
test's engine/ingress options.
"""

import contextlib
import copy
import time

import httpx
import yaml
from ray import serve

from ray_geolb.serve.local import serve_on_region_cluster
from repo import REPO

EMULATED_SERVER = "ray_geolb.serve.llm_server:EmulatedLLMServer"


@contextlib.contextmanager
def region_cluster(regions, prefix: str, namespace: str, metrics_port=None, num_cpus: int = 1):
    """Start the cluster and Serve (one proxy, on the head); yields ``(base_url, port)``. With
    ``metrics_port``, the head node (the first region) serves Prometheus metrics there. ``num_cpus``:
    logical CPUs per region node (a real vLLM replica takes 2)."""
    with serve_on_region_cluster(list(regions), prefix, namespace, num_cpus=num_cpus,
                                 metrics_export_port=metrics_port) as base:
        yield base, int(base.rsplit(":", 1)[1])


def wait_for_peers(base: str, regions, headers: dict, timeout: float = 60.0) -> None:
    """Until every region's ingress sees all its peers through the registry."""
    deadline = time.time() + timeout
    with httpx.Client(timeout=30, headers=headers) as c:
        while True:
            states = [c.get(f"{base}/{r}/v1/geolb/state").json() for r in regions]
            if all(len(s.get("available_peers", ())) == len(regions) - 1 for s in states):
                return
            assert time.time() < deadline, f"peers never became visible: {states}"
            time.sleep(0.3)


def serve_config_on_cpu(path: str, port: int, engine: dict, args: dict) -> dict:
    """The deployment config at ``path`` (relative to the repository) as CI deploys it (module docstring):
    ``engine`` = the emulated engine's options, ``args`` = builder arguments merged into every app's. One
    ingress replica per region unless ``args`` says otherwise: every region is this one CPU machine
    (``test_two_ingress_replicas_share_affinity_and_survive_losing_one.py`` runs two)."""
    cfg = yaml.safe_load((REPO / path).read_text())
    cfg = copy.deepcopy(cfg)
    cfg["proxy_location"] = "HeadOnly"
    cfg["http_options"] = {"host": "127.0.0.1", "port": port}
    for app in cfg["applications"]:
        a = app["args"]
        llm = a["llm_config"]
        llm["server_cls"] = EMULATED_SERVER
        llm.pop("accelerator_type", None)
        llm["log_engine_metrics"] = False
        llm.setdefault("experimental_configs", {})["geolb_engine"] = dict(engine)
        a["ingress_replicas"] = 1
        for k, v in args.items():
            a[k] = {**a[k], **v} if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return cfg


def deploy_config(cfg: dict, timeout: float = 240.0) -> None:
    """Deploy a multi-application config the way ``serve deploy`` does (the controller imports each
    app's ``import_path`` builder and calls it with its ``args``), and wait until every app runs."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(cfg)
    _get_global_client().deploy_apps(schema)
    names = [a.name for a in schema.applications]
    deadline = time.time() + timeout
    while True:
        status = serve.status().applications
        states = {n: str(status[n].status) if n in status else "MISSING" for n in names}
        if all(s.endswith("RUNNING") for s in states.values()):
            return
        failed = {n: status[n].message for n in names if n in status and "FAIL" in str(status[n].status)}
        assert not failed, failed
        assert time.time() < deadline, states
        time.sleep(1.0)


def deploy_holder_and_thief(regions, admin_token: str, plain=()):
    """Region apps for the work-stealing drills, deployed: ``us`` never sees a fresh peer (so it never
    forwards: it holds what it cannot serve), ``eu`` steals (both with ``two_layer.steal.enabled``), and each
    region in ``plain`` runs the default region layer. One emulated replica per region entry of
    ``regions``, ``max_num_seqs`` 2, 16 output tokens at ``time_scale`` 1."""
    from ray_geolb.serve.app import build_region_apps, deploy_region_apps

    common = dict(latency={"scale": 0.1}, time_scale=1.0, output_tokens=16,
                  engine_overrides={"max_num_seqs": 2}, stats_period_s=0.2)
    ingress = {"max_queue": 256, "max_wait_s": 40.0, "admin_token": admin_token}
    steal = {"enabled": True}
    layers = {"us": {"peer_stale_s": 1e-6, "steal": steal}, "eu": {"steal": steal}}
    apps = []
    for region in ["us", "eu", *plain]:
        tl = layers.get(region)
        built = build_region_apps(regions, ingress={**ingress, "two_layer": tl} if tl else ingress, **common)
        apps += [a for a in built if a.region == region]
    deploy_region_apps(apps)
