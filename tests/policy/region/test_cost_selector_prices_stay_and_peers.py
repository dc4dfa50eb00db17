"""The region layer's 'cost' selector: GORGO's and GeoPrefix's price of staying (queue, in-flight work,
the wait for a local slot) against each available peer (RTT, residual prefill, remote queue)."""

import pytest

from policy_cases import FIXED, NEW, TP, P, fill, region, rq
from ray_geolb.policy import PeerState, ReplicaStats
from ray_geolb.policy.region import GEOPREFIX_COST, GORGO_COST, CostSelectorConfig, DrainRate, RttTable


@pytest.mark.parametrize("name", NEW)
def test_every_new_policy_runs_through_a_region_router(name):
    r = region(policy=name, remote="cost")
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.1))
    d = r.decide(rq(0, "hello " * 200), 1.0)
    assert d.kind == "local" and d.target in ("us-0", "us-1")
    r.on_dispatch(rq(0, "hello " * 200), d.target, 1.0)
    r.local.on_complete("r0", d.target, 1.5, ttft_s=0.3)
    assert r.local.tracker.outstanding(d.target) == 0


@pytest.mark.parametrize("preset, expect", [(GORGO_COST, "eu"), (GEOPREFIX_COST, "asia")])
def test_remote_queue_is_what_separates_gorgo_from_geoprefix(preset, expect):
    r = region(policy="gorgo" if preset is GORGO_COST else "geoprefix", remote="cost", cost=preset, tau=2)
    fill(r)
    r.set_queue(0, 0)
    # eu: near but its LB holds 2 requests of 40k tokens over 1 replica; asia: far, empty
    r.update_peer(PeerState("eu", 1, 2, 1.0, rtt_s=0.05, extra={"queued_tokens": 80_000, "replicas": 1}))
    r.update_peer(PeerState("asia", 2, 0, 1.0, rtt_s=0.2, extra={"queued_tokens": 0, "replicas": 2}))
    d = r.decide(rq(0, "q" * 4000), 1.0)
    assert d.kind == "forward" and d.target == expect and d.reason == "cost"
    costs = r.selector.last_costs
    assert costs["asia"] == pytest.approx(0.2 + TP * 1000)
    if preset is GORGO_COST:
        assert costs["eu"] == pytest.approx(0.05 + TP * 1000)  # the remote queue is left out
    else:
        assert costs["eu"] == pytest.approx(0.05 + TP * 1000 + TP * 80_000)


def test_cost_selector_holds_when_staying_is_cheaper_and_counts_the_local_queue():
    r = region(remote="cost", cost=GORGO_COST)
    for t in r.local.targets:  # both batches full under SP-P (no headroom), nothing waiting yet
        r.local.on_stats(t, ReplicaStats(num_waiting=0, num_running=64, max_num_seqs=64, timestamp=1.0))
    assert r.local.choose(rq(9, "x"), 1.0) is None
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.3))
    r.set_queue(1, 400)  # one request of 400 tokens held here, 2 replicas
    d = r.decide(rq(0, "q" * 4000), 1.0)
    assert d.kind == "hold" and d.reason == "stay_cheaper"
    assert r.selector.last_costs[None] == pytest.approx(TP * 1000 + TP * 400 / 2)
    r.set_queue(5, 2000)  # now: 1.0 + 1.0 > 0.3 + 1.0
    d = r.decide(rq(1, "q" * 4000), 1.0)
    assert d.kind == "forward" and d.target == "eu"


def test_geoprefix_remote_wait_staleness_and_forwards_since_heartbeat():
    r = region(remote="cost", cost=GEOPREFIX_COST.model_copy(update={"staleness_scale_s": 2.0}), tau=5)
    fill(r)
    r.update_peer(PeerState("eu", 1, 1, 1.0, rtt_s=0.1, extra={"queued_tokens": 1000, "replicas": 2}))
    req = rq(0, "q" * 4000)
    # age 1 s: factor 1 + 1/2; wait = t_p · 1000 · 1.5 / 2
    assert r.selector.remote_wait(r, req, "eu", 2.0) == pytest.approx(TP * 1000 * 1.5 / 2)
    r.on_forward(rq(1, "a" * 2000), "eu", 1.5)  # first forward since the heartbeat: took the free replica
    assert r.selector.remote_wait(r, req, "eu", 1.0) == pytest.approx(TP * 1000 / 2)
    r.on_forward(rq(2, "b" * 2000), "eu", 1.6)  # second one queues there: +500 tokens
    assert r.selector.remote_wait(r, req, "eu", 1.0) == pytest.approx(TP * 1500 / 2)
    r.update_peer(PeerState("eu", 1, 0, 2.0, extra={"queued_tokens": 0, "replicas": 2}))  # newer heartbeat resets
    assert r.selector.remote_wait(r, req, "eu", 2.0) == 0


