import os
import pickle
import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_geolb.policy.prefix_index import PrefixIndex

ALPHA = "ab"  # tiny alphabet: lots of shared prefixes


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def test_match_returns_longest_shared_prefix_per_target():
    idx = PrefixIndex(block_chars=4, growth=0.0)
    idx.insert("aaaabbbbcccc", "r1")
    idx.insert("aaaabbbbdddd", "r2")
    idx.insert("zzzz", "r3")
    m = idx.match("aaaabbbbccccxxxx")
    assert m == {"r1": 12, "r2": 8}
    assert idx.match("aaaabbbbcccc", available=["r2"]) == {"r2": 8}
    assert idx.match("qqqq") == {}
    assert idx.longest("aaaabbbbcc")[1] == 8


def test_match_stops_when_no_available_target_remains():
    idx = PrefixIndex(block_chars=4, growth=0.0)
    idx.insert("aaaabbbbcccc", "r1")
    assert idx.match("aaaabbbbcccc", available=["r9"]) == {}
    assert idx.match("aaaabbbbcccc", available=[]) == {}


def test_geometric_blocks_bound_the_error():
    idx = PrefixIndex(block_chars=64, growth=0.125)
    rng = random.Random(1)
    base = "".join(rng.choices(string.ascii_letters, k=100_000))
    idx.insert(base, "r")
    for shared in (500, 5_000, 50_000):
        q = base[:shared] + "#" * 10
        got = idx.match(q)["r"]
        assert got <= shared and got >= shared * (1 - 0.125) - 64
    # 100k characters in a few dozen blocks, not thousands
    assert idx.num_nodes < 60


def test_remove_target_and_subset_invariant():
    idx = PrefixIndex(block_chars=4, growth=0.0)
    idx.insert("aaaabbbbcccc", "r1")
    idx.insert("aaaabbbb", "r2")
    idx.check_invariants()
    assert idx.remove_target("r1") == 3
    idx.check_invariants()
    assert idx.match("aaaabbbbcccc") == {"r2": 8}
    assert idx.num_nodes == 2
    assert idx.chars_of("r1") == 0 and idx.chars_of("r2") == 8


def test_eviction_is_lru_and_frees_nodes():
    idx = PrefixIndex(block_chars=4, growth=0.0, max_nodes=6)
    idx.insert("aaaabbbbcccc", "old")
    idx.insert("xxxxyyyyzzzz", "new")
    assert idx.num_nodes == 6
    idx.insert("qqqqrrrr", "newer")  # needs 2 nodes: the oldest path loses its two deepest blocks
    idx.check_invariants()
    assert idx.num_nodes == 6
    assert idx.match("aaaabbbbcccc") == {"old": 4}
    assert idx.match("xxxxyyyyzzzz") == {"new": 12}
    assert idx.evictions == 2


def test_access_refreshes_lru_order():
    idx = PrefixIndex(block_chars=4, growth=0.0, max_nodes=4)
    idx.insert("aaaabbbb", "r1")
    idx.insert("ccccdddd", "r2")
    idx.insert("aaaabbbb", "r1")  # touch: r2's path is now the oldest
    idx.insert("eeee", "r3")
    idx.check_invariants()
    assert idx.match("aaaabbbb") == {"r1": 8}
    assert idx.match("ccccdddd") == {"r2": 4}


def test_char_budget_counts_every_target():
    idx = PrefixIndex(block_chars=4, growth=0.0, max_nodes=None, max_chars=16)
    for t in ("a", "b", "c"):
        idx.insert("aaaabbbb", t)
    assert idx.stored_chars <= 16
    idx.check_invariants()


def test_store_text_false_keeps_no_prompt_text():
    rng = random.Random(7)
    prompts = ["".join(rng.choices(string.ascii_lowercase, k=3000)) for _ in range(20)]
    idx = PrefixIndex(store_text=False)
    for i, p in enumerate(prompts):
        idx.insert(p, f"r{i % 3}")
    blob = pickle.dumps(idx.__dict__)
    for p in prompts:
        for start in range(0, len(p) - 12, 97):
            assert p[start:start + 12].encode() not in blob
    assert idx.stored_text_blocks() == []
    kept = PrefixIndex(store_text=True)
    kept.insert(prompts[0], "r")
    assert b"".join(kept.stored_text_blocks()) and prompts[0][:40].encode() in pickle.dumps(kept.__dict__)


