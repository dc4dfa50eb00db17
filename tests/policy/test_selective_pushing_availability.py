import pytest

from ray_geolb.policy.availability import LoadTracker, ReplicaStats


def stats(waiting=0, running=0, ts=0.0, **kw):
    return ReplicaStats(num_waiting=waiting, num_running=running, timestamp=ts, **kw)


def test_blind_pushing_is_always_available():
    t = LoadTracker("bp")
    t.set_targets(["a"])
    t.on_stats("a", stats(waiting=50))
    for i in range(10):
        t.on_dispatch("a", i, now=1.0)
    assert t.is_available("a") and t.outstanding("a") == 10


def test_sp_o_caps_outstanding_and_uncounts_on_completion():
    t = LoadTracker("sp-o", max_outstanding=2)
    t.set_targets(["a"])
    t.on_dispatch("a", "r1", 0.0)
    assert t.is_available("a")
    t.on_dispatch("a", "r2", 0.0)
    assert not t.is_available("a")
    t.on_stats("a", stats(ts=5.0))  # a refresh never resets in-flight accounting
    assert t.outstanding("a") == 2 and not t.is_available("a")
    assert t.on_complete("r1")
    assert t.is_available("a")
    assert not t.on_complete("r1")  # double completion is ignored
    assert t.outstanding("a") == 1


def test_sp_p_pending_rule():
    t = LoadTracker("sp-p", max_burst=4)
    t.set_targets(["a", "b"])
    t.on_stats("a", stats(waiting=1, running=10, ts=1.0, max_num_seqs=256))
    t.on_stats("b", stats(waiting=0, running=10, ts=1.0, max_num_seqs=256))
    assert t.available == {"b"}


def test_sp_p_does_not_herd_between_refreshes():
    """After a report says 'empty', only the estimated headroom may be sent before the next report."""
    t = LoadTracker("sp-p", max_burst=4)
    t.set_targets(["a"])
    t.on_stats("a", stats(waiting=0, running=254, ts=1.0, max_num_seqs=256))  # room for 2
    t.on_dispatch("a", "r1", 1.1)
    assert t.is_available("a")
    t.on_dispatch("a", "r2", 1.2)
    assert not t.is_available("a"), "a replica that was just sent work is no longer known to be empty"
    # A report measured *before* the dispatches still counts them as unseen.
    t.on_stats("a", stats(waiting=0, running=254, ts=1.15, max_num_seqs=256))
    assert t.unseen("a") == 1 and t.is_available("a")
    # A later report that saw both: room computed afresh.
    t.on_stats("a", stats(waiting=0, running=256, ts=2.0, max_num_seqs=256))
    assert not t.is_available("a")
    t.on_stats("a", stats(waiting=0, running=100, ts=3.0, max_num_seqs=256))
    assert t.is_available("a") and t.outstanding("a") == 2  # never reset by a refresh


def test_sp_p_unknown_capacity_gives_one_request_per_report():
    t = LoadTracker("sp-p", unknown_headroom=1)
    t.set_targets(["a"])
    assert t.is_available("a")  # never reported: one request to find out
    t.on_dispatch("a", "r1", 0.5)
    assert not t.is_available("a")
    t.on_stats("a", stats(waiting=0, running=1, ts=1.0))
    assert t.is_available("a")


def test_sp_p_completions_free_credits_after_waiting_drains():
    t = LoadTracker("sp-p")
    t.set_targets(["a"])
    for i in range(3):
        t.on_dispatch("a", i, 0.1)
    t.on_stats("a", stats(waiting=1, running=2, ts=1.0, max_num_seqs=2))
    assert not t.is_available("a")
    t.on_complete(0)  # frees a slot, but the waiting request takes it
    assert not t.is_available("a")
    t.on_complete(1)
    assert t.is_available("a")


