"""The sibling-insert channel without Ray: a router's dispatches and forwards become hash-only rows, the
registry's ring relays each source's rows to its region's other sources (never back, never to another
region), bounded, and a reader rebuilds the same prefix index entries from them."""

from __future__ import annotations

import pytest

from policy_cases import FIXED, P, region, rq
from ray_geolb.policy import build_policy
from ray_geolb.policy.region import GEOPREFIX_COST
from ray_geolb.policy.region.registry_state import RegistryState
from ray_geolb.policy.region.sibling_inserts import (
    MAX_ROWS_PER_HEARTBEAT,
    SiblingOutbox,
    SiblingRing,
    check_rows,
    prepared_from_row,
)


def _hb(source, rows=None, cursor=None, region="us"):
    return {"region": region, "source": f"{region}/{source}", "available_replicas": 1, "queue_len": 0,
            "sibling_cursor": cursor, "sibling_inserts": rows or []}


def test_a_dispatch_row_carries_no_text_and_teaches_a_sibling_the_same_match():
    a = build_policy({"name": "geoprefix", "prefix": FIXED}, targets=["t0", "t1"])
    b = build_policy({"name": "geoprefix", "prefix": FIXED}, targets=["t0", "t1"])
    a.sibling_outbox = SiblingOutbox()
    secret = P + " my private question"
    a.on_dispatch(rq(1, secret), "t1", 1.0)
    (row,) = a.sibling_outbox.take()
    assert row[0] == "d" and row[1] == "t1" and row[2] == len(secret)
    assert b"private" not in row[3] and isinstance(row[3], bytes)
    assert b.learn_sibling_dispatch(prepared_from_row(b.index, row), "t1", 2.0)
    assert b.index.match(P + " another") == a.index.match(P + " another")
    # a router without an outbox (one router per region) keeps no rows
    c = build_policy({"name": "geoprefix", "prefix": FIXED}, targets=["t0"])
    c.on_dispatch(rq(2, secret), "t0", 1.0)
    assert c.sibling_outbox is None


def test_a_disabled_outbox_keeps_nothing_until_enabled():
    """A router whose rows nobody takes (no region ingress sharing them) keeps none."""
    a = build_policy({"name": "geoprefix", "prefix": FIXED}, targets=["t0"])
    a.sibling_outbox = box = SiblingOutbox(enabled=False)
    a.on_dispatch(rq(1, P + " one"), "t0", 1.0)
    assert len(box) == 0 and box.take() == []
    box.enabled = True
    a.on_dispatch(rq(2, P + " two"), "t0", 2.0)
    assert len(box) == 1 and box.added == 1


def test_a_forward_row_enters_a_siblings_regional_snapshot():
    us1 = region(remote="cost", cost=GEOPREFIX_COST.model_dump(exclude_unset=True))
    us2 = region(remote="cost", cost=GEOPREFIX_COST.model_dump(exclude_unset=True))
    us1.sibling_outbox = SiblingOutbox()
    us1.on_forward(rq(1, P + " forwarded"), "eu", 1.0)
    (row,) = us1.sibling_outbox.take()
    assert row[:2] == ("f", "eu")
    us2.learn_sibling_forward(prepared_from_row(us2.snapshot, row), "eu", 1.5)
    assert us2.snapshot.match(P + " next") == us1.snapshot.match(P + " next") != {}


def test_a_row_of_another_geometry_is_refused_by_name():
    a = build_policy({"name": "geoprefix", "prefix": FIXED}, targets=["t0"])
    b = build_policy({"name": "geoprefix", "prefix": dict(FIXED, block_chars=32)}, targets=["t0"])
    a.sibling_outbox = SiblingOutbox()
    a.on_dispatch(rq(1, "y" * 1000), "t0", 1.0)
    (row,) = a.sibling_outbox.take()
    with pytest.raises(ValueError, match="geometry"):
        prepared_from_row(b.index, row)


