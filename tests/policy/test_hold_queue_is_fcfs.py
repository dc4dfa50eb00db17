"""The one FCFS hold queue (policy/hold_queue.py): arrival order, removal anywhere, and the prompt
tokens queued in all and ahead of an entry -- what the simulator's LB and GeoPrefixRouter count."""

import random
from types import SimpleNamespace

import pytest

from ray_geolb.policy.hold_queue import HoldQueue


def _q():
    return HoldQueue(lambda item: item.tokens)


def _item(n):
    return SimpleNamespace(tokens=n)


def test_arrival_order_head_and_token_sum():
    q = _q()
    assert not q and len(q) == 0 and q.head() is None and q.tokens == 0 and not q.is_head("a")
    for k, n in (("a", 100), ("b", 300), ("c", 50)):
        assert q.append(k, _item(n))
    assert list(q) == ["a", "b", "c"] and q.head()[0] == "a" and q.is_head("a") and not q.is_head("b")
    assert q.tokens == 450 and len(q) == 3 and "b" in q and q["b"].tokens == 300
    assert not q.append("b", _item(999)) and q.tokens == 450 and list(q) == ["a", "b", "c"]  # keeps its place
    k, it = q.pop_head()
    assert k == "a" and it.tokens == 100 and q.tokens == 350 and q.head()[0] == "b"


def test_remove_anywhere_and_ahead():
    q = _q()
    for i, n in enumerate((10, 20, 30, 40)):
        q.append(i, _item(n))
    assert q.ahead(0) == (0, 0) and q.ahead(2) == (2, 30) and q.ahead("newcomer") == (4, 100)
    assert q.remove(1).tokens == 20 and q.remove(1) is None
    assert list(q) == [0, 2, 3] and q.tokens == 80 and q.ahead(3) == (2, 40)
    assert [k for k, _ in q.items()] == [0, 2, 3]


def test_tokens_are_those_at_queueing_time_and_setitem_replaces_in_place():
    q = _q()
    a = _item(5)
    q.append("a", a)
    a.tokens = 500  # a later change of the item does not change what was counted
    assert q.tokens == 5
    q["b"] = _item(7)
    q["a"] = _item(1)
    assert list(q) == ["a", "b"] and q.tokens == 8
    assert q.pop_head()[0] == "a" and q.pop_head()[0] == "b" and q.tokens == 0
    with pytest.raises(KeyError):
        q.pop_head()


def test_the_sum_always_equals_a_fresh_sum():
    rng = random.Random(3)
    q, ref = _q(), {}
    for step in range(3000):
        op = rng.random()
        if op < 0.5:
            k, n = rng.randrange(60), rng.randrange(1, 5000)
            if q.append(k, _item(n)):
                ref[k] = n
        elif op < 0.75 and ref:
            k = rng.choice(list(ref))
            q.remove(k)
            del ref[k]
        elif ref:
            k, _ = q.pop_head()
            assert k == next(iter(ref))
            del ref[k]
        assert q.tokens == sum(ref.values()) and list(q) == list(ref)
        if ref:
            k = rng.choice(list(ref))
            keys = list(ref)
            assert q.ahead(k) == (keys.index(k), sum(ref[x] for x in keys[:keys.index(k)]))