def test_sp_p_kv_headroom():
    t = LoadTracker("sp-p", request_tokens=1000, max_burst=100)
    t.set_targets(["a"])
    t.on_stats("a", stats(ts=1.0, kv_cache_usage=0.99, num_gpu_blocks=1000, block_tokens=16))  # 160 tokens free
    assert not t.is_available("a")
    t.on_stats("a", stats(ts=2.0, kv_cache_usage=0.5, num_gpu_blocks=1000, block_tokens=16))  # 8000 free -> 8
    for i in range(7):
        t.on_dispatch("a", i, 2.5)
    assert t.is_available("a")
    t.on_dispatch("a", 7, 2.5)
    assert not t.is_available("a")


def test_stale_reports_are_ignored():
    t = LoadTracker("sp-p")
    t.set_targets(["a"])
    t.on_stats("a", stats(waiting=3, ts=5.0))
    t.on_stats("a", stats(waiting=0, ts=4.0))
    assert not t.is_available("a")


def test_stats_from_vllm_names_and_bad_values():
    s = ReplicaStats.from_dict({"num_waiting_reqs": 2, "num_running_reqs": 5, "kv_cache_usage": 0.3, "timestamp": 9})
    assert (s.num_waiting, s.num_running, s.kv_cache_usage, s.timestamp) == (2, 5, 0.3, 9.0)
    with pytest.raises(ValueError, match="negative"):
        ReplicaStats.from_dict({"num_waiting": -1})
    with pytest.raises(TypeError, match="dict"):
        ReplicaStats.from_dict([1])


@pytest.mark.parametrize("kw, name", [({"mode": "xx"}, "mode"), ({"max_outstanding": 0}, "max_outstanding"),
                                       ({"max_burst": 0}, "max_burst")])
def test_bad_tracker_config(kw, name):
    with pytest.raises(ValueError, match=name):
        LoadTracker(**kw)


def test_removed_target_leaves_no_state():
    t = LoadTracker("sp-o", max_outstanding=1)
    t.set_targets(["a", "b"])
    t.on_dispatch("a", "r1", 0.0)
    t.set_targets(["b"])
    assert t.available == {"b"} and t.outstanding("a") == 0
    assert not t.on_complete("r1")


def test_seen_margin_keeps_a_just_dispatched_request_unseen():
    """A report measured right after a dispatch may not include it yet (the request is still on the
    wire or in the API server): within ``seen_margin_s`` it stays unseen, so its slot is not granted
    twice. Without the margin the same report would count it as seen."""
    for margin, unseen, available in ((0.0, 0, True), (0.05, 1, False)):
        t = LoadTracker("sp-p", seen_margin_s=margin)
        t.set_targets(["a"])
        t.on_dispatch("a", "r1", now=1.00)
        # the engine has not admitted r1 yet: it reports 0 running of 1 slot, 10 ms after the dispatch
        t.on_stats("a", stats(waiting=0, running=0, ts=1.01, max_num_seqs=1))
        assert t.unseen("a") == unseen
        assert t.is_available("a") is available  # margin 0: r1's slot would be granted twice
    with pytest.raises(ValueError, match="seen_margin_s"):
        LoadTracker(seen_margin_s=-1)


# ---------------------------------------------------------------------------------------------- frozen reports
def frozen_tracker(bound=5.0):
    t = LoadTracker("sp-p", stale_report_s=bound)
    t.set_targets(["a"])
    return t


def test_a_frozen_waiting_report_is_distrusted_after_the_bound():
    """An idle engine that keeps sending the same "1 waiting" (fresh timestamps, unchanged figures)
    while this router has nothing in flight there: trusted for ``stale_report_s``, then ignored --
    one probe slot, no KV budget -- until a report with other figures arrives."""
    t = frozen_tracker(5.0)
    t.on_dispatch("a", "r1", 0.0)
    t.on_complete("r1", "a", now=1.0)  # the router's last request there left at t=1
    for ts in (1.0, 2.0, 4.0, 5.5):
        t.on_stats("a", stats(waiting=1, ts=ts, max_num_seqs=8))
        assert not t.is_available("a"), ts  # figures unchanged for < 5 s since t=1
    t.on_stats("a", stats(waiting=1, ts=6.5, max_num_seqs=8))
    assert t.is_available("a") and t.distrusted_reports == 1
    t.on_dispatch("a", "probe", 6.6)
    assert not t.is_available("a")  # one probe only (unknown_headroom = 1)
    t.on_stats("a", stats(waiting=0, running=1, ts=7.0, max_num_seqs=8))  # a real report: trusted again
    assert t.is_available("a") and t.distrusted_reports == 1


