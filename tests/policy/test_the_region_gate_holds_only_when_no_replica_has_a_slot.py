"""SP-P's region gate (``AvailabilityConfig.gate="region"``): the router still holds a request while no replica
has a slot left, but while one has, the cost decides among every replica with room -- a replica whose report
says too much waits is priced by that queue instead of being skipped. Room is the KV budget (never sent a
request the engine has no KV for) and, with several routers per region, a router's fixed part of an engine's
slots. SkyLB's rule (``gate="replica"``, the default) is unchanged."""

import pytest

from policy_cases import P, cost_policy, rq
from ray_geolb.policy import ReplicaStats

SEQS = 2


def _policy(gate):
    pol = cost_policy("geoprefix", match_half_life_s=None, availability={"mode": "sp-p", "gate": gate})
    pol.on_dispatch(rq("ctx", P * 4), "a", -2.0)  # a holds an 8,192-char context
    pol.on_complete("rctx", "a", -1.9)
    for i in range(30):  # short prompts elsewhere: the mean prompt, and so a reported waiting request, is small
        pol.on_dispatch(rq(f"s{i}", f"short question {i:03d} " * 2), "b", -1.5)
        pol.on_complete(f"rs{i}", "b", -1.4)
    return pol


def _report(pol, target, waiting, ts=0.0, kv_used=None):
    kv = {} if kv_used is None else {"kv_cache_usage": kv_used, "num_gpu_blocks": 1000, "block_tokens": 16}
    pol.on_stats(target, ReplicaStats(num_waiting=waiting, num_running=0, max_num_seqs=SEQS, timestamp=ts, **kv))


NEXT_TURN = P * 4 + "c" * 100  # matches a's context but for its last 100 characters


@pytest.mark.parametrize("gate, picked", [("replica", "b"), ("region", "a")])
def test_a_replica_with_a_short_queue_and_the_context_is_skipped_only_by_the_replica_gate(gate, picked):
    pol = _policy(gate)
    _report(pol, "a", waiting=9)  # past GeoPrefix's pending allowance of 8: no slot at a
    _report(pol, "b", waiting=0)
    assert pol.tracker.available == {"b"}
    costs = pol.costs(rq(1, NEXT_TURN), ["a", "b"], 0.1)
    assert costs["a"] < costs["b"], costs  # the context outweighs a's nine short waiting requests
    assert pol.choose(rq(1, NEXT_TURN), 0.1).target == picked
    assert pol.choose(rq(2, NEXT_TURN), 0.1, iter(["a", "b"])).target == picked  # candidates read once only
    assert pol.choose(rq(3, NEXT_TURN), 0.1, ["a"]) is None  # a's queue is no slot: nothing to gate open


@pytest.mark.parametrize("gate", ["replica", "region"])
def test_both_gates_hold_while_no_replica_has_a_slot(gate):
    pol = _policy(gate)
    _report(pol, "a", waiting=9)
    _report(pol, "b", waiting=9)
    assert pol.choose(rq(1, NEXT_TURN), 0.1) is None
    _report(pol, "b", waiting=0, ts=0.5)  # a slot anywhere: the region gate sends to the cheaper replica
    assert pol.choose(rq(1, NEXT_TURN), 0.6).target == ("a" if gate == "region" else "b")


def test_the_region_gate_never_sends_past_a_routers_fixed_part_of_an_engines_slots():
    pol = _policy("region")
    pol.set_headroom_share(0, 2)  # one of two routers over these engines: its part is 1 of their 2 slots
    pol.on_dispatch(rq(2, "other " * 50), "a", -0.5)  # this router's part of a is in flight, in a's report
    _report(pol, "a", waiting=9)
    _report(pol, "b", waiting=0)
    assert not pol.tracker.has_room("a") and pol.tracker.has_room("b")
    assert pol.choose(rq(1, NEXT_TURN), 0.1).target == "b"
    pol.on_complete("r2", "a", 0.2)
    assert pol.choose(rq(1, NEXT_TURN), 0.3).target == "a"