def test_rtt_ewma_from_probes_overrides_heartbeat_rtt():
    r = region(remote="cost", cost=GORGO_COST)
    fill(r)
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.05))
    r.update_peer(PeerState("asia", 2, 0, 1.0, rtt_s=0.10))
    assert r.decide(rq(0, "q" * 400), 1.0).target == "eu"
    for s in (0.5, 0.5, 0.5):
        r.observe_rtt("eu", s)
    assert r.selector.rtt_of(r, "eu") == pytest.approx(0.5)
    assert r.decide(rq(1, "q" * 400), 1.0).target == "asia"
    t = RttTable(alpha=0.5)
    t.observe("x", 0.2)
    assert t.observe("x", 0.4) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="RTT"):
        t.observe("x", -1)


def test_snapshot_match_lowers_a_peers_cost():
    r = region(remote="cost", cost=GORGO_COST, snapshot=FIXED)
    fill(r)
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.10))
    r.update_peer(PeerState("asia", 2, 0, 1.0, rtt_s=0.15))
    r.on_forward(rq(0, P + "a" * 1952), "asia", 1.0)
    d = r.decide(rq(1, P + "b" * 1952), 1.1)  # asia: 0.15 + 0.488 < eu: 0.1 + 1.0
    assert d.kind == "forward" and d.target == "asia" and d.matched == 2048
    assert r.selector.last_costs["asia"] == pytest.approx(0.15 + TP * (1000 - 512))


def test_heartbeat_carries_queue_tokens_replicas_and_t_p():
    r = region(remote="cost")
    hb = r.heartbeat(3, 2.0, queued_tokens=1200)
    assert hb.queue_len == 3 and hb.extra == {"replicas": 2, "t_p_s": pytest.approx(TP), "inflight": 0,
                                              "queued_tokens": 1200.0}
    r.on_dispatch(rq(0, "x" * 400), "us-0", 2.1)
    assert r.heartbeat(3, 2.5).extra["inflight"] == 1  # requests in flight at this region's replicas
    plain = region(policy="skylb")  # SkyLB modes keep their heartbeat unchanged
    assert plain.heartbeat(0, 2.0).extra == {}


@pytest.mark.parametrize("w_shared, expect", [(0.0, "ca"), (1.0, "au")])
def test_peer_recompute_is_priced_for_the_requests_in_flight_there(w_shared, expect):
    r = region(remote="cost", cost=GEOPREFIX_COST.model_copy(update={"w_shared": w_shared}), snapshot=FIXED)
    fill(r)  # no local replica available
    r.update_peer(PeerState("ca", 2, 0, 1.0, rtt_s=0.02, extra={"replicas": 2, "inflight": 60}))  # near, 30/replica
    r.update_peer(PeerState("au", 2, 0, 1.0, rtt_s=0.2, extra={"replicas": 2, "inflight": 0}))  # far, idle
    req = rq(1, "q" * 4000)  # 1000 tokens, cached nowhere
    d = r.decide(req, 1.1)
    assert d.kind == "forward" and d.target == expect
    c = r.selector.last_costs
    # ca: 0.02 + 1.0 (+ 1.0 × 30 in flight per replica); au: 0.2 + 1.0
    assert c["ca"] == pytest.approx(0.02 + TP * 1000 * (1 + 30 * w_shared))
    assert c["au"] == pytest.approx(0.2 + TP * 1000)
    if w_shared:  # forwards since the heartbeat count as in flight there
        r.on_forward(req, "au", 1.2)
        assert r.selector.peer_inflight(r, "au") == pytest.approx(0.5)
    assert GORGO_COST.w_shared == 0.0  # GORGO's selector is unchanged


