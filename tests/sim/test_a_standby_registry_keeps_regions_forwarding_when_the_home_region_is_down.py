"""Standby registries (``RegionLayerSettings.registry_standbys``) in the simulator: each LB sends each
heartbeat to the primary registry (in the home region, us) and to every standby, and applies every table
that comes back, a peer's freshest state winning. With the primary's region down, the regions left keep
forwarding between themselves through the standby; with one registry they route locally until it is back.
No standby: byte-identical to before (the same events)."""

from __future__ import annotations

import pytest
from sim_recording import run_recording

from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.metrics import dumps, summarize
from ray_geolb.sim.simulator import SimConfig, Simulator, region_layer_config
from ray_geolb.sim.workloads.geo_diurnal import geo_diurnal

pytestmark = pytest.mark.timeout(120)

REPS = {"us": 2, "eu": 2, "asia": 2}
S, DUR, DETECT = 10.0, 10.0, 3.0  # us (the registry's region) down over [10, 20) s, noticed after 3 s
E = S + DUR


def _sim(standbys=None, faults=True, seed=0):
    wl = geo_diurnal(day_s=24 * 10.0, seed=seed, hours=[21, 24])  # eu's peak hours, ~50 req/s
    layer = {"registry_standbys": standbys} if standbys is not None else {}
    dep = deployment_for("geoprefix", REPS, profile="llama3.1-8b-h100", region_layer=layer)
    fl = [{"kind": "outage", "region": "us", "start_s": S, "duration_s": DUR, "detect_s": DETECT}] if faults else []
    forwards, tables = [], []

    def trace(kind, d):
        if kind == "forward":
            forwards.append((d["t"], d["lb"], d["target"]))
        elif kind == "peers":
            tables.append((d["t"], d["lb"]))

    sim = Simulator(wl, dep, SimConfig(duration_s=35.0, seed=seed, faults=fl), trace=trace)
    sim, res, done = run_recording(sim)
    return sim, res, done, forwards, tables


def _between_survivors(forwards, t0, t1):
    return [f for f in forwards if t0 <= f[0] < t1 and "us" not in (f[1], f[2])]


def test_with_a_standby_the_regions_left_keep_forwarding_through_the_home_regions_outage():
    sim1, res1, _, fw1, tab1 = _sim()
    sim2, res2, _, fw2, tab2 = _sim(["eu"])
    quiet = S + sim1.settings.peer_stale_s + sim1.settings.heartbeat_period_s + 0.5  # every table stale by then
    # one registry: none of eu's or asia's LBs gets a peer table while us is down, so none forwards
    assert not [t for t, lb in tab1 if S + 0.5 <= t < E]
    assert not _between_survivors(fw1, quiet, E)
    # with the standby in eu, both keep getting tables, and forward between themselves
    assert {lb for t, lb in tab2 if quiet <= t < E} == {"eu", "asia"}
    assert len(_between_survivors(fw2, quiet, E)) > 0
    # ... but never to the region that is down, once its heartbeat is stale
    assert not [f for f in fw2 if quiet <= f[0] < E and f[2] == "us"]
    # us is back: its heartbeats reach both registries again, and it gets tables
    assert [t for t, lb in tab2 if lb == "us" and t >= E + 1]
    for res in (res1, res2):
        c = res.counters
        assert c["requests_sent"] == c["requests_completed"] + c["requests_rejected"] + c["in_flight_at_end"]


def test_no_standby_is_the_one_registry_and_a_standby_is_reported():
    a = _sim(faults=False)
    b = _sim([], faults=False)
    assert dumps(summarize(a[1])) == dumps(summarize(b[1]))
    assert region_layer_config(a[0], "eu")["registry.standbys"] == []
    c = _sim(["asia"], faults=False)
    assert list(c[0].registries) == ["us", "asia"]
    assert region_layer_config(c[0], "eu")["registry.standbys"] == ["asia"]
    # both registries heard every region, and the LBs got tables from both
    for reg in c[0].registries.values():
        assert set(reg.table()["regions"]) == {"us", "eu", "asia"}


@pytest.mark.parametrize("bad, match", [(["mars"], "mars"), (["us"], "primary registry"), (["eu", "eu"], "twice")])
def test_a_standby_outside_the_network_or_on_the_primary_is_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        deployment_for("geoprefix", REPS, profile="llama3.1-8b-h100", region_layer={"registry_standbys": bad})
