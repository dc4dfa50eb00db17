"""Several routers per region in the simulator (``DeploymentSpec.ingress_replicas``), as a region app with
several ingress replicas runs them: each router a separate policy with its share of every report's
headroom, its own queue and heartbeat source; requests spread over them. One router per region stays the
default and its runs are unchanged."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from ray_geolb.policy.region import GEOPREFIX_COST
from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.faults import Fault
from ray_geolb.sim.metrics import summarize
from ray_geolb.sim.simulator import SimConfig, Simulator
from ray_geolb.sim.workloads import conversation, tot

REPS = {"us": 2, "eu": 2, "asia": 2}


@functools.lru_cache(maxsize=None)
def _conversations(n: int, share_s=None):
    """(simulator, result, decisions per LB) of ShareGPT conversations with ``n`` routers per region (each
    run once per module); ``share_s``: their inserts shared at that fixed delay, or ``"registry"`` as Serve
    shares them (``share_sibling_inserts``)."""
    decided = Counter()

    def trace(kind, ev):
        if kind in ("local", "forward"):
            decided[ev["lb"]] += 1

    wl = conversation("sharegpt", clients={"us": 10, "eu": 8, "asia": 8}, seed=0)
    share = {"share_sibling_inserts": True} if share_s == "registry" else {"sibling_inserts_s": share_s}
    sim = Simulator(wl, deployment_for("geoprefix", REPS, ingress_replicas=n, **share),
                    SimConfig(duration_s=12.0, seed=0, drain=True), trace=trace)
    return sim, sim.run(), decided


def test_one_router_per_region_is_the_default_and_keeps_the_region_names():
    dep = deployment_for("geoprefix", REPS)
    assert dep.ingress_replicas == 1 and "ingress_replicas" not in dep.to_dict()
    sim = Simulator(conversation("sharegpt", clients={"us": 1}, seed=0), dep, SimConfig(duration_s=1.0))
    assert sorted(sim.lbs) == sorted(REPS) and all(len(v) == 1 for v in sim.region_lbs.values())
    assert all(lb.policy.headroom_share == (0, 1) for lb in sim.lbs.values())


def test_each_router_takes_its_share_of_the_headroom_and_every_request_is_served():
    n = 3
    sim, res, decided = _conversations(n)
    c = res.counters
    assert {r: [lb.name for lb in lbs] for r, lbs in sim.region_lbs.items()} == \
        {r: [f"{r}.{k}" for k in range(n)] for r in REPS}
    assert c["in_flight_at_end"] == 0 and c["requests_sent"] == c["requests_completed"] + c["requests_rejected"]
    assert c["requests_completed"] > 50
    # requests spread over every router of every region
    assert set(decided) == set(sim.lbs), decided
    for region, lbs in sim.region_lbs.items():
        assert [lb.policy.headroom_share for lb in lbs] == [(k, n) for k in range(n)]
        for target in lbs[0].policy.targets:
            # each router hears every local replica's reports
            assert sorted(lb.name for lb in sim.replicas[target].lbs) == sorted(lb.name for lb in lbs)
            assert all(lb.policy.tracker.stats(target) is not None for lb in lbs)
            # the routers' shares of a report together grant what it had free, never more
            tracker = lbs[0].policy.tracker
            slots, _kv = tracker._headroom(tracker.stats(target))
            shares = [lb.policy.tracker._shared(target, slots, None)[0] for lb in lbs]
            assert sum(shares) == slots and max(shares) - min(shares) <= 1
        # the registry hears each router as a source of the region
        assert set(sim.registry._sources[region]) == {lb.name for lb in lbs}


def test_routers_that_share_their_inserts_keep_the_affinity_that_split_trees_lose():
    """Each router's own tree sees only its share of a conversation's turns, so later turns often land
    where their prefix is not cached; routers that learn each other's inserts (sibling_inserts_s) keep it."""
    one = summarize(_conversations(1)[1])["prefix_hit_rate"]
    three = summarize(_conversations(3)[1])["prefix_hit_rate"]
    shared = summarize(_conversations(3, share_s=0.5)[1])["prefix_hit_rate"]
    assert 0.3 < one and three < 0.9 * one, (one, three)
    assert shared > 0.9 * one and shared > three, (one, three, shared)


def test_routers_sharing_inserts_through_the_registry_keep_the_affinity_too():
    """As Serve shares them (``share_sibling_inserts``): hash-only rows with each heartbeat to the primary
    registry, the siblings' back with its table -- the registry's ring carried them, none was unusable."""
    sim, res, _ = _conversations(3, share_s="registry")
    one = summarize(_conversations(1)[1])["prefix_hit_rate"]
    three = summarize(_conversations(3)[1])["prefix_hit_rate"]
    shared = summarize(res)["prefix_hit_rate"]
    assert shared > 0.9 * one and shared > three, (one, three, shared)
    stats, c = sim.registry.stats(), res.counters
    # each router's rows reach its two siblings: relayed twice, each learned, none unusable
    assert stats["sibling_rows_received"] > 50 and stats["sibling_rows_relayed"] >= 1.9 * stats["sibling_rows_received"]
    assert 0.9 * stats["sibling_rows_relayed"] <= c["sibling_rows_learned"] <= stats["sibling_rows_relayed"]
    assert c["sibling_rows_unusable"] == 0
    assert all(lb.sibling_cursor is not None for lb in sim.lbs.values())


