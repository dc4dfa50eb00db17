"""Several routers over the same replicas (a region's ingress replicas, ``LoadTracker.set_share``) each take a
share of every report's free slots. A share alone can grant one engine slot twice: a router may already have
spent more than its new share, under the report before, by the time the new one reaches it; its excess is
invisible to its siblings, who grant their whole share. So each router is also held to its fixed part of the
engine's sequence slots (its quota): together the routers never have more requests at an engine than it has
slots, however late or unevenly the reports reach them."""

import heapq
import random

import pytest

from ray_geolb.policy.availability import LoadTracker, ReplicaStats

MARGIN = 0.05


def pair(n=2, **kw):
    out = []
    for rank in range(n):
        t = LoadTracker("sp-p", seen_margin_s=MARGIN, pending_allowance=8, **kw)
        t.set_share(rank, n)
        t.set_targets(["e"])
        out.append(t)
    return out


def report(running, ts, seqs=8, waiting=0):
    return ReplicaStats(num_waiting=waiting, num_running=running, max_num_seqs=seqs, timestamp=ts)


def test_a_sibling_that_spent_past_its_new_share_leaves_no_slot_to_grant_twice():
    """The engine has 8 slots. At 0.0 it runs a1, a2 (router A's) and b1, b2 (B's): 4 free, 2 each. A hears
    a1 and a2 end and sends four more (a3-a6) before the report measured at 1.0 (a1, a2 ended: 6 free, 3
    each) reaches it. That report leaves A nothing (its share 3, sent since 4), but B's whole share of 3 is
    one more than the engine's 2 free slots. With its quota (4 of 8, 2 in flight) B may send 2."""
    a, b = pair()
    for t, ids in ((a, ("a1", "a2")), (b, ("b1", "b2"))):
        for rid in ids:
            t.on_dispatch("e", rid, now=-1.0)
        t.on_stats("e", report(4, 0.0))
    assert a.free_slots() == 2 and b.free_slots() == 2
    assert a.on_complete("a1", now=1.1) and a.on_complete("a2", now=1.1)
    assert a.free_slots() == 4
    for rid in ("a3", "a4", "a5", "a6"):
        a.on_dispatch("e", rid, now=1.2)
    assert a.free_slots() == 0
    for t in (a, b):
        t.on_stats("e", report(2, 1.0))  # measured before a3-a6 reached the engine
    assert a.free_slots() == 0
    assert b.free_slots() == 2  # was 3: 2 + 4 + 3 = 9 requests at an 8-slot engine
    assert a.free_slots() + b.free_slots() + 6 <= 8


def test_the_quota_splits_the_engines_slots_and_follows_a_lent_slot():
    a, b, c = pair(3)
    for t in (a, b, c):
        t.on_stats("e", report(0, 0.0, seqs=8))
    quotas = [t._t["e"].quota for t in (a, b, c)]
    assert sorted(quotas) == [2, 3, 3] and sum(quotas) == 8
    give, take = sorted((a, b, c), key=lambda t: t._t["e"].quota)[::-1][:2]
    q_give, q_take = give._t["e"].quota, take._t["e"].quota
    assert give.lend_slot("e", take)
    assert (give._t["e"].quota, take._t["e"].quota) == (q_give - 1, q_take + 1)


def test_no_quota_for_one_router_or_an_engine_that_does_not_report_its_size_and_never_zero():
    one = LoadTracker("sp-p")
    one.set_targets(["e"])
    one.on_stats("e", report(0, 0.0))
    assert one._t["e"].quota is None and one.free_slots() == 8
    a, b = pair()
    a.on_stats("e", ReplicaStats(num_waiting=0, num_running=0, timestamp=0.0))  # no max_num_seqs
    assert a._t["e"].quota is None
    a, b = pair()  # an engine with fewer slots than routers: each keeps one, so neither router stalls
    for t in (a, b):
        t.on_stats("e", report(0, 0.0, seqs=1))
    assert a._t["e"].quota == 1 and b._t["e"].quota == 1
    a.set_share(0, 1)  # back to one router: no quota
    assert a._t["e"].quota is None


def _engine_and_routers(seed, n, seqs=8, period=0.5, lag=(0.3, 0.6), transit=0.02, heard=0.02, rate=10.0,
                        duration=20.0, service=(0.2, 1.2)):
    """An engine with ``seqs`` slots (more wait in its queue) behind ``n`` sibling routers. Arrivals reach a
    router at random, as Ray's proxy spreads them; each router sends while its tracker has a free slot.
    Reports are measured every ``period`` and reach each router with its own lag, so siblings hold reports
    up to ``lag[1] - lag[0]`` apart; requests reach the engine, and their ends reach their router, within
    the seen margin. Returns (arrivals at a full engine, requests that arrived, requests sent, requests served)."""
    rng = random.Random(seed)
    routers = pair(n)
    events, seq = [], [0]

    def push(t, kind, *a):
        seq[0] += 1
        heapq.heappush(events, (t, seq[0], kind, a))

    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        push(t, "arrive", rng.randrange(n))
    push(0.0, "measure")
    queues = [[] for _ in range(n)]
    running, waiting = set(), []
    over = served = sent = 0

    def pump(r, now):
        nonlocal sent
        while queues[r] and routers[r].is_available("e"):
            rid = queues[r].pop(0)
            routers[r].on_dispatch("e", rid, now)
            sent += 1
            push(now + rng.uniform(0.0, transit), "reach", r, rid)

    next_id = 0
    while events:
        now, _, kind, a = heapq.heappop(events)
        if kind == "arrive":
            next_id += 1
            queues[a[0]].append(next_id)
            pump(a[0], now)
        elif kind == "reach":
            if len(running) >= seqs:
                over += 1
                waiting.append(a)
            else:
                running.add(a)
                push(now + rng.uniform(*service), "end", *a)
        elif kind == "end":
            running.discard(a)
            served += 1
            if waiting:
                w = waiting.pop(0)
                running.add(w)
                push(now + rng.uniform(*service), "end", *w)
            push(now + rng.uniform(0.0, heard), "heard", *a)
        elif kind == "heard":
            routers[a[0]].on_complete(a[1], now=now)
            pump(a[0], now)
        elif kind == "measure":
            st = report(len(running), now, seqs=seqs, waiting=len(waiting))
            for r in range(n):
                push(now + rng.uniform(*lag), "stats", r, st)
            if now < duration + 30.0 and (served < next_id or now < duration):
                push(now + period * rng.uniform(0.9, 1.1), "measure")
        elif kind == "stats":
            routers[a[0]].on_stats("e", a[1])
            pump(a[0], now)
    return over, next_id, sent, served


@pytest.mark.parametrize("n", [2, 3, 4])
def test_siblings_holding_reports_apart_never_send_an_engine_more_than_its_slots(n):
    for seed in range(3):
        over, arrived, sent, served = _engine_and_routers(seed, n)
        assert over == 0, f"seed {seed}: {over} requests reached a full engine"
        assert arrived == sent == served > 150  # and no router stranded a request: every one was sent and served