def four_in_flight_here(size: str, peer_inflight: int):
    """A full region (no local replica available) running 4 requests of 200 tokens (2 per replica; the mean prompt),
    with one peer 'ca' 20 ms away reporting ``peer_inflight`` over its 2 replicas; its in-flight term at ``size``."""
    cost = GEOPREFIX_COST.model_copy(update={"shared_size": size, "home_key_chars": None})
    r = region(remote="cost", cost=cost, snapshot=FIXED)
    fill(r)
    for i in range(4):
        r.on_dispatch(rq(f"l{i}", f"{i}" * 800), "us-0", 0.5)
    assert r.local.mean_prompt_tokens == pytest.approx(200)
    r.update_peer(PeerState("ca", 2, 0, 1.0, rtt_s=0.02, extra={"replicas": 2, "inflight": peer_inflight}))
    return r


@pytest.mark.parametrize("chars", [4000, 1600, 8000])
def test_length_neutral_in_flight_term_prices_a_prompt_past_the_mean_as_a_mean_one(chars):
    r = four_in_flight_here("at_most_mean", 60)  # 30 per replica at the peer
    mean = r.local.mean_prompt_tokens
    req = rq(1, "q" * chars)  # cached nowhere
    L = chars / 4
    r.decide(req, 1.1)
    c = r.selector.last_costs
    per_req = min(L, mean)  # the in-flight term counts a prompt past the mean as a mean-sized one, on every side
    assert c["ca"] == pytest.approx(0.02 + TP * L + TP * per_req * 30)
    wait = TP * r.selector.local_queue_tokens(r, req) / 2 + r.selector.last_slot_wait_s  # not scaled
    assert c[None] == pytest.approx(TP * L + wait + TP * per_req * 4 / 2)
    short = rq(2, "s" * 400)  # 100 tokens, under the mean: unscaled
    r.decide(short, 1.1)
    assert r.selector.last_costs["ca"] == pytest.approx(0.02 + TP * 100 * (1 + 30))
    off = four_in_flight_here("prompt", 60)
    assert off.selector.shared_scale(off, req) == 1.0


@pytest.mark.parametrize("chars", [4000, 400, 8000])
def test_mean_sized_in_flight_term_prices_every_prompt_as_a_mean_one_times_its_uncached_share(chars):
    r = four_in_flight_here("mean", 60)  # 30 per replica at the peer
    mean = r.local.mean_prompt_tokens
    req = rq(1, "q" * chars)  # cached nowhere: its uncached share is 1 on every side
    L = chars / 4
    r.decide(req, 1.1)
    c = r.selector.last_costs
    # short and long prompts alike: the in-flight term is a mean-sized prompt's, whatever this one's length
    assert c["ca"] == pytest.approx(0.02 + TP * L + TP * mean * 30)
    wait = TP * r.selector.local_queue_tokens(r, req) / 2 + r.selector.last_slot_wait_s  # not scaled
    assert c[None] == pytest.approx(TP * L + wait + TP * mean * 4 / 2)


def test_mean_sized_in_flight_term_keeps_a_cached_prompts_share_where_it_is_cached():
    r = four_in_flight_here("mean", 4)  # 2 per replica at the peer
    text = "h" * 4000
    r.on_dispatch(rq("held", text), "us-0", 0.6)  # this region holds the whole prompt
    req = rq(1, text)
    r.decide(req, 1.1)
    c = r.selector.last_costs
    mean = r.local.mean_prompt_tokens
    # the peer prices the whole prompt's share of the term; staying, where it is cached, next to none of it
    assert c["ca"] == pytest.approx(0.02 + TP * 1000 + TP * mean * 2)
    assert c[None] < c["ca"]


@pytest.mark.parametrize("chars", [400, 4000, 8000])
def test_at_least_mean_in_flight_term_prices_a_short_prompt_as_a_mean_one_and_a_long_one_as_itself(chars):
    r = four_in_flight_here("at_least_mean", 60)  # 30 per replica at the peer
    mean = r.local.mean_prompt_tokens
    req = rq(1, "q" * chars)  # 100, 1,000 or 2,000 tokens, cached nowhere
    L = chars / 4
    r.decide(req, 1.1)
    assert r.selector.last_costs["ca"] == pytest.approx(0.02 + TP * L + TP * max(L, mean) * 30)