def test_a_waiting_report_is_trusted_while_this_router_has_requests_there():
    t = frozen_tracker(5.0)
    t.on_dispatch("a", "r1", 0.0)
    for ts in range(0, 30, 2):
        t.on_stats("a", stats(waiting=1, running=4, ts=float(ts), max_num_seqs=4))
        assert not t.is_available("a")
    assert t.distrusted_reports == 0


def test_changing_waiting_reports_are_trusted():
    """Another router's requests really wait there: the figures keep changing, so never distrusted."""
    t = frozen_tracker(5.0)
    for i, ts in enumerate(range(0, 30, 1)):
        t.on_stats("a", stats(waiting=1 + i % 2, running=4, ts=float(ts), max_num_seqs=4))
        assert not t.is_available("a")
    assert t.distrusted_reports == 0


def test_revalidate_catches_reports_that_stopped_changing_timestamps():
    """A source that stops reporting (or repeats the same timestamp, which the router de-duplicates)
    never calls on_stats again: the hold path's revalidate applies the same rule by the clock."""
    t = frozen_tracker(5.0)
    t.on_stats("a", stats(waiting=1, ts=10.0, max_num_seqs=8))
    assert t.revalidate(12.0) == 0 and not t.is_available("a")
    assert t.revalidate(15.5) == 1 and t.is_available("a")
    off = LoadTracker("sp-p", stale_report_s=None)
    off.set_targets(["a"])
    off.on_stats("a", stats(waiting=1, ts=10.0, max_num_seqs=8))
    assert off.revalidate(1e9) == 0 and not off.is_available("a")


@pytest.mark.parametrize("bad, needle", [
    ({"num_waiting": float("nan")}, "num_waiting"),
    ({"num_running": -1}, "num_running"),
    ({"num_waiting": 1.5}, "whole number"),
    ({"kv_cache_usage": float("nan")}, "kv_cache_usage"),
    ({"kv_cache_usage": 1.7}, "kv_cache_usage"),
    ({"timestamp": float("inf")}, "timestamp"),
    ({"timestamp": float("nan")}, "timestamp"),
    ({"timestamp": 1000.0 + 60}, "future"),
    ({"max_num_seqs": -4}, "max_num_seqs"),
])
def test_malformed_reports_are_rejected_naming_the_field(bad, needle):
    d = {"num_waiting": 0, "num_running": 1, "kv_cache_usage": 0.2, "timestamp": 999.0, **bad}
    with pytest.raises(ValueError, match=needle):
        ReplicaStats.from_dict(d, now=1000.0)


def test_a_report_within_the_clock_skew_allowance_is_accepted():
    rs = ReplicaStats.from_dict({"num_waiting": 0, "timestamp": 1001.5}, now=1000.0)
    assert rs.timestamp == 1001.5


