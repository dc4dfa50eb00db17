"""``geo-workday-3``: ServeGen's working-day tenants' day in each region's time zone, so each region peaks at
its own hour and the regions' days barely overlap (``geo-diurnal-3``'s nearly flat day overlaps almost
wholly); its arrivals follow the curve and are the same for a seed."""

from __future__ import annotations

import pytest

from ray_geolb.sim.workloads.demand_data import curve_overlap, peak_window, workday_day_shape
from ray_geolb.sim.workloads.demand_stats import day_stats
from ray_geolb.sim.workloads.geo_diurnal import builtin_demand, geo_diurnal, load_demand, workday_demand

#: the stated bounds (measured: 0.53 us-eu, 0.28 us-asia, 0.38 eu-asia; geo-diurnal-3 0.85-0.88)
MAX_PAIR_OVERLAP = 0.6
MAX_MEAN_OVERLAP = 0.45


def _pairs(regions):
    return [(a, b) for i, a in enumerate(regions) for b in regions[i + 1:]]


def test_each_region_peaks_at_its_own_working_hours():
    d = load_demand("geo-workday-3")
    assert d.source == "geo-workday-3" and d.regions == ["us", "eu", "asia"]
    shape = workday_day_shape()
    local_peak = max(range(24), key=lambda h: shape[h])
    assert 9 <= local_peak <= 17  # a working day's peak (10:00 local)
    tz = d.meta["tz_offsets_h"]
    peaks = day_stats(d)["peak_utc_hour"]
    for r in d.regions:
        assert (peaks[r] + int(tz[r])) % 24 == local_peak
    for a, b in _pairs(d.regions):  # peaks at least 6 hours apart, round the clock
        gap = abs(peaks[a] - peaks[b]) % 24
        assert min(gap, 24 - gap) >= 6
    assert sum(d.total()) / 24 == pytest.approx(48.0)


def test_the_regions_days_barely_overlap_where_geo_diurnal_3s_overlap_wholly():
    d = workday_demand()
    s = day_stats(d)
    overlaps = [curve_overlap(d.rates[a], d.rates[b]) for a, b in _pairs(d.regions)]
    assert overlaps == list(s["overlap"].values())
    assert max(overlaps) < MAX_PAIR_OVERLAP and sum(overlaps) / 3 < MAX_MEAN_OVERLAP
    for r in d.regions:  # 9 peak hours each (>= half the peak), at most 3 of them shared with another region
        assert len(peak_window(d.rates[r])) <= 10
    assert max(s["shared_peak_hours"].values()) <= 3 and min(s["shared_peak_hours"].values()) == 0
    flat = builtin_demand()
    assert min(curve_overlap(flat.rates[a], flat.rates[b]) for a, b in _pairs(flat.regions)) > 0.8
    # the sum of the regional peaks over the peak of the sum (what pooling can gain): 1.37 against 1.10
    gain = sum(d.peak(r) for r in d.regions) / d.peak()
    assert gain > 1.3 and gain > sum(flat.peak(r) for r in flat.regions) / flat.peak() + 0.2


def test_curve_overlap_is_one_for_one_shape_and_zero_for_disjoint_days():
    assert curve_overlap([1.0] * 24, [2.0] * 24) == pytest.approx(1.0)
    assert curve_overlap([1.0] * 12 + [0.0] * 12, [0.0] * 12 + [5.0] * 12) == 0.0
    assert peak_window([0.0, 1.0, 0.5, 0.49] + [0.0] * 20) == [1, 2]


def test_its_arrivals_follow_the_curve_and_are_the_same_for_a_seed():
    d = load_demand("geo-workday-3", 6.0)
    assert sum(d.total()) / 24 == pytest.approx(6.0)
    a = geo_diurnal(**d.workload_kw(), day_s=24.0, seed=2)
    b = geo_diurnal(**d.workload_kw(), day_s=24.0, seed=2)
    c = geo_diurnal(**d.workload_kw(), day_s=24.0, seed=3)
    sig = [(t, p.program_id, p.calls[0].text) for t, p in a.open.arrivals]
    assert sig == [(t, p.program_id, p.calls[0].text) for t, p in b.open.arrivals]
    assert sig != [(t, p.program_id, p.calls[0].text) for t, p in c.open.arrivals]
    day = geo_diurnal(**workday_demand().workload_kw(), day_s=24.0, seed=2)
    for r in d.regions:  # each region's requests fall in its peak hours as its curve says (+-10 %)
        window = set(peak_window(d.rates[r]))
        ts = [t for t, p in day.open.arrivals if p.region == r]
        share = sum(int(t) in window for t in ts) / len(ts)  # day_s 24: one simulated second per hour
        expected = sum(d.rates[r][h] for h in window) / sum(d.rates[r])
        assert share == pytest.approx(expected, rel=0.1)