def test_the_ring_relays_rows_to_siblings_only_once_each_and_never_back():
    ring = SiblingRing(max_rows=100)
    r1 = ("d", "t1", 64, b"\x01" * 8)
    r2 = ("d", "t0", 64, b"\x02" * 8)
    reply_a, err = ring.exchange("us", "a", [r1], None)
    assert err is None and reply_a["rows"] == [] and not reply_a["more"]
    reply_b, _ = ring.exchange("us", "b", [r2], None)
    assert reply_b["rows"] == [r1]  # a's row reaches b ...
    reply_a, _ = ring.exchange("us", "a", [], reply_a["cursor"])
    assert reply_a["rows"] == [r2]  # ... b's reaches a, and a never gets its own back
    again, _ = ring.exchange("us", "a", [], reply_a["cursor"])
    assert again["rows"] == []
    eu, _ = ring.exchange("eu", "c", [], None)
    assert eu["rows"] == []  # another region's rows stay there
    # a cursor of another epoch (a restarted registry) reads from the ring's start
    stale, _ = ring.exchange("us", "b", [], [ring.epoch + 1, 10**6])
    assert stale["rows"] == [r1]


def test_the_ring_is_bounded_and_a_slow_reader_pages_through_it():
    ring = SiblingRing(max_rows=50, max_reply_rows=20)
    rows = [("d", "t0", 64, i.to_bytes(8, "little")) for i in range(300)]
    for i in range(0, 300, 30):
        ring.exchange("us", "a", rows[i:i + 30], None)
    assert ring.rows() <= 100  # trimmed in chunks to max_rows
    got, cursor, more = [], None, True
    while more:
        reply, _ = ring.exchange("us", "b", [], cursor)
        assert len(reply["rows"]) <= 20
        got += reply["rows"]
        cursor, more = reply["cursor"], reply["more"]
    assert got == rows[-len(got):] and len(got) >= 50  # the newest rows, in order, none twice


@pytest.mark.parametrize("rows, named", [
    ("nope", "must be a list"),
    ([("x", "t0", 1, b"")], "kind"),
    ([("d", "", 1, b"")], "target"),
    ([("d", "t0", -1, b"")], "length"),
    ([("d", "t0", 1, b"123")], "keys"),
    ([("d", "t0", 1, "text, not keys")], "keys"),
    ([("d", "t0", 1, b"")] * (MAX_ROWS_PER_HEARTBEAT + 1), "at most"),
])
def test_malformed_rows_are_refused_by_name_and_the_reply_still_comes(rows, named):
    with pytest.raises(ValueError, match=named):
        check_rows(rows)
    reg = RegistryState()
    table = reg.heartbeat_batch([_hb("a", rows)])
    assert "us" in table["regions"]  # the heartbeat itself applied
    assert table["sibling_inserts"]["us/a"]["rows"] == []
    assert any("sibling_inserts refused" in e and named.split()[0] in e for e in table["errors"]), table["errors"]
    assert reg.stats()["sibling_rows"] == 0


def test_the_registry_relays_siblings_rows_in_each_sources_reply_and_forgets_a_silent_region():
    t = [0.0]
    reg = RegistryState(clock=lambda: t[0], drop_after_s=10.0)
    row = ("d", "t1", 64, b"\x07" * 8)
    table = reg.heartbeat_batch([_hb("a", [row]), _hb("b")])
    assert table["sibling_inserts"]["us/b"]["rows"] == [row]
    assert table["sibling_inserts"]["us/a"]["rows"] == []
    # a heartbeat without a cursor (one ingress replica) takes no part
    table = reg.heartbeat_batch([{"region": "us", "source": "us/solo", "available_replicas": 1}])
    assert "sibling_inserts" not in table
    assert reg.stats()["sibling_rows_relayed"] == 1
    t[0] = 100.0
    reg.heartbeat_batch([{"region": "eu", "available_replicas": 1}])
    assert reg.stats()["sibling_rows"] == 0
