"""Where the lost requests' time went (sim/attribution.py): each completed request's TTFT
splits into LB wait, network, engine queue, prefill and the rest; a lost request is one over the SLO."""

from __future__ import annotations

import pytest

from ray_geolb.sim.attribution import PARTS, attribute, attribution_rows, merge
from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.goodput import SLO, slo_run, tail_s
from ray_geolb.sim.simulator import SimConfig, simulate
from ray_geolb.sim.workloads import by_name

DAY = 12.0


def _run(multiplier: float, system="geoprefix"):
    wl = by_name("geo-diurnal", curves={"us": [1.0] * 24, "eu": [0.2] * 24}, day_s=DAY, multiplier=multiplier)
    return simulate(wl, deployment_for(system, {"us": 1, "eu": 1}, profile="llama3.1-8b-h100"),
                    SimConfig(duration_s=DAY + 20.0, seed=0))


def test_the_parts_add_up_to_each_requests_ttft_and_lost_counts_the_misses():
    res = _run(60.0)  # overloaded: requests wait and some miss a 1 s SLO
    assert len(res.breakdown) == len(res.requests) > 0
    for rec, bd in zip(res.requests, res.breakdown):
        ttft, lb_wait = rec[1], rec[5]
        net, queued, prefill, uncached = bd
        assert min(net, queued, prefill, lb_wait) >= 0 and 0 <= uncached <= rec[3]
        assert lb_wait + net + queued + prefill <= ttft + 1e-9  # 'other' (overhead, retry back-off) >= 0
    a = attribute(res, 1.0, sent=len(res.requests) + 5)
    lost = [r for r in res.requests if r[1] > 1.0]
    assert a["lost"] == len(lost) > 0 and a["missed"] == 5 and a["completed"] == len(res.requests)
    assert sum(a["dominant"].values()) == a["lost"]
    total = sum(r[1] for r in lost)
    assert sum(a["lost_s"].values()) == pytest.approx(total)
    assert sum(a["all_s"].values()) == pytest.approx(sum(r[1] for r in res.requests))


def test_merge_sums_runs_and_the_table_has_one_row_per_part():
    a, b = attribute(_run(60.0), 1.0), attribute(_run(1.0), 1.0)
    m = merge([a, b])
    assert m["lost"] == a["lost"] + b["lost"] and m["completed"] == a["completed"] + b["completed"]
    assert m["lost_s"]["engine_queue"] == pytest.approx(a["lost_s"]["engine_queue"] + b["lost_s"]["engine_queue"])
    rows = attribution_rows({"x": m, "y": b})
    assert [r[0] for r in rows[1:1 + len(PARTS)]] == list(PARTS) and len(rows[0]) == 1 + 3 * 2


def test_slo_run_carries_the_attribution_and_a_run_without_breakdowns_is_refused():
    run = {"label": "a", "system": "region-local", "replicas": {"us": 1},
           "workload": {"name": "geo-diurnal", "kw": {"curves": {"us": [1.0] * 24}, "day_s": DAY}},
           "sim": {"duration_s": DAY + tail_s(SLO(1.0)), "seed": 0}, "deploy": {"profile": "llama3.1-8b-h100"},
           "slo": {"ttft_s": 1.0}}
    out = slo_run(run)
    assert out["attribution"]["completed"] == out["sent"] - out["missed"]
    res = _run(1.0)
    res.breakdown = res.breakdown[:-1]
    with pytest.raises(ValueError, match="breakdowns"):
        attribute(res, 1.0)
