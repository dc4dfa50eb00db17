"""The planner's answer is the fewest GPUs of ANY placement, for every system alike: on a small instance
(three regions peaking at different hours, a short day, at most 8 GPUs) an exhaustive search simulates
every placement with at least one replica per region and takes the smallest total that meets the SLO;
``plan`` must report that total, with a placement the exhaustive search saw meet (or, where none of up
to 8 GPUs meets, say that it found none)."""

import pytest

from ray_geolb.sim.goodput import SLO, slo_run
from ray_geolb.sim.plan import _base_run, _seeded, _worst, placements, plan
from ray_geolb.sim.workloads.geo_diurnal import Demand

SLO1 = SLO(1.0)
PROFILE = "llama3.1-8b-h100"
DAY_S = 12.0
SEEDS = (0,)
MAX_GPUS = 8
#: us, eu and asia, each busy for eight hours of the day: the greedy alone gives GeoPrefix 5 GPUs
#: (1 / 3 / 1), where 4 placed 2 / 1 / 1 meet the SLO; region-local needs more than 8
DEMAND = Demand({"us": [10.0] * 16 + [50.0] * 8,
                 "eu": [50.0] * 8 + [10.0] * 16,
                 "asia": [10.0] * 8 + [50.0] * 8 + [10.0] * 8}, "three peaks")


def test_placements_are_every_split_with_one_replica_per_region():
    got = placements(["a", "b", "c"], 5)
    assert len(got) == 6 and all(sum(p.values()) == 5 and min(p.values()) >= 1 for p in got)
    assert len({tuple(p.values()) for p in got}) == 6
    assert placements(["a", "b", "c"], 2) == []


def _exhaustive(system):
    """The smallest total of any placement that meets the SLO (None: none up to MAX_GPUS), and what
    each placement simulated did. Totals are tried in order and every placement of a total is
    simulated, so the search can stop after the first total that has one that meets: no larger total
    can be the minimum."""
    meets = {}
    for total in range(len(DEMAND.regions), MAX_GPUS + 1):
        for reps in placements(DEMAND.regions, total):
            run = _base_run("x", system, reps, DEMAND, DAY_S, 1.0, PROFILE, SLO1)
            meets[tuple(reps.values())] = _worst([slo_run(_seeded(run, s)) for s in SEEDS])["meets"]
        if any(v for k, v in meets.items() if sum(k) == total):
            return total, meets
    return None, meets


@pytest.mark.parametrize("system", ["geoprefix", "region-local", "ray-prefix", "sgl"])
def test_the_planner_finds_the_exhaustive_minimum(system):
    fewest, meets = _exhaustive(system)
    p = plan(DEMAND, SLO1, systems=[system], day_s=DAY_S, capacity=20.0, seeds=SEEDS, bounds=False,
             progress=False, max_replicas=MAX_GPUS, profile=PROFILE)
    (row,) = p["systems"]
    if fewest is None:  # no placement of up to MAX_GPUS meets: the planner says so
        assert not row["met"] and row.get("gpus") is None, row
        return
    assert row["met"] and row["gpus"] == fewest, (system, row["replicas"], fewest)
    assert meets[tuple(row["replicas"][r] for r in DEMAND.regions)]