@pytest.mark.parametrize("mode", ["sp-p", "sp-o", "bp", "sp-p by uncached share"])
def test_free_slots_is_the_sum_the_tracker_would_grant(mode):
    """free_slots() (what the Serve ingress admits to its router at once) is, after any sequence of
    reports, dispatches, completions and removals, exactly the requests the tracker would still
    accept one by one -- and a target is available exactly when it has a free slot."""
    import random

    rng = random.Random(7)
    weighted = mode == "sp-p by uncached share"
    mode = "sp-p" if weighted else mode
    t = LoadTracker(mode, max_outstanding=3, max_burst=6, request_tokens=100, slots_by_uncached_share=weighted)
    targets = ["a", "b", "c"]
    t.set_targets(targets)
    live, n = [], 0
    for step in range(600):
        op = rng.random()
        now = step * 0.01
        if op < 0.25:
            kv = rng.choice([None, 0.5, 0.99])
            t.on_stats(rng.choice(targets), stats(waiting=rng.choice([0, 0, 1]), running=rng.randint(0, 8), ts=now,
                                                  max_num_seqs=8, kv_cache_usage=kv,
                                                  num_gpu_blocks=None if kv is None else 40,
                                                  block_tokens=None if kv is None else 16))
        elif op < 0.6 and t.available:
            tgt = rng.choice(sorted(t.available))
            t.on_dispatch(tgt, n, now, tokens=rng.choice([0, 50, 300]), uncached=rng.choice([None, 0, 10, 60, 250]))
            live.append(n)
            n += 1
        elif op < 0.9 and live:
            t.on_complete(live.pop(rng.randrange(len(live))), now=now)
        elif op < 0.93:
            gone = rng.choice(targets)
            t.remove_target(gone)
            t.add_target(gone)
        per = {x: t._free(t._t[x]) for x in targets}
        assert t.free_slots() == sum(per.values())
        assert t.available == {x for x, f in per.items() if f > 0}
    # the count is what a router can really send: dispatch until nothing is available
    before, sent = t.free_slots(), 0
    while t.available and sent < 1000:
        t.on_dispatch(sorted(t.available)[0], f"x{sent}", 10.0)
        sent += 1
    assert mode == "bp" or sent == before


def test_the_unreported_work_cap_stops_grants_until_a_report_shows_the_prefill_ran():
    """SP-P's unreported-work cap (prefill_budget_reports): one report interval of prefill at the target's
    rate -- reports 0.5 s apart at 1,000 tokens/s: 500 tokens; only UNCACHED prompt tokens sent since the
    last report count."""
    t = LoadTracker(mode="sp-p", prefill_budget_reports=1.0)
    t.prefill_rate = lambda target: 1000.0
    t.set_targets(["a"])
    t.on_stats("a", ReplicaStats(max_num_seqs=64, timestamp=1.0))
    t.on_dispatch("a", "r0", 1.1, tokens=900)
    assert t.is_available("a")  # one report: the interval is not known yet, no cap
    t.on_stats("a", ReplicaStats(max_num_seqs=64, num_running=1, timestamp=1.5))
    t.on_dispatch("a", "r1", 1.6, tokens=5000, uncached=300)  # a long prompt, mostly cached there
    assert t.is_available("a")
    t.on_dispatch("a", "r2", 1.7, tokens=250, uncached=None)  # unknown: all of it counts
    assert not t.is_available("a") and t.prefill_capped >= 1
    t.on_complete("r2", "a", 1.8)  # left before any report saw it: its prefill leaves the count
    assert t.is_available("a")
    t.on_dispatch("a", "r3", 1.9, tokens=400)
    assert not t.is_available("a")
    t.on_stats("a", ReplicaStats(max_num_seqs=64, num_running=3, timestamp=2.0))  # a report shows they ran
    assert t.is_available("a")
    t.on_stats("a", ReplicaStats(max_num_seqs=64, num_running=3, timestamp=3.0))  # a 1 s interval: 1,000 tokens
    t.on_dispatch("a", "r4", 3.1, tokens=900)
    assert t.is_available("a")


def test_the_cap_is_off_by_default_or_without_a_rate_and_a_bad_budget_is_named():
    for t in (LoadTracker(mode="sp-p"), LoadTracker(mode="sp-p", prefill_budget_reports=1.0)):  # no rate
        t.set_targets(["a"])
        for ts in (1.0, 1.5):
            t.on_stats("a", ReplicaStats(max_num_seqs=64, timestamp=ts))
        for i in range(10):
            t.on_dispatch("a", f"r{i}", 1.6, tokens=1000)
        assert t.is_available("a")
    for bad in (0, -1.0, float("inf"), "2", True):
        with pytest.raises(ValueError, match="prefill_budget_reports"):
            LoadTracker(mode="sp-p", prefill_budget_reports=bad)