def test_snapshot_round_trip():
    idx = PrefixIndex(block_chars=4, growth=0.0)
    idx.insert("aaaabbbbcccc", "eu", now=1.0)
    idx.insert("aaaadddd", "asia", now=2.0)
    copy = PrefixIndex(block_chars=4, growth=0.0)
    copy.load_snapshot(idx.snapshot())
    copy.check_invariants()
    assert copy.match("aaaabbbbcccc") == idx.match("aaaabbbbcccc")
    with pytest.raises(ValueError, match="geometry"):
        PrefixIndex(block_chars=8).load_snapshot(idx.snapshot())


@pytest.mark.parametrize("kw, field", [({"block_chars": 0}, "block_chars"), ({"growth": 2.0}, "growth"),
                                       ({"max_nodes": 0}, "max_nodes"), ({"max_chars": -1}, "max_chars")])
def test_bad_geometry_is_rejected(kw, field):
    with pytest.raises(ValueError, match=field):
        PrefixIndex(**kw)


texts = st.text(alphabet=ALPHA, min_size=0, max_size=80)
ops = st.lists(st.tuples(texts, st.sampled_from(["r0", "r1", "r2", "r3"])), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, queries=st.lists(texts, min_size=1, max_size=10),
       max_nodes=st.one_of(st.none(), st.integers(1, 40)), growth=st.sampled_from([0.0, 0.125, 0.5]))
def test_property_match_never_exceeds_inserted_and_invariants_hold(ops, queries, max_nodes, growth):
    idx = PrefixIndex(block_chars=3, growth=growth, max_nodes=max_nodes)
    inserted = {}
    for i, (text, target) in enumerate(ops):
        idx.insert(text, target, now=float(i))
        inserted.setdefault(target, []).append(text.encode())
        idx.check_invariants()  # includes: subset invariant, budget never exceeded, accounting
    for q in queries:
        qb = q.encode()
        for target, n in idx.match(q).items():
            assert n <= len(qb)
            assert n <= max(common_prefix(qb, t) for t in inserted[target])
            assert qb[:n] in [t[:n] for t in inserted[target]]  # a real inserted prefix


