"""The simulator runs the Serve app's region layer: one configuration, compared field by field.

Serve side: the ingress configs ``build_region_apps()`` builds with its default arguments (building the
apps needs no Ray cluster), the request-router config it gives each region's model deployment, and two
behaviours that are code paths in Serve rather than options, probed without Ray: a forward goes past
requests waiting in the ingress's admission queue (``AdmissionQueue.admit``), and each forward is
counted in the peer's queue until its next heartbeat (``RequestPath._forward`` -> ``note_forward``).

Simulator side: :meth:`Simulator.region_layer_config` of the same system over the same regions, read
from the objects the simulator built (router config, registry, the settings its code reads).

Every ``IngressConfig`` field is either compared here or named, with the reason, in
``SERVE_NOT_SIMULATED`` (the exclusion list). A drift on either side fails
``test_the_simulated_region_layer_is_the_serve_apps_field_by_field``;
``test_the_comparison_sees_a_drift_on_either_side`` shows that it can.
"""

import asyncio

import pytest

from ray_geolb.policy.region import REGION_LAYER, RegionDecision, TwoLayerConfig
from ray_geolb.policy.region.registry_state import RegistryState
from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.simulator import SERVE_NOT_SIMULATED, SimConfig, Simulator
from ray_geolb.sim.workloads import tot

#: build_region_apps' policy -> the simulator's system running that policy on per-region LBs
SYSTEM_OF_POLICY = {"geoprefix": "geoprefix", "skylb": "skylb", "gorgo": "gorgo", "skylb_ch": "skylb-ch"}
#: IngressConfig fields region_layer_config reports (two_layer carries rtt_ewma, stay_slot_wait,
#: drain_window_s and drain_min_samples: IngressConfig.two_layer_config folds them in)
COMPARED = {"region", "peers", "two_layer", "local_availability", "max_queue", "max_wait_s", "retry_after_s",
            "registry", "latency", "rtt_probe_period_s", "rtt_ewma", "stay_slot_wait", "drain_window_s",
            "drain_min_samples"}
COMPARED_REGISTRY = {"period_s", "config", "standbys"}


@pytest.fixture(scope="module")
def serve_apps():
    """``build_region_apps`` with default arguments, and with each other policy (imports ray.serve.llm
    once; no cluster is started)."""
    from ray_geolb.serve.app import build_region_apps

    out = {None: build_region_apps()}
    for policy in SYSTEM_OF_POLICY:
        out[policy] = build_region_apps(policy=policy)
    return out


def _router_config(app):
    """The request-router config ``build_region_apps`` gave this region's model deployment (Ray keeps the
    bound deployments in private attributes: the ingress's first init arg is the model deployment)."""
    model = app.app._bound_deployment.init_args[0]._bound_deployment
    return model._deployment_config.request_router_config


def _probe_forward_past_queue(icfg) -> bool:
    """Serve's admission queue: with one request waiting (held), does a newcomer the region layer
    forwards go straight on, and is a waiting request that is not the head forwarded when the peer
    table changes (kick_all)? Also checks the newcomer was decided with the waiting request ahead."""
    from ray_geolb.policy.base import RouteRequest
    from ray_geolb.serve.ingress.admission import AdmissionQueue

    verdict = {"head": "hold", "second": "hold"}
    aheads = []

    def decide(rreq, waiting):
        aheads.append((rreq.request_id, q.ahead(waiting)[0]))
        kind = verdict.get(rreq.request_id, "forward")
        return RegionDecision(kind, "eu" if kind == "forward" else None, 0, "probe")

    q = AdmissionQueue(icfg.model_copy(update={"poll_s": 0.01}), decide)

    async def main():
        head = asyncio.ensure_future(q.admit(RouteRequest("head", "x", prompt_tokens=1)))
        await asyncio.sleep(0.02)
        second = asyncio.ensure_future(q.admit(RouteRequest("second", "x", prompt_tokens=1)))
        await asyncio.sleep(0.02)
        d = await asyncio.wait_for(q.admit(RouteRequest("new", "x", prompt_tokens=1)), 0.5)
        newcomer_past = d.kind == "forward" and len(q) == 2
        verdict["second"] = "forward"
        q.kick_all()
        d2 = await asyncio.wait_for(second, 0.5)
        behind_head_past = d2.kind == "forward" and not head.done()
        head.cancel()
        return newcomer_past and behind_head_past

    ok = asyncio.run(main())
    assert ("new", 2) in aheads, aheads  # the newcomer was decided with both waiting requests ahead
    return ok