def test_an_unknown_in_flight_size_is_refused_by_name():
    with pytest.raises(ValueError, match="shared_size"):
        CostSelectorConfig(shared_size="median")


def test_stay_cost_leaves_the_in_flight_term_out_when_peers_do_not_report_it():
    r = region(remote="cost", cost=GEOPREFIX_COST, snapshot=FIXED)
    fill(r)
    for i in range(4):
        r.on_dispatch(rq(f"l{i}", f"{i}" * 800), "us-0", 0.5)  # 4 requests in flight here
    req = rq(1, "q" * 4000)
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.1))  # a heartbeat without 'inflight' (e.g. an old peer)
    r.decide(req, 1.1)
    no_count = r.selector.last_costs[None]
    r.update_peer(PeerState("eu", 2, 0, 1.05, rtt_s=0.1, extra={"replicas": 2, "inflight": 0}))
    r.decide(req, 1.1)
    assert r.selector.last_costs[None] == pytest.approx(no_count + TP * 1000 * 4 / 2)


# ----------------------------------------------------------------------------- wait for a local slot
def test_drain_rate_window_min_samples_and_bounded_memory():
    d = DrainRate(window_s=10.0, min_samples=3)
    assert d.rate(0.0) is None
    d.observe(1.0)
    d.observe(2.0)
    assert d.rate(2.0) is None  # 2 < min_samples: unknown
    d.observe(5.0)
    assert d.rate(5.0) == pytest.approx(3 / 4.0)  # 3 completions since t=1
    assert d.rate(9.0) == pytest.approx(3 / 8.0)  # no completion since: the rate decays
    assert d.rate(11.5) is None and len(d) == 2  # t=1 left the window (trimmed on the query)
    d.observe(4.0)  # out of order: counted as the newest (5.0), timestamps stay sorted
    assert d.rate(12.0) == pytest.approx(3 / 10.0)
    d.observe(30.0)
    assert len(d) == 1  # an observe trims too
    small = DrainRate(window_s=100.0, min_samples=2, max_samples=4)
    for i in range(1000):
        small.observe(i * 0.01)
    assert len(small) == 4  # memory bounded; the rate is over the span of the kept samples
    assert small.rate(9.99) == pytest.approx(4 / 0.03)
    for kw, field in (({"window_s": 0}, "drain_window_s"), ({"window_s": float("nan")}, "drain_window_s"),
                      ({"min_samples": 1}, "drain_min_samples"), ({"min_samples": 5, "max_samples": 4}, "max_samples")):
        with pytest.raises(ValueError, match=field):
            DrainRate(**kw)
    with pytest.raises(ValueError, match="finite"):
        d.observe(float("nan"))


def _saturated(cost, **two):
    """Both local replicas unavailable (SP-P: something waiting), 3 requests ahead at this LB."""
    r = region(remote="cost", cost=cost, **two)
    fill(r)
    r.set_queue(3, 0.0)
    assert not r.local.tracker.available
    return r