def test_a_cost_policy_counts_the_uncached_tokens_it_priced_at_its_fitted_rate():
    from ray_geolb.policy import RouteRequest, build_policy

    p = build_policy({"name": "geoprefix", "availability": {"prefill_budget_reports": 1.0},
                      "prefix": {"block_chars": 64, "growth": 0.0}}, targets=["a"])
    tp = p.ttft.t_p()  # the unfloored fit (the prior until the engines report step work)
    assert p.tracker.prefill_rate("a") == pytest.approx(1.0 / tp)
    for ts in (0.0, 0.2):
        p.on_stats("a", ReplicaStats(max_num_seqs=64, timestamp=ts))
    budget = 0.2 / tp  # one 0.2 s report interval of prefill
    shared = "s" * int(4 * budget)  # a prompt just over the budget
    first = RouteRequest("r0", shared + "one", prompt_tokens=int(budget) + 1)
    d = p.choose(first, 0.3)
    p.on_dispatch(first, d.target, 0.3)
    assert not p.tracker.is_available("a")
    p.on_stats("a", ReplicaStats(max_num_seqs=64, num_running=1, timestamp=0.4))
    second = RouteRequest("r1", shared + "two", prompt_tokens=int(budget) + 1)
    d = p.choose(second, 0.5)
    assert p.uncached_at(second, d.target) < 0.1 * budget  # the shared context is cached there
    p.on_dispatch(second, d.target, 0.5)
    assert p.tracker.is_available("a")


def test_a_pending_allowance_keeps_granting_while_a_few_requests_wait():
    """SkyLB's SP-P (allowance 0) holds every new request while a report shows anything waiting; with an
    allowance of k a report with <= k waiting still grants its slots less the waiting ones."""
    strict, allow = LoadTracker(mode="sp-p", max_burst=8), LoadTracker(mode="sp-p", max_burst=8, pending_allowance=3)
    for t in (strict, allow):
        t.set_targets(["a"])
        t.on_stats("a", ReplicaStats(num_waiting=2, num_running=10, max_num_seqs=64, timestamp=1.0))
    assert not strict.is_available("a")
    assert allow.is_available("a") and allow.free_slots() == 8 - 2
    allow.on_stats("a", ReplicaStats(num_waiting=4, num_running=10, max_num_seqs=64, timestamp=2.0))
    assert not allow.is_available("a")  # more waiting than allowed: SkyLB's rule again
    allow.on_stats("a", ReplicaStats(num_waiting=0, num_running=62, max_num_seqs=64, timestamp=3.0))
    assert allow.free_slots() == 2  # the engine's own limit still binds
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="pending_allowance"):
            LoadTracker(mode="sp-p", pending_allowance=bad)


# ---------------------------------------------------------------------------------------------- no slot twice
def test_a_completion_heard_of_just_after_a_report_that_left_it_out_frees_no_second_slot():
    """The engine finished ``x`` at 0.5 and the report measured at 0.6 already shows its slot free; the
    router hears of ``x``'s end 20 ms after that (Ray's completion notice and the report travel apart).
    Counting it as a completion the report had counted would grant that slot twice. A completion heard
    of later than ``seen_margin_s`` after the report frees its slot as before."""
    t = LoadTracker("sp-p", seen_margin_s=0.05)
    t.set_targets(["a"])
    t.on_stats("a", stats(running=1, ts=0.0, max_num_seqs=2))
    t.on_dispatch("a", "x", now=0.01)
    assert t.free_slots() == 0
    t.on_stats("a", stats(running=1, ts=0.6, max_num_seqs=2))  # x ran and ended before this was measured
    assert t.free_slots() == 1
    assert t.on_complete("x", now=0.62)
    assert t.free_slots() == 1  # was 2: one more than the engine's max_num_seqs allows
    t.on_dispatch("a", "y", now=0.7)
    t.on_stats("a", stats(running=2, ts=1.0, max_num_seqs=2))  # y runs
    assert t.free_slots() == 0
    assert t.on_complete("y", now=1.3)  # the report counted y: its end frees the slot
    assert t.free_slots() == 1