def _probe_note_forwards(icfg) -> bool:
    """Serve's request path: after a forward, is the peer's queue one longer until its next heartbeat?
    (The peer's handle is made to fail, so nothing is sent anywhere.)"""
    from ray_geolb.policy.region import PeerState
    from ray_geolb.serve.ingress.context import RequestContext
    from ray_geolb.serve.ingress.errors import ForwardFailed
    from ray_geolb.serve.ingress.request_path import RequestPath

    peer = sorted(icfg.peers)[0]
    path = RequestPath(icfg.model_copy(update={"registry": None}), geo_router=lambda: None, source="probe")
    path.router.update_peer(PeerState(peer, 1, 0, 1e18))
    before = path.router.peers[peer].queue_len

    def no_handle(region):
        raise RuntimeError("probe: no peer handle")

    path.peers.handle = no_handle
    ctx = RequestContext(body={}, text="probe", stream=False, max_tokens=1, allowed=None, hops=0,
                         origin=icfg.region, session=None, request_id="probe")
    with pytest.raises(ForwardFailed):
        asyncio.run(path._forward(ctx, ctx.route_request(), RegionDecision("forward", peer, 0, "probe"), 0.0))
    return path.router.peers[peer].queue_len == before + 1


def serve_side(app) -> dict:
    """What one region app of ``build_region_apps`` runs, in region_layer_config's terms."""
    from ray_geolb.serve.ingress import IngressConfig
    from ray_geolb.serve.latency import LatencyInjector

    icfg = IngressConfig.model_validate(app.config)
    rrc = _router_config(app)
    reg = icfg.registry
    regions = [icfg.region] + list(icfg.peers)
    lat = LatencyInjector.from_spec(icfg.latency)
    state = RegistryState(**(reg.config or {})) if reg is not None else None
    forwarding = bool(icfg.peers) and reg is not None
    return {
        "region": icfg.region,
        "peers": sorted(icfg.peers),
        "policy": rrc.request_router_kwargs["policy"],
        "two_layer": icfg.two_layer_config(),
        "local_availability": icfg.local_availability,
        "max_queue": icfg.max_queue,
        "max_wait_s": icfg.max_wait_s,
        "retry_after_s": icfg.retry_after_s,
        "registry.period_s": reg.period_s if reg is not None else None,
        "registry.standbys": list(reg.standbys) if reg is not None else None,
        "registry.config": None if state is None else {
            "max_regions": state.max_regions, "max_sources_per_region": state.max_sources, "fresh_s": state.fresh_s,
            "drop_after_s": state.drop_after_s, "max_snapshot_nodes": state.max_snapshot_nodes},
        "rtt_probe_period_s": icfg.rtt_probe_period_s if icfg.peers else None,
        "latency.rtt_ms": {(a, b): lat.rtt_s(a, b) * 1000.0 for a in regions for b in regions if a < b},
        "note_forwards": _probe_note_forwards(icfg) if forwarding else None,
        "forward_past_queue": _probe_forward_past_queue(icfg),
        "stats_period_s": rrc.request_routing_stats_period_s,
    }


def sim_side(system: str, replicas: dict, **deploy) -> dict:
    dep = deployment_for(system, replicas, **deploy)
    sim = Simulator(tot(1, clients={"us": 1}, seed=0), dep, SimConfig(duration_s=1.0))
    return {r: sim.region_layer_config(r) for r in sim.lbs}


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, TwoLayerConfig):
            v = v.model_dump(exclude={"region"})
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def differences(serve: dict, sim: dict) -> dict:
    """field -> (Serve's, the simulator's) for every field that differs (or is on one side only)."""
    a, b = _flat(serve), _flat(sim)
    diff = {}
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k, "<absent>"), b.get(k, "<absent>")
        same = x == pytest.approx(y) if isinstance(x, float) and isinstance(y, float) else x == y
        if isinstance(x, dict) and isinstance(y, dict) and set(x) == set(y):
            same = all(x[i] == pytest.approx(y[i]) for i in x)
        if not same:
            diff[k] = (x, y)
    return diff


def compare(apps, system: str, **deploy) -> dict:
    """region -> its differences (regions without any left out)."""
    replicas = {a.region: 1 for a in apps}  # the LBs' regions; counts do not enter the region layer
    sim = sim_side(system, replicas, **deploy)
    assert set(sim) == set(replicas)
    diffs = {a.region: differences(serve_side(a), sim[a.region]) for a in apps}
    return {r: d for r, d in diffs.items() if d}


