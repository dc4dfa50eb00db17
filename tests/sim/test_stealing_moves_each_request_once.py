"""Cross-region work stealing in the simulator (sim/region_lb.py on policy/region/steal.py): an idle region
pulls held requests from an overloaded one; every request is served exactly once and the exchange's
counters return to idle."""

from __future__ import annotations

from ray_geolb.policy.region import GEOPREFIX_COST
from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.simulator import SimConfig, Simulator
from ray_geolb.sim.workloads import tot

# every client in us, one replica there; eu and asia idle. GeoPrefix forwards before saturation, so its
# queues rarely form (RESULTS section 16); here it forwards only at saturation and grants a replica at most
# two requests per report, so us holds requests and the idle regions have something to steal
CLIENTS = {"us": 48, "eu": 0, "asia": 0}
REPS = {"us": 1, "eu": 1, "asia": 1}
TIGHT = {"name": "geoprefix", "availability": {"max_burst": 2}}
HOLDS = {"remote": "cost",
         "cost": {**GEOPREFIX_COST.model_dump(exclude_unset=True), "forward_before_saturation": False}}


def _run(steal: bool, seed=0):
    two = {**HOLDS, "steal": {"enabled": steal}}
    sim = Simulator(tot(2, clients=CLIENTS, seed=seed), deployment_for(TIGHT, REPS, two_layer=two),
                    SimConfig(duration_s=12.0, seed=seed, drain=True))
    return sim, sim.run()


def test_idle_regions_steal_and_every_request_is_served_once():
    sim, res = _run(True)
    c = res.counters
    assert c["steal_offers"] > 0 and c["steals_taken"] > 0
    assert c["steals_handed"] == c["steals_taken"] + c.get("steals_refused", 0)
    assert c["in_flight_at_end"] == 0 and c["requests_sent"] == c["requests_completed"] + c["requests_rejected"]
    # exactly once: one engine finish per completed request, and a stolen request finished in its thief's region
    assert sum(rep.engine._num_finished for rep in sim.replicas.values()) == c["requests_completed"]
    assert len(res.requests) == c["requests_completed"]
    served_away = sum(1 for r in res.requests if r[8].split("-")[0] != "us")
    assert served_away >= c["steals_taken"]
    # idle again: nothing handed over and unsettled, no offer slot held past its life, every queue empty
    for lb in sim.lbs.values():
        assert lb.router.victim.outstanding() == 0
        assert len(lb.queue) == 0
        assert lb.policy.tracker.total_outstanding() == 0


def test_stealing_off_moves_nothing():
    sim, res = _run(False)
    assert res.counters["lb_holds"] > 0 and not any(k.startswith("steal") for k in res.counters)
    assert all(lb.router.thief is None for lb in sim.lbs.values())
