"""What GeoPrefixRouter does for deployments on Ray Serve LLM's real LLMServer (no cluster needed):

* several ingress replicas route over the same model replicas: each router takes its share of every
  report's headroom, so together they grant exactly what a replica reported free, never a slot twice;
* a replica that reports no load (the stock ``LLMServer``) is named in a warning and counted, once;
* ``RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING`` (Ray never calls ``on_request_routed``/``completed``
  there) is refused with an error naming the variable, by the router, the region-app builder and the
  emulated LLMServer's deployment options.
"""

from __future__ import annotations

import logging

import pytest
from fakes import fake_replica, offline_router

from ray_geolb.policy import ReplicaStats, RouteRequest, build_policy
from ray_geolb.serve.direct_streaming import DIRECT_STREAMING_ENV, DirectStreamingUnsupported

REPLICAS = [f"r{i}" for i in range(5)]


# ---------------------------------------------------------------------------------------------- headroom share
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("free", [0, 1, 2, 5, 7])
def test_n_routers_together_grant_exactly_the_reported_free_slots(n, free):
    granted = {t: 0 for t in REPLICAS}
    for rank in range(n):
        geo = build_policy("geoprefix", targets=REPLICAS)
        geo.tracker.set_share(rank, n)
        for t in REPLICAS:
            geo.on_stats(t, ReplicaStats(num_waiting=0, num_running=8 - free, max_num_seqs=8, timestamp=1.0))
        for i in range(100):  # dispatch until this router sees no headroom anywhere
            avail = sorted(geo.tracker.available)
            if not avail:
                break
            req = RouteRequest(request_id=f"{rank}-{i}", text=f"question {rank} {i}")
            geo.on_dispatch(req, avail[0], 2.0)
            granted[avail[0]] += 1
    assert granted == {t: free for t in REPLICAS}  # every free slot once, by one of the n routers


def test_a_router_in_no_replica_takes_everything_and_bad_shares_are_named():
    reps = [fake_replica("a", {"num_waiting": 0, "num_running": 0, "max_num_seqs": 4, "timestamp": 1.0})]
    r = offline_router()
    r._sync(reps)
    assert r.policy.tracker.share == (0, 1)  # "auto" outside a Serve replica: the only router
    assert r.policy.tracker.available == {"a"}
    fixed = offline_router(headroom_share=[1, 3])
    fixed._sync(reps)  # applied with the replica set
    assert fixed.policy.tracker.share == (1, 3)
    for bad in ([3, 3], [0], "half", [-1, 2]):
        with pytest.raises(ValueError, match="headroom_share"):
            offline_router(headroom_share=bad)


# ---------------------------------------------------------------------------------------------- load signal
def test_replicas_without_load_reports_are_named_once(caplog):
    r = offline_router(load_signal_grace_s=0.5)
    blind = {"timestamp": 1.0}  # what a stock LLMServer's routing stats carry: no num_waiting / num_running
    loaded = {"num_waiting": 0, "num_running": 1, "max_num_seqs": 4, "timestamp": 1.0}
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        r._sync([fake_replica("stock", blind), fake_replica("geo", loaded)])
        assert r.counters.get("no_load_signal", 0) == 0  # within the grace period: no verdict yet
        r._next_load_check = 0.0
        r._check_load_signal(r.replicas.first_seen["stock"] + 0.6)
        r._next_load_check = 0.0
        r._check_load_signal(r.replicas.first_seen["stock"] + 5.0)  # asked again: not counted twice
    assert r.counters["no_load_signal"] == 1
    warnings = [m for m in caplog.messages if "selective pushing runs blind" in m]
    assert len(warnings) == 1 and "'stock'" in warnings[0] and "'geo'" not in warnings[0]
    assert "GeoVLLMServer" in warnings[0]
    with pytest.raises(ValueError, match="load_signal_grace_s"):
        offline_router(load_signal_grace_s=0)


# ---------------------------------------------------------------------------------------------- direct streaming
def test_router_refuses_direct_streaming(monkeypatch):
    monkeypatch.setenv(DIRECT_STREAMING_ENV, "1")
    with pytest.raises(DirectStreamingUnsupported, match=DIRECT_STREAMING_ENV):
        offline_router()
    monkeypatch.setenv(DIRECT_STREAMING_ENV, "0")
    assert offline_router().policy.name == "geoprefix"  # "0" means off


def test_region_builder_refuses_direct_streaming_in_this_process_or_the_replicas(monkeypatch):
    from ray_geolb.serve.app import build_region_apps
    from ray_geolb.serve.llm_server import emulated_llm_config

    monkeypatch.setenv(DIRECT_STREAMING_ENV, "true")
    with pytest.raises(DirectStreamingUnsupported, match=r"region app 'us'.*" + DIRECT_STREAMING_ENV):
        build_region_apps({"us": 1, "eu": 1})
    monkeypatch.delenv(DIRECT_STREAMING_ENV)
    cfg = emulated_llm_config("m", num_replicas=1)
    cfg.runtime_env = {"env_vars": {DIRECT_STREAMING_ENV: "1"}}  # set for the replicas only
    with pytest.raises(DirectStreamingUnsupported, match=DIRECT_STREAMING_ENV):
        build_region_apps({"us": 1, "eu": 1}, cfg)
    # Ray's own routers do not need the callbacks: the same config is fine with router="pow2"
    assert len(build_region_apps({"us": 1, "eu": 1}, cfg, router="pow2")) == 2