@pytest.mark.parametrize("policy", [None, "geoprefix", "skylb"])
def test_the_simulated_region_layer_is_the_serve_apps_field_by_field(serve_apps, policy):
    """Serve's default app (GeoPrefix) and the simulator's ``geoprefix`` system; and the same for
    SkyLB's policy. Fields compared: everything ``region_layer_config`` reports."""
    apps = serve_apps[policy]
    system = SYSTEM_OF_POLICY[policy or REGION_LAYER.default_policy]
    serve = serve_side(apps[0])
    assert serve["policy"] == (policy or REGION_LAYER.default_policy)
    # preconditions: the probes saw the behaviours, and the region layer is the policy's own
    assert serve["note_forwards"] is True and serve["forward_past_queue"] is True
    assert serve["two_layer"].remote == TwoLayerConfig(region="x", **REGION_LAYER.two_layer(serve["policy"])).remote
    assert compare(apps, system) == {}


@pytest.mark.parametrize("policy", ["gorgo", "skylb_ch"])
def test_other_policies_region_layer_matches_serve(serve_apps, policy):
    assert compare(serve_apps[policy], SYSTEM_OF_POLICY[policy]) == {}


def test_the_comparison_sees_a_drift_on_either_side(serve_apps):
    """The comparison can fail: a setting changed on the simulator's side only is reported, by name."""
    apps = serve_apps[None]
    drift = compare(apps, "geoprefix", region_layer={"max_queue": 7, "note_forwards": False},
                    two_layer={"peer_stale_s": 10.0})
    assert set(drift) == {a.region for a in apps}
    for region, d in drift.items():
        assert set(d) == {"max_queue", "note_forwards", "two_layer.peer_stale_s"}, d
        assert d["max_queue"] == (REGION_LAYER.max_queue, 7)
        assert d["two_layer.peer_stale_s"] == (REGION_LAYER.peer_stale_s, 10.0)
    # and the old simulator's heartbeat period is a drift too
    d = compare(apps, "geoprefix", region_layer={"heartbeat_period_s": 0.5})
    assert all(set(v) == {"registry.period_s"} for v in d.values()) and d
    # and a standby registry on one side only
    d = compare(apps, "geoprefix", region_layer={"registry_standbys": ["eu"]})
    assert all(set(v) == {"registry.standbys"} for v in d.values()) and d


def test_every_ingress_config_field_is_compared_or_excluded_with_a_reason():
    from ray_geolb.serve.ingress import IngressConfig
    from ray_geolb.serve.ingress.config import RegistryOptions

    fields = set(IngressConfig.model_fields)
    excluded = {k for k in SERVE_NOT_SIMULATED if k in fields}
    assert fields == COMPARED | excluded, (fields - COMPARED - excluded, (COMPARED | excluded) - fields)
    assert not COMPARED & excluded
    reg = set(RegistryOptions.model_fields)
    reg_excluded = {k.split(".", 1)[1] for k in SERVE_NOT_SIMULATED if k.startswith("registry.")}
    assert reg == COMPARED_REGISTRY | reg_excluded and not COMPARED_REGISTRY & reg_excluded
    assert all(len(why) > 30 for why in SERVE_NOT_SIMULATED.values())  # a reason, not a label


def test_ingress_defaults_come_from_the_shared_settings():
    """IngressConfig's region-layer defaults are REGION_LAYER's (not copies that could drift)."""
    from ray_geolb.serve.ingress import IngressConfig

    c = IngressConfig(region="us")
    assert c.two_layer == REGION_LAYER.two_layer()
    assert c.two_layer_config().remote == "cost" and c.two_layer_config().peer_stale_s == REGION_LAYER.peer_stale_s
    assert (c.max_queue, c.max_wait_s, c.rtt_probe_period_s, c.registry.period_s) == (
        REGION_LAYER.max_queue, REGION_LAYER.max_wait_s, REGION_LAYER.rtt_probe_period_s,
        REGION_LAYER.heartbeat_period_s)
    assert TwoLayerConfig(region="us").peer_stale_s == REGION_LAYER.peer_stale_s
    from ray_geolb.serve.router import DEFAULT_POLICY

    assert DEFAULT_POLICY == REGION_LAYER.default_policy
