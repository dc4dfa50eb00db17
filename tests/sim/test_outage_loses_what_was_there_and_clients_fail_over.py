"""A region outage in the simulator (``sim/faults.py``): the region's replicas and LB are down for the window,
what was in flight there is lost and sent again by its client, clients of a down LB fail over after the
detection delay (a central system to its standby), peers stop forwarding to the down region once its heartbeat
is stale, and every request still ends exactly once."""

from __future__ import annotations

import pytest
from sim_recording import run_recording

from ray_geolb.percentile import percentile
from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.metrics import dumps, summarize
from ray_geolb.sim.simulator import SimConfig, Simulator
from ray_geolb.sim.workloads.geo_diurnal import geo_diurnal

pytestmark = pytest.mark.timeout(120)

REPS = {"us": 2, "eu": 2, "asia": 2}
S, DUR, DETECT = 10.0, 10.0, 3.0  # the outage: [10, 20) s, noticed after 3 s
E = S + DUR


def _sim(system, region="eu", seed=0, drain=False, faults=None, trace=None):
    wl = geo_diurnal(day_s=24 * 10.0, seed=seed, hours=[21, 24])  # 30 s of eu's peak hours, ~50 req/s
    faults = [{"kind": "outage", "region": region, "start_s": S, "duration_s": DUR, "detect_s": DETECT}] \
        if faults is None else faults
    sim = Simulator(wl, deployment_for(system, REPS, profile="llama3.1-8b-h100"),
                    SimConfig(duration_s=35.0, seed=seed, drain=drain, faults=faults), trace=trace)
    return run_recording(sim)


def _touches(req, region):
    return region in (req.entry.region, req.lb.region, req.replica.region)


@pytest.mark.parametrize("system", ["geoprefix", "region-local", "ll"])
def test_nothing_is_served_in_a_down_region_and_every_request_ends_once(system):
    sim, res, done = _sim(system, drain=True)
    c = res.counters
    assert c["fault_lost"] > 0  # requests were running in eu when it went down
    assert c["in_flight_at_end"] == 0
    assert c["requests_sent"] == c["requests_completed"] + c["requests_rejected"]
    assert len(done) == c["requests_completed"] == len(res.requests)
    firsts = [req.rid.partition("~")[0] for req in done]
    assert len(set(firsts)) == len(firsts)  # no request answered twice
    assert sum(1 for req in done if "~" in req.rid) > 0  # lost attempts were sent again and answered
    for req in done:
        if _touches(req, "eu"):  # answered before eu went down, or reached eu after it was back
            assert req.t_fin + req.path <= S or req.t_disp >= E, (req.rid, req.t_disp, req.t_fin)
        assert req.t_first is not None and req.t_send <= req.t_disp


def test_clients_of_a_down_region_wait_for_the_failover_then_pay_the_nearest_region_rtt():
    sim, res, done = _sim("region-local")
    c = res.counters
    assert c["fault_client_waits"] > 0 and c["fault_failed_over"] > 0
    eu_in = [r for r in done if r.region == "eu" and S <= r.t_send < E]
    waited = [r for r in eu_in if r.t_send < S + DETECT and "~" not in r.rid]
    moved = [r for r in eu_in if r.t_send >= S + DETECT]
    assert waited and moved
    for r in waited:  # no LB to reach until the failover
        assert r.t_disp >= S + DETECT
    rtt = sim.net.rtt_s("eu", "us")
    for r in moved:  # to us, the nearest region with an LB, paying its round trip
        assert r.entry.region == "us"
        assert r.t_first + r.path - r.t_send >= rtt - 1e-9
    back = [r for r in done if r.region == "eu" and r.t_send >= E + DETECT + 1]
    assert back and all(r.entry.region == "eu" for r in back)  # failback after the same delay


def test_a_central_lb_down_is_replaced_by_its_standby_after_the_detection_delay():
    sim, res, done = _sim("ll", region="us")
    fr = res.faults
    assert fr["standby_region"] == "eu"  # the region nearest the central LB's
    standby = [r for r in done if r.entry.name.startswith("standby")]
    assert standby and min(r.t_lb for r in standby) >= S + DETECT
    assert all(r.replica.region != "us" for r in standby if r.t_disp < E + DETECT)
    for r in done:
        if r.entry.region == "us":  # the primary: before it went down, or after the failback
            assert r.t_fin + r.path <= S or r.t_lb >= E + DETECT
        if S <= r.t_send < S + DETECT:  # nobody could reach an LB until the standby took over
            assert r.t_disp >= S + DETECT
    late = [r.t_first + r.path - r.t_send for r in done if S + DETECT + 3 <= r.t_send < E]
    assert late and percentile(late, (50,))[0] < 1.0  # it recovered behind the standby
    assert res.counters["fault_client_waits"] > 0 and res.counters["fault_lost"] > 0


