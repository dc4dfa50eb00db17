"""Behaviour of each single-region algorithm and of the policy configs."""

import math

import pytest
from pydantic import ValidationError

from ray_geolb.policy import ReplicaStats, RouteRequest, build_policy, parse_policy_config, policy_names
from ray_geolb.policy.factory import UnknownPolicyError

TARGETS = ["r0", "r1", "r2", "r3"]


def req(i, text="", key=None):
    return RouteRequest(f"q{i}", text or f"prompt {i} " * 20, session_key=key)


def route(policy, r, now=0.0):
    d = policy.choose(r, now)
    if d is not None:
        policy.on_dispatch(r, d.target, now)
    return d


def test_registry_lists_every_seed_baseline():
    names = set(policy_names())
    assert {"round_robin", "least_load", "power_of_two", "consistent_hash", "sglang", "ray_prefix", "oracle",
            "skylb", "skylb_ch"} <= names


def test_round_robin_cycles():
    p = build_policy("round_robin", targets=TARGETS)
    assert [route(p, req(i)).target for i in range(8)] == TARGETS * 2


def test_least_load_picks_fewest_outstanding():
    p = build_policy("least_load", targets=TARGETS)
    got = [route(p, req(i)).target for i in range(4)]
    assert sorted(got) == TARGETS
    p.on_complete("q2")
    assert route(p, req(9)).target == got[2]


def test_power_of_two_prefers_less_loaded_of_two():
    p = build_policy({"name": "power_of_two", "seed": 3}, targets=["a", "b"])
    for i in range(5):
        p.on_dispatch(req(i), "a", 0.0)
    assert all(route(p, req(10 + i)).target == "b" for i in range(4))


def test_consistent_hash_is_sticky_and_blind():
    p = build_policy("consistent_hash", targets=TARGETS)
    first = route(p, req(0, key="user-7")).target
    assert all(route(p, req(i, key="user-7")).target == first for i in range(1, 20))
    assert p.tracker.outstanding(first) == 20  # blind: piles up


def test_skylb_ch_walks_past_busy_home():
    p = build_policy("skylb_ch", targets=TARGETS)
    home = p.ring.lookup("user-7")
    p.on_stats(home, ReplicaStats(num_waiting=3, timestamp=1.0))
    d = p.choose(req(0, key="user-7"), 1.0)
    assert d.target != home and d.reason == "ring"


def test_skylb_longest_match_among_available_and_holds_when_full():
    p = build_policy("skylb", targets=TARGETS)
    for t in TARGETS:
        p.on_stats(t, ReplicaStats(num_waiting=0, num_running=0, max_num_seqs=8, timestamp=0.0))
    conv = "system: be brief\nuser: hello there, " * 10
    first = route(p, req(0, conv), now=0.1)
    d = p.choose(req(1, conv + "assistant: hi\nuser: more"), 0.2)
    assert d.target == first.target and d.matched > 0 and d.reason == "prefix"
    # The matched replica reports waiting work: the next turn goes elsewhere (selective pushing).
    p.on_stats(first.target, ReplicaStats(num_waiting=2, timestamp=0.3))
    d2 = p.choose(req(2, conv + "assistant: hi\nuser: more"), 0.4)
    assert d2.target != first.target
    # Everyone waiting: hold.
    for t in TARGETS:
        p.on_stats(t, ReplicaStats(num_waiting=1, timestamp=0.5))
    assert p.choose(req(3, conv), 0.6) is None


def test_skylb_min_match_ignores_short_shared_system_prompt():
    p = build_policy({"name": "skylb", "min_match_chars": 2000}, targets=TARGETS)
    for t in TARGETS:
        p.on_stats(t, ReplicaStats(max_num_seqs=100, timestamp=0.0))
    system = "You are a helpful assistant. " * 30  # ~870 chars, shared by every user
    targets = {route(p, req(i, system + f"user {i} asks something different " * 5), 0.1).target for i in range(8)}
    assert len(targets) == 4  # spread by load, not piled on the system prompt's replica


def test_sglang_balance_threshold_and_cache_threshold():
    p = build_policy({"name": "sglang", "balance_abs_threshold": 2, "cache_threshold": 0.5}, targets=["a", "b"])
    text = "x" * 2000
    assert route(p, req(0, text)).target in ("a", "b")
    hot = p.tracker._req_target["q0"]
    # Same prompt again: high match rate -> same target despite its load (blind pushing).
    assert route(p, req(1, text)).target == hot
    assert route(p, req(2, text)).target == hot
    # Imbalance beyond abs threshold (3 vs 0 > 2): least loaded wins.
    d = p.choose(req(3, text), 0.0)
    assert d.target != hot and d.reason == "imbalanced"
    # A new prompt with low match rate goes to the smallest tree.
    p2 = build_policy("sglang", targets=["a", "b"])
    route(p2, req(0, "y" * 2000))
    d = p2.choose(req(1, "z" * 2000), 0.0)
    assert d.reason == "smallest_tree" and d.target != p2.tracker._req_target["q0"]


def test_ray_prefix_match_rate_threshold():
    p = build_policy("ray_prefix", targets=["a", "b", "c"])
    text = "shared " * 300
    t0 = route(p, req(0, text)).target
    assert p.choose(req(1, text + "tail"), 0.0).target == t0
    d = p.choose(req(2, "totally different " * 100), 0.0)
    assert d.reason == "smallest_tree" and d.target != t0
    assert math.isinf(p.config.imbalanced_threshold)