def test_a_request_sent_past_a_replicas_slots_spends_another_replicas_so_the_region_sends_no_more_than_its_slots():
    """b's report grants 2 slots, a's none. The region gate sends both next turns to a, where their context is, and
    each spends one of b's slots: a third waits for a report, as it would have under SkyLB's rule. A reservation
    released unsent gives its slot back."""
    pol = _policy("region")
    _report(pol, "a", waiting=9)
    _report(pol, "b", waiting=0)
    assert pol.tracker.free_slots() == SEQS
    pol.reserve(rq(9, NEXT_TURN), "a", 0.05)
    assert pol.tracker.free_slots() == SEQS - 1
    pol.release("r9", "a", 0.06)
    assert pol.tracker.free_slots() == SEQS
    for i in (1, 2):
        d = pol.choose(rq(i, NEXT_TURN), 0.1)
        assert d.target == "a"
        pol.on_dispatch(rq(i, NEXT_TURN), "a", 0.1)
        pol.on_dispatch(rq(i, NEXT_TURN), "a", 0.11)  # reported twice (a reservation, then sent): spent once
        assert pol.tracker.free_slots() == SEQS - i
    assert pol.choose(rq(3, NEXT_TURN), 0.1) is None
    pol.on_complete("r1", "a", 0.3)  # the next report, not a completion at a, gives b's slots back
    assert pol.choose(rq(3, NEXT_TURN), 0.3) is None
    _report(pol, "b", waiting=0, ts=0.4)
    assert pol.choose(rq(3, NEXT_TURN), 0.5) is not None


@pytest.mark.parametrize("kv_used, picked", [(0.0, "a"), (0.5, "a"), (0.95, "b")])
def test_the_region_gate_never_sends_a_request_the_engine_has_no_kv_for(kv_used, picked):
    """a's report: 16,000 KV tokens, ``kv_used`` of them taken. It has room while its free tokens hold a typical
    request (``request_tokens``, 1,024 by default): at 95 % used (800 free) the request goes to b."""
    pol = _policy("region")
    _report(pol, "a", waiting=9, kv_used=kv_used)
    _report(pol, "b", waiting=0)
    assert pol.tracker.has_room("a") is (picked == "a")
    assert pol.choose(rq(1, NEXT_TURN), 0.1).target == picked


def test_the_gate_is_named_when_it_is_wrong():
    with pytest.raises(ValueError, match="gate"):
        cost_policy("geoprefix", availability={"mode": "sp-p", "gate": "cluster"})


def test_pooled_slots_are_kept_exactly_through_any_mix_of_sends_releases_completions_and_reports():
    """Random reservations, sends, releases, completions and reports over three replicas under the region gate: the
    incremental slot total always equals a fresh sum, no replica's slots go negative, and once everything is done
    no pooled spend is left behind."""
    import random

    rng = random.Random(5)
    pol = cost_policy("geoprefix", targets=("a", "b", "c"), availability={"mode": "sp-p", "gate": "region"})
    tr = pol.tracker
    live, reserved, now, pooled = [], [], 0.0, 0
    for step in range(4000):
        now += 0.01
        op = rng.random()
        if op < 0.1:
            for t in ("a", "b", "c"):
                pol.on_stats(t, ReplicaStats(num_waiting=rng.choice([0, 0, 3, 12]), num_running=rng.randint(0, SEQS),
                                             max_num_seqs=SEQS, timestamp=now))
        elif op < 0.5:
            req = rq(step, f"prompt {step % 17} " * 20)
            d = pol.choose(req, now)
            if d is not None:
                if rng.random() < 0.5:
                    pol.reserve(req, d.target, now)
                    reserved.append((f"r{step}", d.target, req))
                else:
                    pol.on_dispatch(req, d.target, now)
                    live.append((f"r{step}", d.target))
        elif op < 0.65 and reserved:
            rid, t, req = reserved.pop(rng.randrange(len(reserved)))
            if rng.random() < 0.5:
                pol.release(rid, t, now)
            else:
                pol.on_dispatch(req, t, now)
                live.append((rid, t))
        elif live:
            rid, t = live.pop(rng.randrange(len(live)))
            pol.on_complete(rid, t, now)
        assert tr.free_total == sum(tr._free(st) for st in tr._t.values())
        assert all(st.free >= 0 for st in tr._t.values())
        pooled = max(pooled, len(tr._pooled))
    assert pooled > 0  # sends past a replica's slots happened
    for rid, t, _ in reserved:
        pol.release(rid, t, now)
    for rid, t in live:
        pol.on_complete(rid, t, now)
    assert not tr._pooled and not tr._req_target