def test_stay_cost_adds_the_slot_wait_when_no_local_replica_is_available():
    req = rq(0, "q" * 4000)
    on = _saturated(GEOPREFIX_COST.model_copy(update={"q_hat": 2.0}))
    off = _saturated(GEOPREFIX_COST.model_copy(update={"q_hat": 2.0, "stay_slot_wait": False}))
    base = off.selector.local_cost(off, req, 10.0)
    for t in (6.0, 7.0, 8.0):  # 3 completions < drain_min_samples = 4: rate unknown, no term
        on.on_local_complete(t)
        off.on_local_complete(t)
    assert on.selector.local_cost(on, req, 10.0) == pytest.approx(base) and on.selector.last_slot_wait_s == 0.0
    on.on_local_complete(9.0)  # 4 completions since t=6: 4 / (10 - 6) = 1 per second
    assert on.selector.drain.rate(10.0) == pytest.approx(1.0)
    assert on.selector.local_cost(on, req, 10.0) == pytest.approx(base + 2.0 * (3 + 1) / 1.0)
    assert on.selector.last_slot_wait_s == pytest.approx(4.0)
    on.set_queue(0, 0.0)  # the head of the queue: one slot's wait
    assert on.selector.local_cost(on, req, 10.0) == pytest.approx(base + 2.0 * 1 / 1.0)
    assert off.selector.local_cost(off, req, 10.0) == pytest.approx(base)  # off: never the term
    # a local replica is available: staying is not waiting for a slot, no term
    on.local.on_stats("us-0", ReplicaStats(max_num_seqs=64, timestamp=2.0))
    off.local.on_stats("us-0", ReplicaStats(max_num_seqs=64, timestamp=2.0))
    assert on.local.tracker.available
    assert on.selector.local_cost(on, req, 10.0) == pytest.approx(off.selector.local_cost(off, req, 10.0))
    assert on.selector.last_slot_wait_s == 0.0


