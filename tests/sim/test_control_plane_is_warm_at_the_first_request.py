"""The simulated control plane runs before the first request (``SimConfig.warmup_s``): at time 0 every
per-region LB already has a peer table, RTT measurements and its replicas' reports, as a Serve ingress
that started before its traffic has. ``warmup_s=0`` is the cold start; central LBs do not depend on it."""

from __future__ import annotations

import math
from unittest import mock

import pytest

from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.metrics import dumps, summarize
from ray_geolb.sim.region_lb import RegionLB
from ray_geolb.sim.simulator import SimConfig, Simulator, simulate
from ray_geolb.sim.workloads import tot

REPS = {"us": 2, "eu": 2, "asia": 2}
CLIENTS = {"us": 12, "eu": 4, "asia": 4}


def _state_at_first_request(warmup_s):
    """Each LB's peers (region -> heartbeat time), measured RTTs and reported replicas when the first
    request reaches an LB."""
    seen = {}
    sim = Simulator(tot(2, clients=CLIENTS, seed=0), deployment_for("geoprefix", REPS),
                    SimConfig(duration_s=5.0, warmup_s=warmup_s))
    orig = RegionLB.on_arrive

    def arrive(lb, req):
        if not seen:
            assert sim.now >= 0.0  # no request before time 0
            for name, other in sim.lbs.items():
                router = other.router
                seen[name] = ({r: p.timestamp for r, p in router.peers.items()}, router.measured_rtts(),
                              [t for t in router.local.targets if router.local.tracker.stats(t) is not None])
        return orig(lb, req)

    with mock.patch.object(RegionLB, "on_arrive", arrive):  # the LB's arrival handler (sim/region_lb.py)
        res = sim.run()
    assert res.counters["requests_completed"] > 0
    return seen


def test_at_time_0_every_lb_knows_its_peers_rtts_and_replicas():
    seen = _state_at_first_request(SimConfig().warmup_s)
    assert SimConfig().warmup_s > 0
    for name, (peers, rtts, reported) in seen.items():
        assert len(peers) == 2 and all(-SimConfig().warmup_s < t <= 0.0 for t in peers.values()), (name, peers)
        assert set(rtts) == set(peers), (name, rtts)
        assert len(reported) == 2, (name, reported)


def test_warmup_0_is_the_cold_start():
    seen = _state_at_first_request(0.0)
    for name, (peers, rtts, reported) in seen.items():
        assert all(t == -math.inf for t in peers.values()), (name, peers)  # known but never heard
        assert not rtts and not reported, name


def test_central_lbs_do_not_depend_on_it():
    def run(system, w):
        m = summarize(simulate(tot(2, clients=CLIENTS, seed=0), deployment_for(system, REPS),
                               SimConfig(duration_s=10.0, warmup_s=w)))
        # what the clients saw (the counters differ: the warm-up's replica reports are counted)
        return dumps({k: m[k] for k in ("throughput_rps", "ttft_s", "e2e_s", "lb_queue_s", "prefix_hit_rate")})
    for system in ("ll", "ray-prefix"):
        assert run(system, 0.0) == run(system, SimConfig().warmup_s), system


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), "5"])
def test_a_bad_warmup_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="warmup_s"):
        SimConfig(warmup_s=bad)
