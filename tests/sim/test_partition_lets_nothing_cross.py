"""A partition in the simulator (``sim/faults.py``): the region is cut off from the others for the window --
its own clients are served by its own LB and replicas, nothing crosses (requests, forwards, replica reports,
heartbeats), a central system's cut-off side is served by its standby after the detection delay, and what
crossed when the cut began is lost and sent again."""

from __future__ import annotations

import pytest
from sim_recording import run_recording

from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.simulator import SimConfig, Simulator
from ray_geolb.sim.workloads.geo_diurnal import geo_diurnal

pytestmark = pytest.mark.timeout(120)

REPS = {"us": 2, "eu": 2, "asia": 2}
S, DUR, DETECT = 10.0, 10.0, 3.0
E = S + DUR


def _sim(system, region, trace=None, **dep):
    wl = geo_diurnal(day_s=24 * 10.0, seed=0, hours=[21, 24])
    faults = [{"kind": "partition", "region": region, "start_s": S, "duration_s": DUR, "detect_s": DETECT}]
    sim = Simulator(wl, deployment_for(system, REPS, profile="llama3.1-8b-h100", **dep),
                    SimConfig(duration_s=35.0, seed=0, drain=True, faults=faults), trace=trace)
    return run_recording(sim)


def _crosses(req, region):
    route = [req.region, req.entry.region, req.lb.region, req.replica.region]
    return any((a == region) != (b == region) for a, b in zip(route, route[1:]))


def test_nothing_crosses_a_partition_and_its_own_clients_stay_served():
    events = []

    def trace(kind, d):
        if kind == "forward":
            events.append((kind, d["t"], d["lb"], d["target"]))
        elif kind == "peers":
            events.append((kind, d["t"], d["lb"], {r: p[2] for r, p in d["peers"].items()}))

    sim, res, done = _sim("geoprefix", "eu", trace=trace)
    c = res.counters
    assert c["in_flight_at_end"] == 0 and c["requests_sent"] == c["requests_completed"] + c["requests_rejected"]
    for req in done:
        if _crosses(req, "eu"):  # over before the cut, or started after it healed
            assert req.t_fin + req.path <= S or req.t_disp >= E, req.rid
    fwd = [(t, lb, target) for kind, t, lb, target in events if kind == "forward" and S <= t < E]
    across = [t for t, lb, target in fwd if (lb == "eu") != (target == "eu")]
    stale = sim.settings.peer_stale_s + sim.settings.heartbeat_period_s + 0.5
    assert len(across) <= c["fault_call_failures"]  # forwards across the cut are tried, and every one fails ...
    assert all(t < S + stale for t in across)  # ... until the other side's heartbeat is stale
    assert len(fwd) > len(across)  # the other regions still forward among themselves
    eu_in = [r for r in done if r.region == "eu" and S <= r.t_send < E and "~" not in r.rid]
    assert eu_in and all(r.entry.region == "eu" and r.replica.region == "eu" for r in eu_in)
    assert c["fault_client_waits"] == 0  # every client still reaches its own LB
    ttft = sorted(r.t_first + r.path - r.t_send for r in eu_in)
    assert ttft[len(ttft) // 2] < 0.5  # served at home, not waiting
    # no heartbeat crossed: eu's peer tables stop (the registry is in us), the others' view of eu ages
    tables = [(t, lb, dates) for kind, t, lb, dates in events if kind == "peers" and S + 1 <= t < E]
    assert not [x for x in tables if x[1] == "eu"]
    assert tables and all(dates["eu"] < S for _, _, dates in tables)


def test_a_central_system_cut_off_from_its_lb_runs_its_standby_on_the_other_side():
    sim, res, done = _sim("ll", "us")  # the central LB's own region is cut off; the standby is in eu
    c = res.counters
    assert res.faults["standby_region"] == "eu"
    assert c["fault_lost"] > 0 and c["fault_client_waits"] > 0
    for req in done:
        if _crosses(req, "us"):
            assert req.t_fin + req.path <= S or req.t_disp >= E, req.rid
    us_in = [r for r in done if r.region == "us" and S <= r.t_send < E and "~" not in r.rid]
    assert us_in and all(r.entry.region == "us" and r.replica.region == "us" for r in us_in)
    others = [r for r in done if r.region != "us" and S + DETECT <= r.t_send < E]
    assert others and all(r.entry.name.startswith("standby") and r.replica.region != "us" for r in others)
    waited = [r for r in done if r.region != "us" and S <= r.t_send < S + DETECT and "~" not in r.rid]
    assert waited and all(r.t_disp >= S + DETECT for r in waited)


def test_a_central_system_whose_standby_is_on_the_far_side_serves_the_cut_region_with_nobody():
    sim, res, done = _sim("ll", "eu", standby_region="asia")
    eu_in = [r for r in done if r.region == "eu" and S <= r.t_send < E and "~" not in r.rid]
    assert eu_in and all(r.t_disp >= E for r in eu_in)  # eu's clients reach neither LB until the cut heals
    rest = [r for r in done if r.region != "eu" and S + DETECT <= r.t_send < E]
    assert rest and all(r.entry.region == "us" and r.replica.region != "eu" for r in rest)
