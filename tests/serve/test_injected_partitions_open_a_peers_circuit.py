"""Injected faults (``LatencyInjector.set_faults``) and the peer circuit they open (``PeerMesh``), without
a cluster: a dropped crossing raises before anything leaves, the origin counts the peer unreachable
and keeps it so past its next heartbeats until a probe reaches it; the request goes elsewhere."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fakes import fake_router_view

from ray_geolb.policy.region import PeerState
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.ingress import IngressConfig, RequestPath
from ray_geolb.serve.ingress.openai import parse_request
from ray_geolb.serve.latency import HopDropped, LatencyInjector


def test_faults_drop_and_delay_crossings_towards_a_region_and_heal():
    inj = LatencyInjector(scale=0.0)
    inj.set_faults({"eu": {"drop": 1.0, "extra_ms": 30}})
    assert inj.one_way_s("us", "eu") == pytest.approx(0.03) and inj.one_way_s("us", "asia") == 0
    t0 = time.monotonic()
    with pytest.raises(HopDropped, match="us -> eu"):
        asyncio.run(inj.hop("us", "eu"))
    assert time.monotonic() - t0 >= 0.025 and inj.dropped == 1
    asyncio.run(inj.hop("eu", "us"))  # a reply is delayed, never dropped
    asyncio.run(inj.hop("us", "asia"))
    inj.set_faults(None)
    assert inj.faults == {} and inj.one_way_s("us", "eu") == 0
    for bad in ({"eu": {"drop": 2}}, {"eu": {"loss": 0.5}}, {"eu": {"extra_ms": -1}}, {"eu": 0.5}):
        with pytest.raises(ValueError, match="faults"):
            inj.set_faults(bad)


def _busy():
    """A local router view with no free slot (so the region layer forwards)."""
    from ray_geolb.policy import ReplicaStats, build_policy

    policy = build_policy("geoprefix", targets=["r1"])
    policy.on_stats("r1", ReplicaStats(num_waiting=3, num_running=4, timestamp=policy_now(), max_num_seqs=4))
    return fake_router_view(policy)


def test_a_partitioned_peer_stays_out_past_its_heartbeats_until_a_probe_reaches_it():
    busy = _busy()
    cfg = IngressConfig(region="us", registry=None, model_name="m", peers={"eu": "geolb-eu", "asia": "geolb-asia"},
                        two_layer={"remote": "nearest"}, latency={"scale": 0.0})
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: busy)
    for peer, rtt in (("eu", 0.05), ("asia", 0.15)):
        ing.router.update_peer(PeerState(peer, 2, 0, policy_now(), rtt_s=rtt))  # eu is the nearest
    ing.peers.latency.set_faults({"eu": {"drop": 1.0}})
    reached = []

    class _Handle:
        def __init__(self, peer):
            self.peer = peer

        @property
        def forwarded(self):
            return self

        def remote(self, body, fmeta):
            reached.append(self.peer)

            async def answer():
                return {"region": self.peer}, {"ok": True}

            return answer()

    ing.peers.handle = _Handle
    ctx = parse_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(), {},
                        "chat", cfg, origin="us", request_id="p1")
    meta, out = asyncio.run(ing.process(ctx))
    assert reached == ["asia"] and meta["region"] == "asia"  # eu never received it; asia served it
    assert ing.counts["forward_failures"] == 1 and ing.peers.circuit_open("eu")
    # the registry still hears from eu (it is partitioned from us, not from the registry): still out
    table = {"regions": {"eu": {"available_replicas": 2, "queue_len": 0, "age_s": 0.0},
                         "asia": {"available_replicas": 2, "queue_len": 0, "age_s": 0.0}}, "rtts": {}}
    ing.peers._on_table(table, policy_now())
    assert ing.available_peers() == ["asia"]
    # a probe that reaches eu closes its circuit; the next table brings it back
    ing.peers.reachable("eu")
    ing.peers._on_table(table, policy_now())
    assert not ing.peers.circuit_open("eu") and ing.available_peers() == ["asia", "eu"]
    assert not [p for p in cfg.peers if ing.peers.circuit_open(p)]


def test_the_retry_budget_is_earned_by_requests_and_time_and_refuses_when_spent():
    from ray_geolb.serve.ingress.retry_budget import RetryBudget

    t = [0.0]
    b = RetryBudget(ratio=0.5, min_per_s=1.0, burst=2.0, clock=lambda: t[0])
    assert b.try_spend() and b.try_spend() and not b.try_spend()  # the saved-up burst, then nothing
    b.on_request()
    b.on_request()
    assert b.try_spend() and not b.try_spend()  # two requests earned one retry
    t[0] += 1.0
    assert b.try_spend()  # a second earned one more
    assert (b.spent, b.refused) == (4, 2)
    with pytest.raises(ValueError, match="ratio"):
        RetryBudget(ratio=-1)


def test_a_spent_retry_budget_answers_503_instead_of_retrying():
    busy = _busy()
    cfg = IngressConfig(region="us", registry=None, model_name="m", peers={"eu": "geolb-eu", "asia": "geolb-asia"},
                        two_layer={"remote": "nearest"}, latency={"scale": 0.0}, retry_budget_ratio=0.0,
                        retry_budget_min_per_s=0.0)
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: busy)
    for peer, rtt in (("eu", 0.05), ("asia", 0.15)):
        ing.router.update_peer(PeerState(peer, 2, 0, policy_now(), rtt_s=rtt))
    ing.peers.latency.set_faults({"eu": {"drop": 1.0}, "asia": {"drop": 1.0}})
    from types import SimpleNamespace

    def unreachable(body, fmeta):
        raise AssertionError("a peer was reached through a partition")

    ing.peers.handle = lambda peer: SimpleNamespace(forwarded=SimpleNamespace(remote=unreachable))
    ing.retries._tokens = 1.0  # one retry left
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    with pytest.raises(Exception) as e:
        asyncio.run(ing.process(parse_request(body, {}, "chat", cfg, origin="us", request_id="b1")))
    err = e.value
    assert err.status == 503 and err.type == "forward_failed" and "retry budget" in err.message
    assert ing.counts["forward_failures"] == 2 and ing.counts["retries_refused"] == 1
