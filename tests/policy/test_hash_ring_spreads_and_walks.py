import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_geolb.policy.hash_ring import HashRing, stable_hash64


@settings(max_examples=12, deadline=None)
@given(n=st.integers(2, 16), prefix=st.text(alphabet="abcxyz-", min_size=1, max_size=8))
def test_keys_spread_within_15_percent(n, prefix):
    ring = HashRing([f"{prefix}{i}" for i in range(n)])  # default: 1024 virtual nodes
    assert ring.virtual_nodes >= 100
    counts = {t: 0 for t in ring.targets}
    keys = 2000 * n
    for k in range(keys):
        counts[ring.lookup(f"user-{k}")] += 1
    fair = keys / n
    assert all(abs(c / fair - 1) <= 0.15 for c in counts.values()), counts


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), victim=st.integers(0, 11))
def test_removing_a_target_moves_only_its_keys(n, victim):
    targets = [f"r{i}" for i in range(n)]
    gone = targets[victim % n]
    ring = HashRing(targets, virtual_nodes=128)
    before = {k: ring.lookup(k) for k in map(str, range(3000))}
    ring.remove(gone)
    for k, t in before.items():
        now = ring.lookup(k)
        if t != gone:
            assert now == t
        else:
            assert now != gone


def test_next_available_walks_past_unavailable_targets():
    ring = HashRing(["a", "b", "c"], virtual_nodes=64)
    key = "session-42"
    home = ring.lookup(key)
    assert ring.next_available(key, {"a", "b", "c"}) == home
    others = {"a", "b", "c"} - {home}
    second = ring.next_available(key, others)
    assert second in others
    assert ring.next_available(key, {second}) == second
    assert ring.next_available(key, set()) is None
    assert ring.next_available(key, {"zzz"}) is None
    assert HashRing().lookup("k") is None


def test_hashes_are_stable_across_processes():
    code = ("from ray_geolb.policy.hash_ring import stable_hash64, HashRing; "
            "print(stable_hash64('abc'), HashRing(['x','y']).lookup('k'))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(outs) == 1
    assert outs.pop().split()[0] == str(stable_hash64("abc"))


def test_bad_virtual_nodes():
    with pytest.raises(ValueError, match="virtual_nodes"):
        HashRing(["a"], virtual_nodes=0)