@settings(max_examples=60, deadline=None)
@given(ops=ops)
def test_property_unbounded_index_matches_exactly_at_block_granularity(ops):
    idx = PrefixIndex(block_chars=3, growth=0.0, max_nodes=None)
    inserted = {}
    for text, target in ops:
        idx.insert(text, target)
        inserted.setdefault(target, []).append(text.encode())
    for text, _ in ops:
        qb = text.encode()
        m = idx.match(text)
        for target, texts_ in inserted.items():
            best = max(common_prefix(qb, t) for t in texts_)
            assert m.get(target, 0) == (best // 3) * 3


def test_eviction_empties_the_index_when_the_budget_is_one_node():
    idx = PrefixIndex(block_chars=2, growth=0.0, max_nodes=1)
    for i in range(50):
        idx.insert(f"{i:04d}xx", f"r{i % 5}")
        assert idx.num_nodes <= 1
    idx.check_invariants()


def test_memory_bound_holds_over_a_million_inserts():
    """The global budget is enforced on every insert, over 10^6 inserts of random prompts."""
    n = int(os.environ.get("GEOLB_MILLION", "1000000"))
    budget = 5_000
    idx = PrefixIndex(block_chars=8, growth=0.25, max_nodes=budget, max_chars=400_000)
    rng = random.Random(3)
    heads = ["".join(rng.choices(string.ascii_letters, k=24)) for _ in range(64)]
    tails = ["".join(rng.choices(string.ascii_letters, k=40)) for _ in range(997)]
    peak_nodes = peak_chars = 0
    for i in range(n):
        text = heads[i % 64] + tails[(i * 7919) % 997] + str(i % 1_013)
        idx.insert(text, i % 16, now=float(i))
        if idx.num_nodes > peak_nodes:
            peak_nodes = idx.num_nodes
        if idx.stored_chars > peak_chars:
            peak_chars = idx.stored_chars
    assert peak_nodes <= budget and peak_chars <= 400_000
    assert idx.evictions > 0
    idx.check_invariants()


def test_entry_budget_counts_every_target_on_a_node():
    """Many targets on the same few nodes: the node count stays tiny, the (node, target) entries
    (what costs memory) are what ``max_entries`` bounds -- and it is on by default."""
    assert PrefixIndex().max_entries is not None
    idx = PrefixIndex(block_chars=4, growth=0.0, max_nodes=1000, max_entries=50)
    for i in range(40):
        idx.insert("aaaabbbbcccc", f"r{i}")
        idx.check_invariants()
        assert idx.num_entries <= 50
    assert idx.num_nodes == 3
    assert idx.evictions > 0
    # the newest targets keep the whole prompt; evicted ones lost their deepest blocks first
    assert idx.match("aaaabbbbcccc")["r39"] == 12
    with pytest.raises(ValueError, match="max_entries"):
        PrefixIndex(max_entries=0)


def test_fresh_suffix_nodes_chain_and_share_with_later_prompts():
    """A prompt whose tail is new gets its tail nodes in one go; later prompts share them."""
    idx = PrefixIndex(block_chars=4, growth=0.0, store_text=True)
    idx.insert("aaaabbbbcccc", "r1")
    idx.insert("aaaabbbbddddeeee", "r2")  # shares 2 blocks, 2 new ones
    idx.check_invariants()
    assert idx.num_nodes == 5 and idx.num_entries == 3 + 4
    assert sorted(idx.stored_text_blocks()) == [b"aaaa", b"bbbb", b"cccc", b"dddd", b"eeee"]
    assert idx.match("aaaabbbbddddeeeeffff") == {"r1": 8, "r2": 16}
    idx.insert("aaaabbbbddddeeee", "r1")  # r1 now also holds r2's tail
    idx.check_invariants()
    assert idx.match("aaaabbbbddddeeee") == {"r1": 16, "r2": 16}
    assert idx.chars_of("r1") == 20 and idx.chars_of("r2") == 16
    # one run per branch: [aaaa bbbb] {r1, r2} -> [cccc] {r1} and [dddd eeee] {r1, r2}
    assert idx.num_runs == 3
    # LRU: the newest record names r1's newest path by its deepest block
    assert idx._records[-1][1:] == (idx.prepare("aaaabbbbddddeeee").keys[-1], "r1")


def test_last_access_at_reads_the_entry_time():
    idx = PrefixIndex(block_chars=4, growth=0.0)
    idx.insert("aaaabbbb", "r1", now=5.0)
    idx.insert("aaaa", "r2", now=7.0)
    assert idx.last_access_at("aaaabbbb", 4, "r1") == 5.0 and idx.last_access_at("aaaabbbb", 4, "r2") == 7.0
    assert idx.last_access_at("aaaabbbb", 8, "r1") == 5.0 and idx.last_access_at("aaaabbbb", 8, "r2") is None
    assert idx.last_access_at("aaaacccc", 8, "r1") is None  # that prefix was never sent
    assert idx.last_access_at("aaaabbbb", 6, "r1") is None  # not a block boundary
    assert idx.last_access_at("aaaabbbb", 12, "r1") is None  # beyond the text


def test_nodes_hold_no_gc_tracked_objects():
    """A big index must not make every full GC pass walk its nodes: a run is a plain tuple of ints
    (and a tuple of ints), its targets a dict of atomic keys and floats, an LRU record a tuple of
    atoms -- all of which CPython's collector untracks; the ``_nodes`` view still reads every block
    as (parent, start, end, targets)."""
    import gc
    import platform

    idx = PrefixIndex(block_chars=4, growth=0.0)
    p = idx.insert("aaaabbbbcccc", "r1", now=1.0)
    idx.insert("aaaabbbbdddd", "r2", now=2.0)
    gc.collect()
    gc.collect()
    if platform.python_implementation() == "CPython":
        for h in idx._runs:
            assert not gc.is_tracked(idx._runs[h]) and not gc.is_tracked(idx._tg[h])
        assert not any(gc.is_tracked(r) for r in idx._records)
    node = idx._nodes.get(p.keys[1])
    assert (node.parent, node.start, node.end, node.targets) == (p.keys[0], 4, 8, {"r1": 1.0, "r2": 2.0})
    assert idx._nodes.get(123) is None and p.keys[2] in idx._nodes and len(idx._nodes) == 4
    idx.check_invariants()


def test_a_new_tail_is_one_run_and_splits_where_a_later_prompt_leaves_it():
    idx = PrefixIndex(block_chars=4, growth=0.0)
    idx.insert("aaaabbbbccccddddeeee", "r1")
    assert (idx.num_runs, idx.num_nodes, idx.num_entries) == (1, 5, 5)
    idx.insert("aaaabbbbcccc", "r2")  # ends inside the run: split after block 3
    assert (idx.num_runs, idx.num_nodes, idx.num_entries) == (2, 5, 8)
    idx.insert("aaaabbbbzzzz", "r3")  # diverges inside the first part: split after block 2 + new run
    assert (idx.num_runs, idx.num_nodes, idx.num_entries) == (4, 6, 11)
    assert idx.match("aaaabbbbccccddddeeeeffff") == {"r1": 20, "r2": 12, "r3": 8}
    assert idx.match("aaaabbbbcccc", available={"r3"}) == {"r3": 8}
    idx.check_invariants()
    assert idx.remove_target("r1") == 5
    idx.check_invariants()
    assert idx.match("aaaabbbbccccddddeeee") == {"r2": 12, "r3": 8}


def test_lru_records_stay_bounded_without_evictions():
    """One record per insert, but stale ones are compacted away: repeating the same few prompts
    forever must not grow memory."""
    idx = PrefixIndex(block_chars=4, growth=0.0, max_nodes=None, max_entries=None)
    for i in range(20_000):
        idx.insert(f"prompt-{i % 7:03d}-" * 4, f"r{i % 3}", now=float(i))
    assert idx.evictions == 0
    assert len(idx._records) <= 2 * idx.num_entries + 256
    idx.check_invariants()


def _ref_ends(n, block_chars, growth):
    ends, end = [], 0
    while True:
        end += max(block_chars, int(end * growth))
        if end > n:
            return ends
        ends.append(end)


class _RefLRU:
    """Reference model: one (block prefix, target) entry per block, exact LRU by (time, -depth),
    evicted one entry at a time; a block counts as a node while any target holds it."""

    def __init__(self, block_chars, growth, max_nodes, max_entries, max_chars):
        self.g = (block_chars, growth)
        self.max = (max_nodes, max_entries, max_chars)
        self.e = {}  # (prefix bytes, target) -> time

    def _over(self):
        nodes = len({p for p, _ in self.e})
        chars = sum(len(p) - max((e for e in _ref_ends(len(p), *self.g) if e < len(p)), default=0)
                    for p, _ in self.e)
        mn, me, mc = self.max
        return (mn is not None and nodes > mn) or (me is not None and len(self.e) > me) or (
            mc is not None and chars > mc)

    def insert(self, b, t, now):
        for end in _ref_ends(len(b), *self.g):
            self.e[(b[:end], t)] = now
        while self._over():
            k = min(self.e, key=lambda pt: (self.e[pt], -len(pt[0])))
            del self.e[k]

    def match(self, b):
        out = {}
        for t in {t for _, t in self.e}:
            n = 0
            for end in _ref_ends(len(b), *self.g):
                if (b[:end], t) not in self.e:
                    break
                n = end
            if n:
                out[t] = n
        return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, queries=st.lists(texts, min_size=1, max_size=8),
       budget=st.sampled_from([("n", 6), ("n", 15), ("e", 10), ("e", 30), ("c", 20), ("c", 60), ("none", 0)]),
       growth=st.sampled_from([0.0, 0.5]))
