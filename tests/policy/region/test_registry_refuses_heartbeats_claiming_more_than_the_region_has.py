"""The registry checks a heartbeat against what it knows of the region's size (``RegistryState``, module
docstring "capacity"): a heartbeat claiming more available replicas than the region's registered count is
refused as ``over_capacity``, and queue figures past their bounds as ``queue_out_of_bounds`` -- typed,
counted and named in the reply like every other refusal, the region's last good figures kept. Honest
heartbeats, the simulated LBs' included, are never refused."""

import pytest

from ray_geolb.policy.region.heartbeat import Heartbeat
from ray_geolb.policy.region.peer_table import peer_states_from_table
from ray_geolb.policy.region.registry_state import REFUSAL_CODES, HeartbeatRefused, RegistryState

COUNTS = {"us": 4, "eu": 1}


class Clock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def hb(region, avail, q=0, source=None, **kw):
    return {"region": region, "source": source or f"{region}/1", "available_replicas": avail, "queue_len": q, **kw}


def registry(**kw):
    return RegistryState(clock=Clock(), regions=dict(COUNTS), **kw)


def test_a_forged_heartbeat_claiming_more_replicas_than_the_region_has_is_refused_with_a_typed_reason():
    st = registry()
    st.heartbeat_batch([hb("eu", 1, extra={"replicas": 1}), hb("us", 2, rtts={"eu": 0.1})])
    t = st.heartbeat_batch([hb("eu", 1000, extra={"replicas": 1})])  # signed or not, eu has one replica
    assert t["refused"] == {"over_capacity": 1}
    assert t["errors"] == ["over_capacity: heartbeat from 'eu/1': available_replicas=1000 exceeds the 1 replica(s) "
                           "of region 'eu', its registered count"]
    assert st.stats()["refused"] == {"over_capacity": 1} and st.rejected == 1 and st.heartbeats == 2
    # eu keeps its last good figures, and us prices eu by them
    assert t["regions"]["eu"]["available_replicas"] == 1
    eu = {p.region: p for p in peer_states_from_table(t, 100.0, "us")}["eu"]
    assert eu.available_replicas == 1 and eu.extra["replicas"] == 1
    # from a new source, and with a matching replicas figure, it is refused the same
    t = st.heartbeat_batch([hb("eu", 1000, source="eu/forged"), hb("eu", 1000, extra={"replicas": 1000})])
    assert t["refused"] == {"over_capacity": 2} and t["regions"]["eu"]["sources"] == 1


def test_a_replica_count_above_the_registered_one_is_refused_and_the_registered_count_itself_is_taken():
    st = registry()
    t = st.heartbeat_batch([hb("eu", 1, extra={"replicas": 40, "inflight": 0})])
    assert t["refused"] == {"over_capacity": 1} and "extra['replicas']=40 exceeds the 1 replica(s)" in t["errors"][0]
    t = st.heartbeat_batch([hb("us", 4, extra={"replicas": 4}), hb("us", 3, source="us/2", extra={"replicas": 4.0}),
                            hb("eu", 0, extra={"replicas": 1})])
    assert "refused" not in t and t["regions"]["us"]["available_replicas"] == 4


def test_registered_counts_come_with_the_region_list_and_the_latest_registration_wins():
    st = RegistryState(clock=Clock(), regions=["us"])
    assert st.stats()["replicas_registered"] == {}
    assert st.heartbeat_batch([hb("us", 9)])["regions"]["us"]["available_replicas"] == 9  # no count: not capped
    assert st.add_regions({"us": 2, "eu": 1}) == ["eu", "us"]
    assert st.stats()["replicas_registered"] == {"us": 2, "eu": 1}
    assert st.heartbeat_batch([hb("us", 3)])["refused"] == {"over_capacity": 1}
    st.add_regions({"us": 3})  # a redeployment scales us up
    st.add_regions(["asia"])  # a list of names leaves the counts as they are
    assert st.stats()["replicas_registered"] == {"us": 3, "eu": 1}
    assert "refused" not in st.heartbeat_batch([hb("us", 3), hb("asia", 50)])
    for bad in (0, -1, True, 2.0, "3", 10**10, 10**5000):
        with pytest.raises(ValueError, match=r"regions\['eu'\]: num_replicas"):
            st.add_regions({"asia": 1, "eu": bad})
    assert st.stats()["replicas_registered"] == {"us": 3, "eu": 1}  # a refused registration changes nothing