def test_a_reservation_released_before_it_was_sent_frees_no_slot_a_report_granted():
    """A reservation (``Policy.reserve``) made before a report was measured counts as seen by it, but it
    never reached the engine: the report's free slots do not include it. Releasing it (rejected,
    cancelled, sent elsewhere) must not add a freed slot on top of them."""
    from ray_geolb.policy.base import RouteRequest
    from ray_geolb.policy.factory import build_policy

    pol = build_policy("geoprefix", ["a"])
    pol.tracker.seen_margin_s = 0.05
    pol.on_stats("a", stats(running=0, ts=0.0, max_num_seqs=2))
    req = RouteRequest("r", "hello " * 40)
    pol.reserve(req, "a", now=0.1)
    pol.on_stats("a", stats(running=0, ts=0.5, max_num_seqs=2))  # the engine never got r: 2 free
    assert pol.tracker.free_slots() == 2
    assert pol.release("r", "a", now=0.8)
    assert pol.tracker.free_slots() == 2  # was 3, over the engine's 2 sequence slots


def test_a_reservation_sent_after_a_report_is_dated_when_it_was_sent():
    """Reserved at 0.1, then a report measured at 0.5 (the engine does not have it yet), then sent at
    0.55: that report cannot have seen it, so it takes one of the report's slots."""
    t = LoadTracker("sp-p", seen_margin_s=0.05)
    t.set_targets(["a"])
    t.on_stats("a", stats(running=0, ts=0.0, max_num_seqs=2))
    t.on_dispatch("a", "r", now=0.1)  # the reservation
    t.on_stats("a", stats(running=0, ts=0.5, max_num_seqs=2))
    assert t.free_slots() == 2 and t.unseen("a") == 0
    t.on_dispatch("a", "r", now=0.55)  # really sent
    assert t.unseen("a") == 1 and t.free_slots() == 1
    t.on_dispatch("a", "r", now=0.3)  # a repeated, older report of the dispatch changes nothing
    assert t.unseen("a") == 1 and t.free_slots() == 1
    assert t.on_complete("r", now=0.9)  # sent after the report: its slot comes back as an unseen one
    assert t.unseen("a") == 0 and t.free_slots() == 2


def test_slots_by_uncached_share_let_a_replica_take_its_cache_hits_at_a_peak():
    """slots_by_uncached_share: a request spends the share of its prompt the replica does not hold of a slot, at
    least a quarter. A report granting 4 slots takes 16 requests the replica mostly holds but only 4 new prompts,
    however short; one slot per request (the default) takes 4 of either."""
    def tracker(weighted):
        t = LoadTracker("sp-p", max_burst=4, request_tokens=1000, slots_by_uncached_share=weighted)
        t.set_targets(["a"])
        t.on_stats("a", stats(running=0, ts=0.0, max_num_seqs=64))
        return t

    for weighted, hits_taken in ((True, 16), (False, 4)):
        t = tracker(weighted)
        sent = 0
        while t.is_available("a"):
            t.on_dispatch("a", f"hit{sent}", 0.1, tokens=3000, uncached=100)  # 100 of 3,000 to prefill
            sent += 1
        assert sent == hits_taken and t.free_slots() == 0
    for kw in ({"tokens": 3000}, {"tokens": 50, "uncached": 50}):  # unknown: all of it; a short new prompt
        t = tracker(True)
        for i in range(4):
            assert t.is_available("a")
            t.on_dispatch("a", f"new{i}", 0.1, **kw)
        assert not t.is_available("a")
    t = tracker(True)
    t.on_dispatch("a", "half", 0.1, tokens=600, uncached=300)  # half a slot
    t.on_dispatch("a", "new", 0.1, tokens=9000, uncached=9000)  # one
    assert t.free_slots() == 3  # 2.5 slots left: a slot partly left still takes a request
    t.on_dispatch("a", "other", 0.1, tokens=9000)
    t.on_dispatch("a", "hit", 0.1, tokens=9000, uncached=0)  # a quarter: 1.25 left
    assert t.free_slots() == 2