def test_property_runs_evict_exactly_like_a_per_entry_lru(ops, queries, budget, growth):
    kind, b = budget
    kw = {"max_nodes": b if kind == "n" else None, "max_entries": b if kind == "e" else None,
          "max_chars": b if kind == "c" else None}
    idx = PrefixIndex(block_chars=3, growth=growth, **kw)
    ref = _RefLRU(3, growth, kw["max_nodes"], kw["max_entries"], kw["max_chars"])
    for i, (text, target) in enumerate(ops):
        idx.insert(text, target, now=float(i))
        ref.insert(text.encode(), target, float(i))
        idx.check_invariants()
        assert idx.num_entries == len(ref.e)
    for q in queries + [t for t, _ in ops]:
        assert idx.match(q) == ref.match(q.encode())


def _random_index(seed, n=80):
    """An index with ``n`` random two-letter prompts sent round-robin to r0..r4 (times 0, 1, ...)."""
    rng = random.Random(seed)
    idx = PrefixIndex(block_chars=4, growth=0.25)
    texts_ = ["".join(rng.choices("ab", k=rng.randrange(4, 60))) for _ in range(n)]
    for i, t in enumerate(texts_):
        idx.insert(t, f"r{i % 5}", now=float(i))
    return idx, texts_


def test_access_times_agree_with_the_per_block_view():
    idx, texts_ = _random_index(5)
    blocks = idx._nodes
    for q in texts_[:30]:
        m = idx.match(q)
        p = idx.prepare(q)
        want = {t: blocks[p.keys[p.ends.index(n)]].targets[t] for t, n in m.items()}
        assert idx.access_times(q, m) == want
        assert {t: idx.last_access_at(q, n, t) for t, n in m.items()} == want
    assert idx.access_times("zzzzzzzz", {"r0": 4}) == {}
    assert idx.access_times(texts_[0], {"r0": 3}) == {}  # not a block boundary


def test_match_fills_the_same_times_as_access_times():
    idx, texts_ = _random_index(9)
    for q in texts_[:40]:
        for avail in (None, {"r1", "r3"}):
            times = {}
            m = idx.match(q, avail, times)
            assert m == idx.match(q, avail)
            assert times == idx.access_times(q, m)