@pytest.mark.parametrize("item, field", [
    (hb("us", 1, 40_001), "queue_len=40001 exceeds 40000"),
    (hb("us", 1, extra={"inflight": 40_001}), "extra['inflight']=40001 exceeds 40000"),
    (hb("us", 1, extra={"queued_tokens": 2e6 * 20_000 * 4 + 1}), "extra['queued_tokens']=1.6e+11 exceeds 160000000000"),
])
def test_queue_figures_past_their_bounds_are_refused_by_a_typed_reason(item, field):
    st = registry()
    t = st.heartbeat_batch([item, hb("eu", 1, 10_000, extra={"inflight": 10_000, "queued_tokens": 4e10})])
    assert t["refused"] == {"queue_out_of_bounds": 1} and set(t["regions"]) == {"eu"}  # eu at its bounds
    assert t["errors"][0].startswith("queue_out_of_bounds: heartbeat from 'us/1': " + field), t["errors"]
    assert "x max(1, the 4 replica(s) of region 'us', its registered count)" in t["errors"][0]
    with pytest.raises(HeartbeatRefused) as e:
        st._check_capacity(Heartbeat.model_validate(item), "us/1", 100.0)
    assert e.value.code == "queue_out_of_bounds" and e.value.code in REFUSAL_CODES


def test_queue_bounds_scale_with_the_replicas_the_sources_report_when_none_is_registered():
    st = RegistryState(clock=Clock(), max_queue_per_replica=10, max_inflight_per_replica=5)
    assert "refused" not in st.heartbeat_batch([hb("eu", 1, 10_000)])  # nothing known to scale by: not checked
    t = st.heartbeat_batch([hb("us", 1, 31, extra={"replicas": 3}), hb("us", 1, 30, extra={"replicas": 3})])
    assert t["refused"] == {"queue_out_of_bounds": 1} and "the most its sources report" in t["errors"][0]
    # a sibling that states no count is held to the region's fresh sources' count
    t = st.heartbeat_batch([hb("us", 1, 0, source="us/2", extra={"inflight": 16}),
                            hb("us", 1, 0, source="us/3", extra={"inflight": 15})])
    assert t["refused"] == {"queue_out_of_bounds": 1} and t["regions"]["us"]["sources"] == 2
    st._clock.t += st.fresh_s + 1  # those counts aged: nothing known again
    assert "refused" not in st.heartbeat_batch([hb("us", 1, 0, source="us/2", extra={"inflight": 16})])
    with pytest.raises(ValueError, match="max_queue_per_replica"):
        RegistryState(max_queue_per_replica=0)


def test_the_simulated_lbs_honest_heartbeats_are_never_refused_against_registered_counts():
    """An overloaded US (holds and forwards) on every region-layer system: with the deployment's replica
    counts registered, the registry refuses none of the simulated LBs' heartbeats."""
    from ray_geolb.sim.deploy import deployment_for
    from ray_geolb.sim.simulator import SimConfig, Simulator
    from ray_geolb.sim.workloads import tot

    replicas = {"us": 1, "eu": 2, "asia": 2}
    for system in ("geoprefix", "skylb", "gorgo", "geoprefix-steal"):
        sim = Simulator(tot(2, clients={"us": 30, "eu": 2, "asia": 2}, seed=0),
                        deployment_for(system, replicas, profile="llama3.1-8b-l4-sglang"), SimConfig(duration_s=20.0))
        sim.registry.add_regions(replicas)
        seen = []
        apply = sim.registry.heartbeat_batch
        sim.registry.heartbeat_batch = lambda items: (seen.extend(items), apply(items))[1]
        sim.run()
        stats = sim.registry.stats()
        assert stats["heartbeats"] > 100 and stats["refused"] == {} and stats["rejected"] == 0, (system, stats)
        assert max(h["available_replicas"] for h in seen if h["region"] == "eu") == 2, system  # at the ceiling
        if system.startswith("geoprefix"):
            assert max(h["queue_len"] for h in seen if h["region"] == "us") > 0, system  # the queue is exercised
