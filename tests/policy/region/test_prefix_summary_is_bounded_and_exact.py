"""The hash-only prefix summary a region publishes: bounded size, no false negatives,
a measured false-positive rate within the stated bound, and a wire format that rejects malformed input."""

from __future__ import annotations

import json
import random

import pytest

from ray_geolb.policy.prefix_index import PrefixIndex
from ray_geolb.policy.region.prefix_summary import MAX_WIRE_BITS, PrefixSummary, SummarySendRule

STATED_FPR = 0.0082  # the module docstring's bound at 10 bits per key, full load


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(n))


def _index(n_prompts=400, seed=0):
    rng = random.Random(seed)
    docs = [_text(rng, rng.randint(4000, 12000)) for _ in range(80)]
    idx = PrefixIndex(64, 0.125)
    prompts = []
    for i in range(n_prompts):
        p = rng.choice(docs) + _text(rng, 300)
        idx.insert(p, f"r{i % 2}", now=float(i))
        prompts.append(p)
    return idx, prompts, rng


def test_size_is_bounded_by_max_keys_and_bits_per_key():
    idx, _, _ = _index()
    assert idx.num_nodes > 2048  # more blocks than the summary may hold
    s = PrefixSummary.build(idx)  # defaults: 2048 keys, 10 bits per key
    assert s.n == 2048 and s.m == 20480 and s.k == 7
    wire = s.to_wire()
    size = len(json.dumps(wire, separators=(",", ":")))
    assert size == s.wire_bytes() <= 3600  # the bound the module docstring states
    assert json.loads(json.dumps(wire)) == wire  # JSON-able as is
    small = PrefixSummary.build(idx, max_keys=100, bits_per_key=8)
    assert small.n == 100 and small.m == 800 and small.wire_bytes() < 300


def test_no_false_negatives_for_what_it_holds():
    idx, prompts, _ = _index(n_prompts=120)
    s = PrefixSummary.build(idx, max_keys=16384)  # room for every block: the whole index
    assert s.n == idx.num_nodes
    for p in prompts:
        want = max(idx.match(p).values())
        assert s.match(p) >= want
        assert s.match(p) - want <= 2000  # at most a (rare) false-positive block past the true match
    # the newest prompts are in a summary that cannot hold everything (most recently used first)
    s = PrefixSummary.build(idx, max_keys=512)
    assert s.n == 512
    for p in prompts[-3:]:
        assert s.match(p) >= max(idx.match(p).values())


def test_measured_false_positive_rate_is_within_the_stated_bound():
    idx, _, _ = _index()
    s = PrefixSummary.build(idx)
    assert s.false_positive_rate() <= STATED_FPR + 1e-4
    rng = random.Random(7)
    probes = 200_000
    fp = sum(rng.getrandbits(64) in s for _ in range(probes))
    assert fp / probes <= STATED_FPR * 1.2  # measured (0.6-0.9 %) within the bound plus sampling noise
    # a prompt with nothing in common gets no match as long as min_match_chars (256) needs 4 blocks
    spurious = sum(s.match(_text(rng, 2000)) >= 256 for _ in range(2000))
    assert spurious == 0


def test_recent_block_keys_are_whole_paths_newest_first():
    idx = PrefixIndex(64, 0.0)
    a, b = "a" * 640, "b" * 640
    idx.insert(a, "r0", now=1.0)
    idx.insert(b, "r0", now=2.0)
    keys = idx.recent_block_keys(10)
    assert keys == list(idx.prepare(b).keys)  # b is newer and fills the budget
    keys = idx.recent_block_keys(15)
    assert keys[:10] == list(idx.prepare(b).keys) and keys[10:] == list(idx.prepare(a).keys)[:5]
    assert idx.recent_block_keys(100, min_chars=700) == []


def _wire():
    idx, _, _ = _index(n_prompts=20)
    return PrefixSummary.build(idx, max_keys=256).to_wire()


@pytest.mark.parametrize("mutate, message", [
    (lambda w: [1, 2], "must be a dict"),
    (lambda w: {k: v for k, v in w.items() if k != "bits"}, r"lacks \['bits'\]"),
    (lambda w: dict(w, text="hello"), r"unknown fields \['text'\]"),
    (lambda w: dict(w, v=2), "version 2"),
    (lambda w: dict(w, geometry=[64]), "geometry must be"),
    (lambda w: dict(w, geometry=[0, 0.125]), "block_chars"),
    (lambda w: dict(w, geometry=[64, 1.5]), "growth"),
    (lambda w: dict(w, m=w["m"] + 1), "m must be a multiple of 8"),
    (lambda w: dict(w, m=MAX_WIRE_BITS + 8), "m must be a multiple of 8"),
    (lambda w: dict(w, m=True), "m must be"),
    (lambda w: dict(w, k=0), "k must be"),
    (lambda w: dict(w, n=-1), "n must be"),
    (lambda w: dict(w, bits=w["bits"][:-8]), "bits hold"),
    (lambda w: dict(w, bits="!!!" + w["bits"][3:]), "not base64"),
    (lambda w: dict(w, bits=123), "base64 string"),
    (lambda w: dict(w, bits="A" * (w["m"] // 2)), "base64 string"),
])
def test_from_wire_rejects_malformed_input(mutate, message):
    w = _wire()
    with pytest.raises(ValueError, match=message):
        PrefixSummary.from_wire(mutate(dict(w)))


def test_wire_round_trip_keeps_every_answer():
    idx, prompts, rng = _index(n_prompts=60)
    s = PrefixSummary.build(idx, max_keys=1024)
    t = PrefixSummary.from_wire(json.loads(json.dumps(s.to_wire())))
    assert (t.m, t.k, t.n, t.block_chars, t.growth) == (s.m, s.k, s.n, s.block_chars, s.growth)
    for p in prompts[-10:] + [_text(rng, 3000) for _ in range(10)]:
        assert t.match(p) == s.match(p)


def test_a_summary_is_sent_first_when_it_changed_and_at_least_every_refresh():
    idx, _, _ = _index(40)
    a = PrefixSummary.build(idx, 256)
    b = PrefixSummary.build(idx, 256)  # the same figures, a new object: the router rebuilt it (index changed)
    rule = SummarySendRule(refresh_s=5.0)
    assert rule.wire(None, 0.0) is None  # nothing to publish
    assert rule.wire(a, 0.0) == a.to_wire()  # the first heartbeat carries it
    assert rule.wire(a, 0.25) is None and rule.wire(a, 4.9) is None  # unchanged: not again
    assert rule.wire(b, 5.0) == b.to_wire()  # changed
    assert rule.wire(b, 9.9) is None
    assert rule.wire(b, 10.0) == b.to_wire()  # unchanged for refresh_s: again (a restarted registry holds none)