def test_the_two_models_of_the_sibling_channel_are_not_set_together():
    with pytest.raises(ValueError, match="share_sibling_inserts .* and sibling_inserts_s .* set one"):
        deployment_for("geoprefix", REPS, ingress_replicas=2, sibling_inserts_s=0.5, share_sibling_inserts=True)
    with pytest.raises(ValueError, match="share_sibling_inserts must be True or False"):
        deployment_for("geoprefix", REPS, ingress_replicas=2, share_sibling_inserts=1)


def test_a_router_without_a_free_slot_borrows_a_siblings_unused_one():
    """One load view's upper bound (sibling_headroom): unused slots move to the router that needs them, and
    every request is still served once."""
    policy = {"name": "geoprefix", "availability": {"max_burst": 2}}
    runs = {}
    for pooled in (False, True):
        sim = Simulator(tot(2, clients={"us": 16, "eu": 4, "asia": 4}, seed=0),
                        deployment_for(policy, REPS, ingress_replicas=2, sibling_headroom=pooled),
                        SimConfig(duration_s=6.0, seed=0, drain=True))
        res = runs[pooled] = sim.run()
        c = res.counters
        assert c["in_flight_at_end"] == 0 and c["requests_sent"] == c["requests_completed"] + c["requests_rejected"]
        assert sum(rep.engine._num_finished for rep in sim.replicas.values()) == c["requests_completed"]
    assert runs[True].decisions.get("slot_borrowed_from_a_sibling_router", 0) > 0
    assert "slot_borrowed_from_a_sibling_router" not in runs[False].decisions


@functools.lru_cache(maxsize=None)
def _held_tot(region_wide: bool):
    """us holds Tree-of-Thoughts requests, eu and asia steal them; two routers per region."""
    two = {"remote": "cost", "steal": {"enabled": True},
           "cost": {**GEOPREFIX_COST.model_dump(exclude_unset=True), "forward_before_saturation": False}}
    policy = {"name": "geoprefix", "availability": {"max_burst": 2}}
    sim = Simulator(tot(2, clients={"us": 48, "eu": 0, "asia": 0}, seed=0),
                    deployment_for(policy, {"us": 1, "eu": 1, "asia": 1}, two_layer=two, ingress_replicas=2,
                                   region_wide_offers=region_wide),
                    SimConfig(duration_s=12.0, seed=0, drain=True))
    return sim, sim.run()


@pytest.mark.parametrize("region_wide", [False, True])
def test_a_steal_hand_over_reaching_a_sibling_router_is_served_once(region_wide):
    """A hand-over reaches one of the thief region's routers, not always the one that offered. With offers
    per router (``region_wide_offers=False``) the sibling refuses it and the request goes back to its
    victim; with the region's offers (the default, as Serve) the sibling takes it while it has room. Either
    way every request is served once and nothing is left counted."""
    sim, res = _held_tot(region_wide)
    c = res.counters
    assert c["steals_taken"] > 0
    at_sibling = res.decisions.get("steal_taken_at_a_sibling_router", 0)
    assert (at_sibling > 0) == region_wide
    assert c["steals_handed"] == c["steals_taken"] + c["steals_refused"]
    assert c["in_flight_at_end"] == 0 and c["requests_sent"] == c["requests_completed"] + c["requests_rejected"]
    assert sum(rep.engine._num_finished for rep in sim.replicas.values()) == c["requests_completed"]
    for lb in sim.lbs.values():
        assert lb.router.victim.outstanding() == 0 and len(lb.queue) == 0
        assert lb.policy.tracker.total_outstanding() == 0


def test_the_regions_offers_are_refused_at_a_sibling_less_often():
    refused = {w: _held_tot(w)[1].decisions.get("steal_refused_at_a_sibling_router", 0) for w in (False, True)}
    assert refused[False] > 0 and refused[True] < refused[False], refused


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "2"])
def test_a_bad_router_count_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="ingress_replicas must be a positive integer"):
        deployment_for("geoprefix", REPS, ingress_replicas=bad)


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan"), True, "0.5"])
def test_a_bad_sibling_insert_delay_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="sibling_inserts_s must be None or a finite number of seconds >= 0"):
        deployment_for("geoprefix", REPS, ingress_replicas=2, sibling_inserts_s=bad)


def test_a_bad_lending_switch_is_refused_by_name():
    with pytest.raises(ValueError, match="sibling_headroom must be True or False"):
        deployment_for("geoprefix", REPS, ingress_replicas=2, sibling_headroom="yes")


def test_several_routers_need_per_region_lbs_and_no_faults():
    with pytest.raises(ValueError, match="ingress_replicas=2: several routers per region need per-region LBs"):
        deployment_for("ray-prefix", REPS, ingress_replicas=2)
    dep = deployment_for("geoprefix", REPS, ingress_replicas=2)
    with pytest.raises(ValueError, match="faults with ingress_replicas > 1"):
        Simulator(conversation("sharegpt", clients={"us": 1}, seed=0), dep,
                  SimConfig(duration_s=4.0, faults=[Fault(kind="outage", region="eu", start_s=1.0, duration_s=1.0)]))