def test_peers_stop_forwarding_to_a_down_region_once_its_heartbeat_is_stale():
    forwards, tables = [], []

    def trace(kind, d):
        if kind == "forward":
            forwards.append((d["t"], d["target"]))
        elif kind == "peers" and "eu" in d["peers"]:
            tables.append((d["t"], d["peers"]["eu"][2]))  # when a peer table arrived, eu's figures' date

    sim, res, _ = _sim("geoprefix", trace=trace)
    stale = sim.settings.peer_stale_s + sim.settings.heartbeat_period_s + 0.5
    assert forwards  # GeoPrefix forwards at this load
    assert not [t for t, target in forwards if target == "eu" and S + stale <= t < E]
    during = [ts for t, ts in tables if S + 1 <= t < E]
    after = [ts for t, ts in tables if t >= E + 2]
    assert during and max(during) < S  # the registry kept eu's last figures; the peers saw them age
    assert after and max(after) >= E  # eu heartbeats again once it is back


def test_the_fault_report_and_determinism():
    _, a, _ = _sim("geoprefix", seed=1)
    _, b, _ = _sim("geoprefix", seed=1)
    ja, jb = dumps(summarize(a)), dumps(summarize(b))
    assert ja == jb
    m = summarize(a)
    rep = m["faults"]
    w = rep["windows"][0]
    assert (w["kind"], w["region"], w["start_s"], w["duration_s"], w["detect_s"]) == ("outage", "eu", S, DUR, DETECT)
    assert w["all"]["sent"] == w["detecting"]["sent"] + w["after_detect"]["sent"] > 0
    assert 0 < w["region_clients"]["sent"] < w["all"]["sent"]
    for part in ("all", "detecting", "after_detect", "region_clients"):
        for slo in ("0.3", "0.5", "1", "2"):
            att = w[part]["by_slo"][slo]["attainment"]
            assert 0.0 <= att <= 1.0
        assert w[part]["by_slo"]["0.3"]["attainment"] <= w[part]["by_slo"]["2"]["attainment"]
    # eu's own clients lose the detection time: worse than the others' inside the window
    assert w["region_clients"]["by_slo"]["1"]["attainment"] < w["all"]["by_slo"]["1"]["attainment"]
    assert rep["run"]["sent"] == m["counters"]["requests_sent"]
    assert m["config"]["faults"] == [{"kind": "outage", "region": "eu", "start_s": S, "duration_s": DUR,
                                      "detect_s": DETECT}]
    _, c, _ = _sim("geoprefix", seed=1, faults=[])  # the same hours without the fault: no fault figures
    assert "faults" not in summarize(c) and c.faults is None


CONNECT = 0.5  # a client's connect failover: the next LB 0.5 s after its first failed send


def _outage(region, connect=CONNECT):
    return [{"kind": "outage", "region": region, "start_s": S, "duration_s": DUR, "detect_s": DETECT,
             "connect_failover_s": connect}]


@pytest.mark.parametrize("system,region,to", [("region-local", "eu", "us"), ("geoprefix", "eu", "us"),
                                              ("ll", "us", "eu")])
def test_a_client_that_fails_over_on_a_failed_connect_does_not_wait_for_the_health_check(system, region, to):
    sim, res, done = _sim(system, region=region, faults=_outage(region), drain=True)
    c = res.counters
    assert c["fault_connect_failovers"] > 0 and c["fault_client_waits"] > 0
    assert c["in_flight_at_end"] == 0
    assert c["requests_sent"] == c["requests_completed"] + c["requests_rejected"]
    firsts = [req.rid.partition("~")[0] for req in done]
    assert len(set(firsts)) == len(firsts)  # still no request answered twice
    clients = [r for r in done if r.region == region and S <= r.t_send < S + DETECT and "~" not in r.rid]
    assert clients
    for r in clients:  # every one reached a live LB well before the health check's failover
        assert r.entry.region == to or r.entry.name.startswith("standby")
        assert r.t_lb < S + DETECT
        if r.t_send < S + CONNECT:  # the first failed send was at S or later: these waited for the failover
            assert r.t_lb >= S + CONNECT
    # and served sooner than the same clients are with only the health check
    _, _, done0 = _sim(system, region=region)
    late = [r.t_first + r.path - r.t_send for r in clients]
    late0 = [r.t_first + r.path - r.t_send for r in done0
             if r.region == region and S <= r.t_send < S + DETECT and "~" not in r.rid]
    assert percentile(late, (50,))[0] < percentile(late0, (50,))[0] - 1.0


def test_a_connect_failover_in_the_config_round_trips_and_without_it_a_run_is_unchanged():
    _, a, _ = _sim("geoprefix", seed=1, faults=_outage("eu"))
    assert summarize(a)["config"]["faults"][0]["connect_failover_s"] == CONNECT
    _, b, _ = _sim("geoprefix", seed=1, faults=_outage("eu", None))
    _, c, _ = _sim("geoprefix", seed=1)
    assert dumps(summarize(b)) == dumps(summarize(c))  # None is the default: the health check alone
    assert "fault_connect_failovers" not in c.counters
