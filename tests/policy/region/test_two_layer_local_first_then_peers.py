import pytest
from pydantic import ValidationError

from ray_geolb.policy import PeerState, RegionRouter, ReplicaStats, RouteRequest, TwoLayerConfig, build_policy


def lb(region="us", targets=("us-0", "us-1"), **cfg):
    local = build_policy("skylb", targets=list(targets))
    for t in targets:
        local.on_stats(t, ReplicaStats(max_num_seqs=64, timestamp=0.0))
    return RegionRouter(TwoLayerConfig(region=region, **cfg), local)


def fill(router, now=1.0):
    for t in router.local.targets:
        router.local.on_stats(t, ReplicaStats(num_waiting=2, timestamp=now))


def peers(router, now=1.0, **over):
    base = {"eu": (2, 0, 0.098), "asia": (1, 0, 0.167)}
    base.update(over)
    for r, (avail, q, rtt) in base.items():
        router.update_peer(PeerState(r, avail, q, now, rtt_s=rtt))


def rq(i, text="hello " * 50, **kw):
    return RouteRequest(f"r{i}", text, **kw)


def test_local_first_while_available():
    r = lb()
    peers(r)
    d = r.decide(rq(0), 1.0)
    assert d.kind == "local" and d.target in ("us-0", "us-1")


def test_forward_only_when_local_full_then_nearest_on_no_match():
    r = lb()
    peers(r)
    fill(r)
    d = r.decide(rq(0), 1.1)
    assert d.kind == "forward" and d.target == "eu" and d.reason == "nearest"


def test_snapshot_affinity_sends_the_conversation_back_to_the_same_peer():
    r = lb()
    peers(r)
    fill(r)
    conv = "a long conversation " * 40
    r.on_forward(rq(0, conv), "asia", 1.1)
    d = r.decide(rq(1, conv + " next turn"), 1.2)
    assert d.kind == "forward" and d.target == "asia" and d.reason == "snapshot" and d.matched > 0


def test_peer_needs_available_replica_short_queue_and_fresh_heartbeat():
    r = lb(tau=2)
    fill(r)
    peers(r, eu=(0, 0, 0.098), asia=(3, 5, 0.167))  # eu: none available; asia: queue > tau
    assert r.decide(rq(0), 1.1).kind == "hold"
    peers(r, now=1.0, eu=(0, 0, 0.098), asia=(3, 1, 0.167))
    assert r.decide(rq(1), 1.1).target == "asia"
    assert r.decide(rq(2), 1.0 + r.config.peer_stale_s + 1).kind == "hold"  # stale: never forward blindly


def test_hop_limit_and_region_local_mode():
    r = lb()
    peers(r)
    fill(r)
    assert r.decide(rq(0, hops=1), 1.1).kind == "hold"
    local_only = lb(max_hops=0)
    peers(local_only)
    fill(local_only)
    assert local_only.decide(rq(1), 1.1).kind == "hold"


def test_allowed_regions_enforced_on_both_layers():
    r = lb()
    peers(r)
    d = r.decide(rq(0, allowed_regions={"asia"}), 1.0)  # local is available but not allowed
    assert d.kind == "forward" and d.target == "asia"
    fill(r)
    assert r.decide(rq(1, allowed_regions={"us"}), 1.1).kind == "hold"  # never leaves us
    peers(r, asia=(0, 0, 0.167))
    assert r.decide(rq(2, allowed_regions={"asia"}), 1.1).kind == "hold"
    assert r.decide(rq(3, allowed_regions={"mars"}), 1.1).kind == "reject"
    assert r.decide(rq(4, allowed_regions={"asia"}, hops=1), 1.1).kind == "reject"
    with pytest.raises(ValueError, match="allowed_regions"):
        rq(5, allowed_regions=set())


def test_ring_mode_is_sticky_per_session():
    r = lb(remote="ring")
    peers(r)
    fill(r)
    first = r.decide(rq(0, session_key="user-1"), 1.1).target
    assert all(r.decide(rq(i, session_key="user-1"), 1.1).target == first for i in range(1, 10))


def test_heartbeat_reports_local_availability():
    r = lb()
    hb = r.heartbeat(queue_len=3, now=2.0)
    assert (hb.region, hb.available_replicas, hb.queue_len) == ("us", 2, 3)
    fill(r)
    assert r.heartbeat(0, 2.0).available_replicas == 0


def test_old_heartbeats_do_not_overwrite_new_ones_and_peers_can_leave():
    r = lb()
    r.update_peer(PeerState("eu", 2, 0, 5.0, rtt_s=0.1))
    r.update_peer(PeerState("eu", 0, 9, 4.0))
    assert r.peers["eu"].available_replicas == 2
    r.update_peer(PeerState("eu", 1, 0, 6.0))
    assert r.peers["eu"].rtt_s == 0.1  # RTT kept when a heartbeat does not carry one
    r.remove_peer("eu")
    assert "eu" not in r.peers and r.ring.lookup("k") is None


@pytest.mark.parametrize("cfg, field", [({"region": ""}, "region"), ({"region": "us", "tau": -1}, "tau"),
                                        ({"region": "us", "remote": "magic"}, "remote"),
                                        ({"region": "us", "max_hops": 2}, "max_hops"),
                                        ({"region": "bad region!"}, "region")])
def test_config_errors_name_the_field(cfg, field):
    with pytest.raises(ValidationError, match=field):
        TwoLayerConfig(**cfg)
