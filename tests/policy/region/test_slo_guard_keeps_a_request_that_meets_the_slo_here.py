"""The TTFT-SLO guard (``TwoLayerConfig.ttft_slo_s``, ``policy/region/slo_guard.py``): calibrated on the
realized TTFTs of requests that stayed, it keeps a request here before saturation when staying is
expected to meet the SLO and the forward the cost rule wants is not."""

import math

import pytest
from pydantic import ValidationError

from policy_cases import P, region, rq
from ray_geolb.policy import PeerState
from ray_geolb.policy.region import GEOPREFIX_COST, TwoLayerConfig
from ray_geolb.policy.region import slo_guard as G
from ray_geolb.policy.region.slo_guard import SloGuard


def _calibrate(g: SloGuard, estimate_s: float, ttft_s: float, n: int = G.MIN_SAMPLES, tag: str = "c") -> None:
    for i in range(n):
        g.note_stay(f"{tag}{i}", estimate_s)
        g.observe(f"{tag}{i}", ttft_s)


def test_an_uncalibrated_guard_says_nothing():
    g = SloGuard(0.5)
    assert g.predict(0.1) is None and not g.meets(0.1)
    assert g.meets_after(0.1, 10.0)  # unmeasured: the rule decides, the guard does not block a forward
    _calibrate(g, 0.1, 0.05, n=G.MIN_SAMPLES - 1)
    assert g.predict(0.1) is None  # one sample short


def test_a_measured_bin_is_read_by_its_tail_and_bins_above_it_are_scaled_up():
    g = SloGuard(0.5)
    _calibrate(g, 0.2, 0.1)  # stays estimated at 0.2 s met their first token in 0.1 s
    assert g.predict(0.2) == pytest.approx(0.1)
    assert g.meets(0.2) and g.meets(0.05)  # a smaller estimate is not expected to do worse
    lo = G._lower_edge(G._bin(0.2))
    assert g.predict(0.8) == pytest.approx(0.1 * 0.8 / lo)  # unmeasured above: scaled by estimate / edge
    assert g.predict(0.01) == pytest.approx(0.1)  # unmeasured below: no worse than the bin above
    assert g.meets(0.8) == (0.1 * 0.8 / lo <= 0.5)
    assert not g.meets(10.0)
    assert g.meets_after(0.2, 0.3) and not g.meets_after(0.2, 0.45)  # the forward pays the RTT first


def test_a_bin_whose_stays_missed_the_slo_does_not_keep_requests():
    g = SloGuard(0.3)
    _calibrate(g, 0.4, 0.6)
    assert g.predict(0.4) == pytest.approx(0.6) and not g.meets(0.4)
    _calibrate(g, 0.8, 0.2, tag="d")  # yet larger estimates met it: the smaller ones are taken to as well
    assert g.meets(0.4)


def test_a_region_already_missing_the_slo_keeps_nothing_more_here():
    g = SloGuard(0.5)
    _calibrate(g, 0.2, 0.1)
    for _ in range(G.MIN_SAMPLES):
        g.observe_region(0.3)  # its own requests, held time included, meet the SLO
    assert g.region_tail == pytest.approx(0.3) and g.meets(0.2)
    for _ in range(G.REGION_WINDOW):
        g.observe_region(0.9)  # now they miss it: the region is under pressure
    assert g.region_tail == pytest.approx(0.9) and not g.meets(0.2) and not g.meets(0.01)
    for bad in (math.nan, -1.0, None):
        g.observe_region(bad)
    assert len(g._region) == G.REGION_WINDOW


def test_unknown_ids_and_bad_ttfts_are_ignored_and_pending_estimates_are_bounded():
    g = SloGuard(0.5)
    g.observe("never-noted", 0.1)
    for bad in (math.nan, math.inf, -1.0, "0.1", None):
        g.note_stay("x", 0.2)
        g.observe("x", bad)
    assert all(len(w) == 0 for w in g._realized)
    for i in range(G.PENDING + 50):
        g.note_stay(f"p{i}", 0.2)
    assert len(g._pending) == G.PENDING  # a request cancelled before its first token leaves nothing behind
    g.observe("p0", 0.1)  # dropped as the oldest
    assert all(len(w) == 0 for w in g._realized)


@pytest.mark.parametrize("bad", [0, -0.5, math.inf, math.nan])
def test_a_bad_slo_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="ttft_slo_s"):
        SloGuard(bad)
    with pytest.raises(ValidationError, match="ttft_slo_s"):
        TwoLayerConfig(region="us", ttft_slo_s=bad)


def _router(slo):
    """A region with 40 requests in flight over its 2 replicas (64 slots each: both still available)."""
    r = region(remote="cost", cost=GEOPREFIX_COST, ttft_slo_s=slo)
    r.set_queue(0, 0)
    for k in range(40):
        r.on_dispatch(rq(1000 + k, "z"), r.local.targets[k % 2], 0.5)
    return r


def _decide_with_far_peer(r, i: int, rtt_s: float, now: float):
    """A 612-token request whose 2048-char prefix eu holds, with eu's RTT ``rtt_s``: the cost rule forwards
    it before saturation (staying prices its prefill's slowdown of the 40 requests in flight here)."""
    req = rq(i, P + "tail" * 100)
    r.snapshot.insert(req.prepared_for(r.snapshot), "eu", now)
    r.update_peer(PeerState("eu", 2, 0, now, rtt_s=rtt_s, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
    return r.decide(req, now)


def test_the_guard_keeps_a_request_here_only_when_its_forward_would_miss_and_staying_meets():
    off = _router(None)
    assert off.selector.slo_guard is None
    d = _decide_with_far_peer(off, 0, 0.48, 1.0)
    assert (d.kind, d.reason) == ("forward", "cost_before_saturation")  # the rule alone forwards it
    on = _router(0.5)
    guard = on.selector.slo_guard
    assert guard is not None and guard.slo_s == 0.5
    assert _decide_with_far_peer(on, 0, 0.45, 1.0).kind == "forward"  # uncalibrated: as without a guard
    own = on.selector.own_stay_s(on, rq(1, P + "tail" * 100), 1.0)
    for i in range(G.MIN_SAMPLES):  # requests with this estimate that stayed met their first token fast
        guard.note_stay(f"s{i}", own)
        on.observe_local_ttft(f"s{i}", 0.05)
    d = _decide_with_far_peer(on, 1, 0.48, 2.0)
    assert d.kind == "local" and guard.kept == 1  # 0.48 s of RTT + the peer's prefill misses 0.5 s; staying meets it
    assert "r1" in guard._pending  # its first token will calibrate the guard in turn
    on.observe_local_ttft("r1", 0.06, 0.01)
    assert "r1" not in guard._pending and guard._region[-1] == pytest.approx(0.07)  # TTFT since arrival
    d = _decide_with_far_peer(on, 2, 0.01, 3.0)
    assert (d.kind, d.reason) == ("forward", "cost_before_saturation")  # a near peer meets it: the rule decides


def test_the_guard_needs_forwarding_before_saturation_and_the_cost_selector():
    r = region(remote="cost", cost=GEOPREFIX_COST.model_copy(
        update={"forward_before_saturation": False}), ttft_slo_s=0.5)
    assert r.selector.slo_guard is None
    r = region(remote="prefix", ttft_slo_s=0.5)
    assert r.selector is None
    r.observe_local_ttft("r0", 0.1)  # a no-op without a guard