def test_oracle_uses_real_cache_and_requires_probe():
    cached = {"r2": 40}
    p = build_policy("oracle", targets=TARGETS, cache_probe=lambda t, r: cached.get(t, 0))
    assert p.choose(req(0), 0.0).target == "r2"
    with pytest.raises(RuntimeError, match="cache_probe"):
        build_policy("oracle", targets=TARGETS).choose(req(0), 0.0)


def test_dispatch_and_completion_accounting_is_idempotent():
    p = build_policy("least_load", targets=["a"])
    r = req(0)
    p.on_dispatch(r, "a", 0.0)
    p.on_dispatch(r, "a", 0.0)
    assert p.tracker.outstanding("a") == 1
    p.on_complete("q0", "a")
    p.on_complete("q0", "a")
    assert p.tracker.outstanding("a") == 0


def test_target_removal_forgets_affinity():
    p = build_policy("skylb", targets=["a", "b"])
    route(p, req(0, "k" * 500))
    gone = p.tracker._req_target["q0"]
    p.set_targets([t for t in ("a", "b") if t != gone])
    assert p.index.chars_of(gone) == 0
    assert p.choose(req(1, "k" * 500), 1.0).target != gone


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"name": "skylb", "prefix": {"block_chars": 0}}, "block_chars"),
        ({"name": "skylb", "min_match_chars": -1}, "min_match_chars"),
        ({"name": "sglang", "cache_threshold": 1.5}, "cache_threshold"),
        ({"name": "sglang", "balance_abs_threshold": -3}, "balance_abs_threshold"),
        ({"name": "skylb", "availability": {"mode": "sometimes"}}, "mode"),
        ({"name": "skylb", "availability": {"max_outstanding": 0}}, "max_outstanding"),
        ({"name": "consistent_hash", "virtual_nodes": 0}, "virtual_nodes"),
        ({"name": "skylb", "typo_field": 1}, "typo_field"),
    ],
)
def test_invalid_config_names_the_field(spec, field):
    with pytest.raises(ValidationError, match=field):
        parse_policy_config(spec)


def test_unknown_policy_name_is_clear():
    with pytest.raises(UnknownPolicyError, match="unknown policy 'nope'.*skylb"):
        build_policy("nope")
    with pytest.raises(UnknownPolicyError, match="missing"):
        build_policy({"seed": 1})


def test_availability_mode_override():
    p = build_policy({"name": "sglang", "availability": {"mode": "sp-p"}}, targets=["a"])
    assert p.tracker.mode == "sp-p"
    assert build_policy("sglang", targets=["a"]).tracker.mode == "bp"
    assert build_policy("skylb", targets=["a"]).tracker.mode == "sp-p"


def _least_loaded_scan(targets, tracker, rng):
    """The plain left-to-right reservoir scan ``least_loaded`` must reproduce draw for draw."""
    best = best_n = None
    ties = 0
    for t in targets:
        n = tracker.outstanding(t)
        if best_n is None or n < best_n:
            best, best_n, ties = t, n, 1
        elif n == best_n:
            ties += 1
            if rng.random() * ties < 1.0:
                best = t
    return best


def test_least_loaded_is_draw_for_draw_the_reservoir_scan():
    import random

    from ray_geolb.policy.availability import LoadTracker
    from ray_geolb.policy.base import least_loaded

    gen = random.Random(7)
    for case in range(300):
        n = gen.choice([1, 2, 3, 5, 17, 333])
        targets = [f"t{i}" for i in range(n)]
        tr = LoadTracker(mode="bp")
        tr.set_targets(targets)
        k = 0
        for t in targets:
            for _ in range(gen.choice([0, 0, 1, 1, 2, 5]) if case % 3 else gen.randrange(3)):
                tr.on_dispatch(t, f"q{k}", 0.0)
                k += 1
        sub = gen.sample(targets, gen.randrange(1, n + 1))
        a, b = random.Random(case), random.Random(case)
        for _ in range(3):
            assert least_loaded(sub, tr, a) == _least_loaded_scan(sub, tr, b)
        assert a.random() == b.random()  # same number of draws
        assert tr.outstanding_of(sub) == [tr.outstanding(t) for t in sub]
        assert tr.total_outstanding() == k
    assert least_loaded([], LoadTracker(mode="bp"), random.Random(0)) is None


def test_prefix_ties_break_in_target_order_not_hash_order():
    """Ties of the prefix index come back in set order (string hashing); the pick must depend only
    on the seed and the target order: the same in every process."""
    import subprocess
    import sys

    code = ("from ray_geolb.policy import build_policy, RouteRequest\n"
            "out = []\n"
            "for name in ('skylb', 'sglang', 'ray_prefix'):\n"
            "    p = build_policy({'name': name, 'availability': {'mode': 'bp'}}, "
            "targets=[f'r{i}' for i in range(16)])\n"
            "    for t in p.targets:\n"
            "        r = RouteRequest('w' + t, 'shared ' * 200)\n"
            "        p.on_dispatch(r, t, 0.0)\n"
            "        p.on_complete(r.request_id, t)\n"
            "    out += [p.choose(RouteRequest(f'q{i}', 'shared ' * 200), 1.0).target for i in range(20)]\n"
            "print(out)\n")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)}).stdout
            for seed in (1, 2, 3)}
    assert len(outs) == 1, outs