def test_slots_by_uncached_share_give_back_what_each_request_spent():
    """A completion gives back the part it spent, and a report recounts the unseen ones: both land on the
    same figure, with nothing left over once every request has left."""
    t = LoadTracker("sp-p", max_burst=8, request_tokens=1000, slots_by_uncached_share=True)
    t.set_targets(["a"])
    t.on_stats("a", stats(running=0, ts=0.0, max_num_seqs=64))
    parts = {"r0": 100, "r1": 2100, "r2": 3000, "r3": 0, "r4": 990}  # of 3,000 tokens each
    for i, (rid, u) in enumerate(parts.items()):
        t.on_dispatch("a", rid, 0.1 + 0.01 * i, tokens=3000, uncached=u)
    spent = 0.25 + 0.7 + 1.0 + 0.25 + 0.33
    assert t._t["a"].unseen_slots == pytest.approx(spent)
    assert t.free_slots() == 6  # ceil(8 - 2.53)
    t.on_complete("r1", now=0.2)
    assert t._t["a"].unseen_slots == pytest.approx(spent - 0.7)
    t.on_stats("a", stats(running=4, ts=0.125, max_num_seqs=64))  # saw r0 and r2 (sent at 0.10, 0.12)
    assert t._t["a"].unseen_slots == pytest.approx(0.25 + 0.33)
    for rid in ("r0", "r2", "r3", "r4"):
        t.on_complete(rid, now=0.3)
    assert t._t["a"].unseen_slots == 0.0 and t.unseen("a") == 0


def test_geoprefix_spends_a_quarter_slot_on_a_prompt_its_replica_holds():
    """Through the policy: the share a cost policy priced as uncached at its pick is what the slot costs."""
    from ray_geolb.policy import RouteRequest, build_policy

    p = build_policy({"name": "geoprefix", "availability": {"slots_by_uncached_share": True, "max_burst": 2},
                      "prefix": {"block_chars": 64, "growth": 0.0}}, targets=["a"])
    assert p.tracker.slots_by_uncached_share
    p.on_stats("a", stats(running=0, ts=0.0, max_num_seqs=64))
    shared = "s" * 16_000  # ~4,000 tokens
    first = RouteRequest("r0", shared + "one")
    p.on_dispatch(first, p.choose(first, 0.1).target, 0.1)  # a miss: one of the two slots
    assert p.tracker.free_slots() == 1
    for i in range(3):  # the shared context is cached there: a quarter each
        req = RouteRequest(f"r{i + 1}", shared + f"turn {i}")
        d = p.choose(req, 0.2)
        assert d is not None and d.target == "a"
        p.on_dispatch(req, d.target, 0.2)
    assert p.tracker._t["a"].unseen_slots == pytest.approx(1.75)
    assert p.tracker.free_slots() == 1


def test_slots_by_uncached_share_never_send_an_engine_more_requests_than_its_free_sequences():
    """The share discounts a report's slots, never the engine's free sequence slots: with 4 of 64 free (60
    running), 4 hits fill it; a report without the engine's size keeps one request per slot."""
    t = LoadTracker("sp-p", max_burst=32, request_tokens=1000, slots_by_uncached_share=True)
    t.set_targets(["a", "b"])
    t.on_stats("a", stats(running=60, ts=0.0, max_num_seqs=64))
    t.on_stats("b", ReplicaStats(num_waiting=0, timestamp=0.0))  # no capacity fields: unknown_headroom, 1
    for name, room in (("a", 4), ("b", 1)):
        sent = 0
        while t.is_available(name) and sent < 100:
            t.on_dispatch(name, f"{name}{sent}", 0.1, tokens=3000, uncached=0)
            sent += 1
        assert sent == room
    t.on_complete("a0", now=0.2)  # sent after the report: its sequence slot comes back
    assert t.is_available("a") and t.free_slots() == 1


