"""The region layer's contracts: what it may ask of the local layer (the LocalLayer protocol, met by
every policy and by the Serve ingress's local view), one peer selector per ``TwoLayerConfig.remote``,
PeerState changed only through RegionRouter, and the one RTT estimate the router owns."""

import ast
import typing

import pytest

from ray_geolb.policy import (
    POLICY_CLASSES,
    PeerState,
    RegionRouter,
    ReplicaStats,
    RouteRequest,
    TwoLayerConfig,
    build_policy,
)
from ray_geolb.policy.region import PEER_SELECTORS, CostSelector, LocalLayer, LocalLoad, PeerSelector
from repo import REPO

REGION = REPO / "ray_geolb" / "policy" / "region"


@pytest.mark.parametrize("name", sorted(POLICY_CLASSES))
def test_every_policy_is_a_local_layer_with_documented_defaults(name):
    kw = {"cache_probe": lambda t, r: 0} if name == "oracle" else {}
    p = build_policy(name, targets=["a", "b"], **kw)
    assert isinstance(p, LocalLayer) and isinstance(p.tracker, LocalLoad)
    p.on_stats("a", ReplicaStats(num_waiting=1, timestamp=0.0))
    cost = hasattr(p, "pooled_t_p")  # the TTFT-cost family
    assert (p.region_t_p() == p.pooled_t_p()) if cost else p.region_t_p() is None
    assert (p.queued_tokens("a") > 0) if cost else p.queued_tokens("a") is None
    assert (p.mean_prompt_tokens is not None) == cost
    assert (p.index is not None) == hasattr(p, "prepared")


def test_the_ingress_view_is_a_local_layer_delegating_to_the_live_policy():
    from ray_geolb.policy.region import GEOPREFIX_COST
    from ray_geolb.serve.ingress import IngressConfig
    from ray_geolb.serve.ingress.local_view import LocalView as _LocalView

    cfg = IngressConfig(region="us", registry=None, two_layer={"remote": "cost", "cost": GEOPREFIX_COST})
    geo = build_policy("geoprefix", targets=["r1"])
    from ray_geolb.serve.router_snapshot import snapshot_of

    router = type("R", (), {"policy": geo, "num_available": lambda self: 0, "free_slots": lambda self: 0,
                            "queue_len": lambda self: 0, "queued_tokens": lambda self: 0.0})()
    router.snapshot = snapshot_of(router)  # what the GeoPrefixRouter publishes after each event
    view = _LocalView(cfg.local_availability, lambda: router)
    assert isinstance(view, LocalLayer)
    assert view.index is geo.index and view.mean_prompt_tokens == geo.mean_prompt_tokens
    assert view.region_t_p() == geo.region_t_p() and view.queued_tokens("r1") == geo.queued_tokens("r1")
    assert "__getattr__" not in vars(_LocalView)
    view.geo_router = lambda: None
    assert view.targets == [] and view.index is None and view.region_t_p() is None and view.queued_tokens("x") is None


def test_one_selector_per_remote_mode():
    modes = set(typing.get_args(TwoLayerConfig.model_fields["remote"].annotation))
    assert set(PEER_SELECTORS) == modes
    for mode in sorted(modes):
        r = RegionRouter(TwoLayerConfig(region="us", remote=mode), build_policy("skylb", targets=["a"]))
        assert isinstance(r.peer_selector, PeerSelector)
        assert (r.selector is r.peer_selector) if mode == "cost" else r.selector is None
    r = RegionRouter(TwoLayerConfig(region="us", remote="cost"), build_policy("skylb", targets=["a"]))
    assert isinstance(r.selector, CostSelector) and r.selector.rtt is r.rtt  # one RTT table


def test_region_layer_reads_the_local_layer_without_probing_or_private_calls():
    for path in REGION.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("getattr", "hasattr"), f"{path.name}:{node.lineno}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "router":
                assert not node.attr.startswith("_"), f"{path.name}:{node.lineno}: router.{node.attr}"


def _router(remote="prefix"):
    local = build_policy("skylb", targets=["us-0"])
    local.on_stats("us-0", ReplicaStats(num_waiting=3, timestamp=0.0))  # SP-P: not available
    r = RegionRouter(TwoLayerConfig(region="us", remote=remote, tau=1), local)
    r.update_peer(PeerState("eu", 1, 0, 1.0, rtt_s=0.10))
    r.update_peer(PeerState("asia", 1, 0, 1.0, rtt_s=0.20))
    return r


def test_peer_state_changes_through_router_methods():
    r = _router("nearest")
    req = lambda i: RouteRequest(request_id=f"q{i}", text="hello " * 50)  # noqa: E731
    assert r.decide(req(0), 1.5).target == "eu"
    r.note_forward("eu")
    assert r.peers["eu"].queue_len == 1 and r.decide(req(1), 1.5).target == "eu"  # tau = 1
    r.note_forward("eu")
    assert r.decide(req(2), 1.5).target == "asia"  # eu's LB queue counted past tau
    r.mark_unreachable("asia")
    assert r.peers["asia"].available_replicas == 0 and r.decide(req(3), 1.5).kind == "hold"
    r.note_forward("nowhere")
    r.mark_unreachable("nowhere")  # unknown regions: nothing to change
    r.update_peer(PeerState("asia", 1, 0, 2.0))  # the next heartbeat replaces the optimistic figures
    assert r.decide(req(4), 2.5).target == "asia" and r.heartbeat_rtt("asia") == 0.20


def test_the_router_owns_the_rtt_estimate_and_each_selector_keeps_its_source():
    r = _router("nearest")
    assert r.observe_rtt("asia", 0.01) == 0.01 and r.measured_rtt("asia") == 0.01
    assert r.measured_rtts() == {"asia": 0.01} and r.peers["asia"].rtt_s == 0.20  # the heartbeat's, untouched
    assert r.decide(RouteRequest(request_id="n", text="x" * 100), 1.5).target == "eu"  # nearest: heartbeat RTT
    c = _router("cost")
    c.observe_rtt("asia", 0.01)
    assert c.selector.rtt_of(c, "asia") == 0.01 and c.selector.rtt_of(c, "eu") == 0.10  # measured, else heartbeat
    c.update_peer(PeerState("au", 1, 0, 1.0))
    assert c.selector.rtt_of(c, "au") == c.selector.config.unknown_rtt_s
    c.remove_peer("asia")
    assert c.measured_rtt("asia") is None
