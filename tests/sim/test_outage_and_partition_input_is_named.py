"""A run's faults are checked on entry and a bad one is named (``faults[i].field``), before anything is
simulated; ``peak_fault_run`` puts a region's outage on its peak hour."""

from __future__ import annotations

import pytest

from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.faults import Fault, FaultError, check_faults, peak_fault_run, peak_hour
from ray_geolb.sim.run_spec import RunSpec
from ray_geolb.sim.scenarios import run_one
from ray_geolb.sim.simulator import SimConfig
from ray_geolb.sim.workloads.geo_diurnal import load_demand

pytestmark = pytest.mark.timeout(60)


def _run(faults, duration=10.0, **deploy):
    return {"label": "f", "system": "ll", "replicas": {"us": 1, "eu": 1},
            "workload": {"name": "conversation:wildchat", "kw": {"clients": {"us": 2, "eu": 2}, "seed": 0}},
            "sim": {"duration_s": duration, "seed": 0, "faults": faults}, "deploy": deploy}


def _f(**over):
    return {"kind": "outage", "region": "eu", "start_s": 2.0, "duration_s": 3.0, **over}


@pytest.mark.parametrize("faults, message", [
    ([_f(region="mars")], r"faults\[0\]\.region: unknown region 'mars'; the network's regions: us, eu, asia"),
    ([_f(start_s=8.0)], r"faults\[0\]: its window \[8, 11\) s is outside the run \[0, 10\) s"),
    ([_f(duration_s=-1)], r"faults\[0\]\.duration_s must be a finite number > 0, got -1"),
    ([_f(duration_s=0)], r"faults\[0\]\.duration_s must be a finite number > 0"),
    ([_f(start_s=-1)], r"faults\[0\]\.start_s must be a finite number >= 0"),
    ([_f(detect_s=float("nan"))], r"faults\[0\]\.detect_s must be a finite number"),
    ([_f(connect_failover_s=-0.5)], r"faults\[0\]\.connect_failover_s must be a finite number >= 0, got -0.5"),
    ([_f(connect_failover_s="1s")], r"faults\[0\]\.connect_failover_s must be a finite number"),
    ([_f(kind="flood")], r"faults\[0\]\.kind must be one of \['outage', 'partition'\], got 'flood'"),
    ([_f(), _f(kind="partition", start_s=4.0)], r"faults\[0\] and faults\[1\] overlap on region 'eu'"),
    ([_f(), _f(when=3)], r"faults\[1\]: unknown field\(s\) \['when'\]"),
    ([{"kind": "outage", "region": "eu"}], r"faults\[0\]: missing \['start_s', 'duration_s'\]"),
    ({"kind": "outage"}, r"sim\.faults"),
])
def test_a_bad_fault_is_named_before_anything_is_simulated(faults, message):
    with pytest.raises(ValueError, match=message):
        run_one(_run(faults))


def test_good_faults_pass_and_round_trip():
    run = _run([_f(), _f(region="us", kind="partition", start_s=4.0), _f(start_s=5.0)])
    spec = RunSpec.model_validate(run)
    assert spec.sim.faults == (Fault("outage", "eu", 2.0, 3.0), Fault("partition", "us", 4.0, 3.0),
                               Fault("outage", "eu", 5.0, 3.0))  # back to back on one region is fine
    assert spec.sim.faults[0].detect_s == 10.0
    assert check_faults([f.to_dict() for f in spec.sim.faults]) == spec.sim.faults
    assert SimConfig(duration_s=10.0).faults == ()
    with pytest.raises(FaultError, match="outside the run"):
        SimConfig(duration_s=4.0, faults=[_f()])


def test_the_standby_region_is_checked():
    with pytest.raises(ValueError, match="standby_region 'us' must be a region of the network"):
        deployment_for("ll", {"us": 1, "eu": 1}, standby_region="us")
    with pytest.raises(ValueError, match="standby_region applies to a central LB only"):
        deployment_for("geoprefix", {"us": 1, "eu": 1}, standby_region="eu")
    assert deployment_for("ll", {"us": 1, "eu": 1}).standby() == "eu"
    assert deployment_for("ll", {"us": 1, "eu": 1, "asia": 1}, standby_region="asia").standby() == "asia"
    assert deployment_for("geoprefix", {"us": 1, "eu": 1}).standby() is None


def test_a_peak_fault_run_puts_the_outage_on_the_region_peak_hour():
    demand = load_demand("geo-diurnal-3")
    assert peak_hour(demand.rates, "eu") == 22 and peak_hour(demand.rates, "us") == 4
    run = {"label": "g", "system": "geoprefix", "replicas": {"us": 2, "eu": 2, "asia": 2},
           "workload": {"name": "geo-diurnal", "kw": {**demand.workload_kw(), "day_s": 144.0, "seed": 0}},
           "sim": {"duration_s": 164.0, "seed": 0}, "deploy": {"profile": "llama3.1-8b-h100"}}
    r = peak_fault_run(run, "eu", "partition", hour_s=30.0, detect_s=5.0, tail_s=10.0)
    assert r["workload"]["kw"]["hours"] == [21, 24] and r["workload"]["kw"]["day_s"] == 720.0
    assert r["sim"]["duration_s"] == 100.0
    assert r["sim"]["faults"] == [{"kind": "partition", "region": "eu", "start_s": 30.0, "duration_s": 30.0,
                                   "detect_s": 5.0}]
    assert "faults" not in run["sim"] and run["workload"]["kw"]["day_s"] == 144.0  # a copy
    RunSpec.model_validate(r)
    assert peak_fault_run(run, "us")["workload"]["kw"]["hours"] == [3, 6]
    with pytest.raises(FaultError, match="no demand curve for region 'mars'"):
        peak_fault_run(run, "mars")