def _holder_pass_policy(share, **availability):
    from ray_geolb.policy import build_policy

    p = build_policy({"name": "geoprefix", "holder_pass_share": share,
                      "availability": {"pending_allowance": 0, **availability},
                      "prefix": {"block_chars": 64, "growth": 0.0}}, targets=["a", "b"])
    for t in ("a", "b"):
        p.on_stats(t, stats(running=0, ts=0.0, max_num_seqs=64))
    return p


def test_a_replica_without_a_slot_still_competes_for_a_prompt_it_holds_with_the_holder_pass():
    """holder_pass_share: a replica whose report granted nothing (here one request waiting, SkyLB's strict rule)
    still competes for a request it holds at least that share of, priced by its queue, and wins it over a
    replica that would prefill the whole prompt; without the pass the other replica takes it."""
    from ray_geolb.policy import RouteRequest

    shared = "s" * 16_000  # ~4,000 tokens
    for share, expect in ((None, "b"), (0.5, "a")):
        p = _holder_pass_policy(share)
        first = RouteRequest("r0", shared + "one")
        p.on_dispatch(first, p.choose(first, 0.1, candidates=["a"]).target, 0.1)
        for i in range(7):  # short prompts elsewhere: a request waiting at a is priced at the mean, ~590 tokens
            short = RouteRequest(f"short{i}", f"{i} " * 200)
            p.on_dispatch(short, p.choose(short, 0.1, candidates=["b"]).target, 0.1)
        p.on_stats("a", stats(waiting=1, running=0, ts=0.2, max_num_seqs=64))  # one waits: no slot at a
        assert not p.tracker.is_available("a") and p.tracker.is_available("b")
        turn = RouteRequest("r1", shared + "two")
        assert p.choose(turn, 0.3).target == expect, share


def test_the_holder_pass_needs_the_share_a_free_sequence_and_some_replica_with_a_slot():
    """The pass adds a holder only if it holds the share, has a sequence slot free at its report that the
    requests sent since left, and some replica still has a slot: it never starts a send the slots hold back."""
    from ray_geolb.policy import RouteRequest

    shared = "s" * 16_000
    p = _holder_pass_policy(0.5)
    first = RouteRequest("r0", shared)
    p.on_dispatch(first, p.choose(first, 0.1, candidates=["a"]).target, 0.1)
    p.on_stats("a", stats(waiting=1, running=0, ts=0.2, max_num_seqs=64))
    assert p.choose(RouteRequest("mostly-new", shared[:4_000] + "n" * 12_000), 0.3).target == "b"  # holds 1/4
    p.on_stats("a", stats(waiting=1, running=63, ts=0.25, max_num_seqs=64))  # every sequence slot taken
    assert p.choose(RouteRequest("full", shared + "x"), 0.3).target == "b"
    p.on_stats("a", stats(waiting=1, running=0, ts=0.3, max_num_seqs=64))
    p.on_stats("b", stats(waiting=1, running=0, ts=0.3, max_num_seqs=64))  # no slot anywhere
    assert p.choose(RouteRequest("held", shared + "y"), 0.35) is None


def test_the_holder_pass_and_the_region_gate_are_refused_together_naming_both():
    from ray_geolb.policy import build_policy

    with pytest.raises(ValueError, match="holder_pass_share and availability.gate='region'"):
        build_policy({"name": "geoprefix", "holder_pass_share": 0.5, "availability": {"gate": "region"}},
                     targets=["a"])
    for bad in (0.0, 1.5, "half"):
        with pytest.raises(ValueError, match="holder_pass_share"):
            build_policy({"name": "geoprefix", "holder_pass_share": bad}, targets=["a"])