def test_slot_wait_turns_a_hold_into_a_forward_in_geoprefix_only():
    """Saturated us, idle eu 100 ms away: by prefill work staying is cheaper (the forward pays the RTT);
    once us has measured that its slots free at 2/s, GeoPrefix forwards. GORGO's selector (no such
    term, as in the paper) keeps holding on the same inputs."""
    def run(cost):
        r = region(remote="cost", cost=cost, policy="gorgo" if cost is GORGO_COST else "geoprefix")
        for t in r.local.targets:  # both batches full under SP-P, nothing waiting in the engines
            r.local.on_stats(t, ReplicaStats(num_waiting=0, num_running=64, max_num_seqs=64, timestamp=1.0))
        r.set_queue(0, 0.0)
        r.update_peer(PeerState("eu", 2, 0, 9.9, rtt_s=0.1, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
        r.observe_rtt("eu", 0.1)
        first = r.decide(rq(0, "q" * 400), 10.0).kind
        for i in range(8):  # 8 completions in the last 4 s
            r.on_local_complete(10.0 + 0.5 * i)
        r.update_peer(PeerState("eu", 2, 0, 13.4, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
        return first, r.decide(rq(1, "q" * 400), 13.5), r
    first, d, r = run(GEOPREFIX_COST)
    assert first == "hold" and d.kind == "forward" and d.target == "eu", r.selector.last_costs
    assert r.selector.last_slot_wait_s == pytest.approx(3.5 / 8)
    first, d, r = run(GORGO_COST)
    assert first == "hold" and (d.kind, d.reason) == ("hold", "stay_cheaper"), r.selector.last_costs
    assert not GORGO_COST.stay_slot_wait and r.selector.last_slot_wait_s == 0.0


def test_on_local_complete_without_the_cost_selector_is_a_no_op():
    r = region(remote="prefix")
    assert r.selector is None
    r.on_local_complete(1.0)  # nothing to feed, nothing raised


@pytest.mark.parametrize("cap", [True, False])
def test_noted_forwards_cap_a_peer_only_where_the_cost_selector_does_not_price_them(cap):
    """``note_forward`` (what the Serve ingress and the simulator call after each forward) counts in the peer's
    queue either way; with ``forwards_cap_peers=False`` (GeoPrefix) it no longer makes the peer unavailable
    after tau + 1 forwards: the selector's own forwards-since-heartbeat term prices them instead, and that
    term still grows with every forward (no double counting, no blind herding)."""
    r = region(remote="cost", cost=GEOPREFIX_COST.model_copy(update={"forwards_cap_peers": cap}), tau=2)
    fill(r)
    r.set_queue(0, 0)
    r.update_peer(PeerState("eu", 1, 0, 1.0, rtt_s=0.1, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
    waits = []
    for i in range(4):  # tau + 2 forwards within one heartbeat period
        assert r.available_peers(1.1) == ["eu"], i
        req = rq(i, "f%d" % i * 1000)
        waits.append(r.selector.remote_wait(r, req, "eu", 1.0))
        r.on_forward(req, "eu", 1.1)
        r.note_forward("eu")
        if cap and i == 2:
            break
    assert r.peers["eu"].queue_len == r.peers["eu"].noted == len(waits)
    assert r.peers["eu"].reported_queue_len == 0
    assert r.available_peers(1.1) == ([] if cap else ["eu"])
    assert waits[1] == waits[0] and waits[2] > waits[1]  # the first forward took the free replica, then they queue
    if not cap:
        assert waits[3] > waits[2]
    r.update_peer(PeerState("eu", 1, 0, 2.0, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
    assert r.available_peers(2.1) == ["eu"] and r.peers["eu"].noted == 0


def test_geoprefix_prices_its_forwards_and_gorgo_lets_note_forward_cap_them():
    assert GEOPREFIX_COST.forwards_cap_peers is False
    assert GORGO_COST.forwards_cap_peers is True  # GORGO's cost has no remote queue term


def _before_saturation(**cost):
    r = region(remote="cost", cost=GEOPREFIX_COST.model_copy(update={
        "forward_before_saturation": True, "forward_margin_s": 0.25, "forward_hysteresis": 0.5, **cost}))
    r.set_queue(0, 0)
    req = rq(0, P + "tail" * 100)  # 2448 chars = 612 tokens; eu was sent the 2048-char prefix
    r.snapshot.insert(req.prepared_for(r.snapshot), "eu", 1.0)
    return r, req


def _at_saving(r, req, saving, now):
    """Give eu the RTT that makes forwarding ``saving`` seconds cheaper than staying, and decide."""
    r.update_peer(PeerState("eu", 2, 0, now, rtt_s=0.0, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
    stay, costs, _raw, _hits = r.selector.costs_before_saturation(r, req, ["eu"], now)  # at RTT 0, no state change
    r.update_peer(PeerState("eu", 2, 0, now + 1e-6, rtt_s=stay - costs["eu"] - saving,
                            extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
    return r.decide(req, now + 1e-6)


def test_layer1_forwards_before_saturation_only_past_the_margin_with_hysteresis():
    r, req = _before_saturation()
    assert r.local.tracker.available  # a local replica is free: SkyLB's layer 1 would stay
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.0, extra={"queued_tokens": 0, "replicas": 2, "inflight": 0}))
    stay, costs, _raw, hits = r.selector.costs_before_saturation(r, req, ["eu"], 1.0)
    assert stay - costs["eu"] > 0.4 and hits["eu"] > 0, (stay, costs)  # eu's match is worth > 0.4 s at RTT 0
    steps = [(0.2, "local"), (0.4, "forward"), (0.2, "forward"), (0.05, "local"), (0.2, "local"), (0.3, "forward")]
    got = [_at_saving(r, req, s, 2.0 + i).kind for i, (s, _k) in enumerate(steps)]
    assert got == [k for _s, k in steps]  # enter above 0.25, stay engaged above 0.125, release below
    d = _at_saving(r, req, 0.4, 10.0)
    assert (d.kind, d.target, d.reason) == ("forward", "eu", "cost_before_saturation") and d.matched > 0


def test_before_saturation_ties_stay_local_and_the_flag_and_hop_limit_are_respected():
    r, req = _before_saturation(forward_margin_s=0.0)
    assert _at_saving(r, req, 0.0, 2.0).kind == "local"  # a tie stays local even with no margin
    assert _at_saving(r, req, 0.05, 3.0).kind == "forward"
    off, req2 = _before_saturation()
    off.selector.config = off.selector.config.model_copy(update={"forward_before_saturation": False})
    assert _at_saving(off, req2, 0.5, 2.0).kind == "local"  # off (the selector's default): SkyLB's layer 1
    assert CostSelectorConfig().forward_before_saturation is False
    assert GEOPREFIX_COST.forward_before_saturation is True  # GeoPrefix's preset: on
    assert GORGO_COST.forward_before_saturation is False  # GORGO as published
    r, req = _before_saturation()
    req.hops = 1  # already forwarded once: never again
    assert _at_saving(r, req, 0.5, 2.0).kind == "local"
    r, req = _before_saturation()
    req.allowed_regions = frozenset({"us"})  # residency: eu is not a candidate
    assert _at_saving(r, req, 0.5, 2.0).kind == "local"
