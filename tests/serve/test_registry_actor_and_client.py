"""RegionRegistry: pure state rules, then the real detached actor + RegistryClient on a local Ray."""

import asyncio
import json
import time

import pytest

from ray_geolb.policy.prefix_index import PrefixIndex
from ray_geolb.policy.region.peer_table import peer_states_from_table
from ray_geolb.policy.region.registry_state import RegistryState, trim_snapshot
from ray_geolb.policy.region.snapshot_sync import SnapshotWriter
from ray_geolb.serve.latency import LatencyInjector
from ray_geolb.serve.registry_client import RegistryClient


class FakeClock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def hb(region, avail=1, q=0, source=None, **kw):
    d = {"region": region, "available_replicas": avail, "queue_len": q}
    if source:
        d["source"] = source
    d.update(kw)
    return d


# ------------------------------------------------------------------ RegistryState
def test_heartbeat_batch_returns_table_with_ages():
    clk = FakeClock()
    st = RegistryState(clock=clk)
    t = st.heartbeat_batch([hb("us", 2, 0), hb("eu", 0, 3)])
    assert t["regions"]["us"]["available_replicas"] == 2
    assert t["regions"]["eu"]["queue_len"] == 3
    clk.t += 1.5
    t = st.table()
    assert t["regions"]["us"]["age_s"] == pytest.approx(1.5)


def test_sources_aggregate_max_available_sum_queue():
    clk = FakeClock()
    st = RegistryState(clock=clk, fresh_s=3.0)
    st.heartbeat_batch([hb("us", 1, 2, source="a"), hb("us", 3, 1, source="b")])
    e = st.table()["regions"]["us"]
    assert (e["available_replicas"], e["queue_len"], e["sources"]) == (3, 3, 2)
    clk.t += 4  # both stale; only "a" refreshes
    st.heartbeat_batch([hb("us", 0, 5, source="a")])
    e = st.table()["regions"]["us"]
    assert (e["available_replicas"], e["queue_len"]) == (0, 5)  # stale "b" no longer counts


def test_bad_items_are_skipped_not_fatal():
    st = RegistryState(clock=FakeClock())
    t = st.heartbeat_batch([{"region": ""}, hb("us", -1), hb("eu", 1), "junk", hb("asia", 1, rtts={"us": -3})])
    assert set(t["regions"]) == {"eu"}
    assert len(t["errors"]) == 4
    assert any("available_replicas" in e for e in t["errors"])
    assert st.rejected == 4


def test_with_a_secret_only_heartbeats_carrying_it_are_applied():
    secret = "s3cret-of-this-deployment"
    st = RegistryState(clock=FakeClock(), secret=secret)
    t = st.heartbeat_batch([hb("us", 2, token=secret), hb("eu", 5), hb("asia", 5, token="guess"),
                            hb("mars", 1, token=secret.encode().decode() + "x")])
    assert set(t["regions"]) == {"us"}  # a forged or unsigned heartbeat changes nothing
    assert st.unauthenticated == 3 and st.stats()["unauthenticated"] == 3 and st.heartbeats == 1
    assert all("GEOLB_REGISTRY_SECRET" in e for e in t["errors"])
    assert "token" not in str(st.table())  # the secret is never relayed to peers
    with pytest.raises(ValueError, match="at least 16"):
        RegistryState(secret="short")


def test_the_client_signs_its_heartbeats_from_the_environment(monkeypatch):
    from ray_geolb.policy.region.registry_state import SECRET_ENV

    monkeypatch.setenv(SECRET_ENV, "s3cret-of-this-deployment")
    sent = []

    class _Registry:
        async def call(self, method, items):
            sent.extend(items)
            return {"regions": {}}

    c = RegistryClient("us", "us/1", lambda: {"available_replicas": 1, "queue_len": 0}, lambda *a: None)
    c.call = _Registry().call
    assert asyncio.run(c.tick())
    assert sent[0]["token"] == "s3cret-of-this-deployment" and sent[0]["source"] == "us/1"


def test_heartbeat_extras_validated_aggregated_and_relayed():
    clk = FakeClock()
    st = RegistryState(clock=clk, fresh_s=3.0)
    st.heartbeat_batch([
        hb("us", 1, 1, source="a", extra={"queued_tokens": 100.0, "inflight": 3, "t_p_s": 1e-4, "replicas": 2}),
        hb("us", 1, 0, source="b", extra={"queued_tokens": 50, "inflight": 1, "t_p_s": 3e-4, "replicas": 2}),
        hb("eu", 2, 0),  # no extras: none in its entry
    ])
    t = st.table()
    assert t["regions"]["us"]["extra"] == {"queued_tokens": 150.0, "inflight": 4, "t_p_s": pytest.approx(2e-4),
                                           "replicas": 2}
    assert "extra" not in t["regions"]["eu"]
    peers = {p.region: p for p in peer_states_from_table(t, 50.0, "eu")}
    ex = peers["us"].extra
    assert ex["sources"] == 2 and ex["inflight"] == 4 and ex["replicas"] == 2 and isinstance(ex["replicas"], int)
    clk.t += 4  # only "a" refreshes: the stale source's extras no longer count
    st.heartbeat_batch([hb("us", 1, 0, source="a", extra={"queued_tokens": 10.0, "inflight": 0, "replicas": 2})])
    assert st.table()["regions"]["us"]["extra"] == {"queued_tokens": 10.0, "inflight": 0, "replicas": 2}


@pytest.mark.parametrize("extra, needle", [
    ([1, 2], "must be a dict"),
    ({"queued_tokens": -1}, "queued_tokens"),
    ({"inflight": float("nan")}, "finite"),
    ({"t_p_s": "fast"}, "t_p_s"),
    ({"replicas": True}, "replicas"),
    ({"": 1}, "field names"),
    ({"x" * 65: 1}, "field names"),
    ({f"k{i}": 1 for i in range(17)}, "at most 16"),
])
def test_bad_extras_reject_the_heartbeat_with_a_clear_error(extra, needle):
    st = RegistryState(clock=FakeClock())
    t = st.heartbeat_batch([hb("us", 1, extra=extra), hb("eu", 1)])
    assert set(t["regions"]) == {"eu"} and st.rejected == 1
    assert len(t["errors"]) == 1 and needle in t["errors"][0] and "heartbeat.extra" in t["errors"][0]


def test_a_heartbeat_is_dated_by_the_delay_it_declares():
    """``delay_s`` (half the sender's registry round trip) dates the figures to when they were measured, so
    a table's ``age_s`` and a reader's ``PeerState.timestamp`` are the measurement's, not the receipt's."""
    clk = FakeClock()
    clk.t = 10.0
    st = RegistryState(clock=clk)
    t = st.heartbeat_batch([dict(hb("au", 2), delay_s=0.15), hb("eu", 1)])
    assert t["regions"]["au"]["age_s"] == pytest.approx(0.15)
    assert t["regions"]["eu"]["age_s"] == pytest.approx(0.0)  # no delay declared: dated at its receipt
    # the table reaches "us" 0.1 s after it was made: the caller passes when it was made (RegistryClient)
    peers = {p.region: p for p in peer_states_from_table(t, made_at=10.0, own_region="us")}
    assert peers["au"].timestamp == pytest.approx(9.85) and peers["eu"].timestamp == pytest.approx(10.0)


@pytest.mark.parametrize("delay", [-0.1, float("nan"), float("inf"), 10.5, "0.1", True])
def test_a_bad_declared_delay_rejects_the_heartbeat_with_a_clear_error(delay):
    st = RegistryState(clock=FakeClock())
    t = st.heartbeat_batch([dict(hb("us", 1), delay_s=delay), hb("eu", 1)])
    assert set(t["regions"]) == {"eu"} and st.rejected == 1
    assert len(t["errors"]) == 1 and "heartbeat.delay_s" in t["errors"][0]


def test_peer_states_ignore_a_malformed_table_extra():
    table = {"regions": {"us": {"available_replicas": 1, "queue_len": 0, "age_s": 0.0, "sources": 1,
                                "extra": {"inflight": -3}}}, "rtts": {}}
    (ps,) = peer_states_from_table(table, 10.0, "eu")
    assert ps.extra == {"sources": 1} and ps.available_replicas == 1


def test_memory_bounds_regions_sources_and_stale_drop():
    clk = FakeClock()
    st = RegistryState(clock=clk, max_regions=3, max_sources_per_region=2, drop_after_s=10)
    for i, r in enumerate(["a", "b", "c", "d"]):
        clk.t += 1
        t = st.heartbeat_batch([hb(r, 1)])
    assert set(st.table()["regions"]) == {"a", "b", "c"}  # full: the new region is refused, none evicted
    assert t["refused"] == {"registry_full": 1} and "registry_full" in t["errors"][0]
    for s in ["s1", "s2", "s3"]:
        clk.t += 1
        t = st.heartbeat_batch([hb("b", 1, source=s)])
    assert st.table()["regions"]["b"]["sources"] == 2  # "b" (its own name) and s1; s2, s3 refused
    assert t["refused"] == {"sources_full": 1} and st.stats()["refused"] == {"registry_full": 1, "sources_full": 2}
    clk.t += 11
    st.heartbeat_batch([hb("d", 1)])
    assert set(st.table()["regions"]) == {"d"}  # regions not heard for drop_after_s are forgotten: room again


def test_rtts_stored_and_peer_states_use_own_measurement():
    clk = FakeClock()
    st = RegistryState(clock=clk)
    st.heartbeat_batch([hb("us", 1, rtts={"eu": 0.1, "asia": 0.17}), hb("eu", 2, rtts={"us": 0.12})])
    clk.t += 0.5
    t = st.table()
    peers = {p.region: p for p in peer_states_from_table(t, made_at=50.0, own_region="us")}
    assert set(peers) == {"eu"}
    assert peers["eu"].rtt_s == pytest.approx(0.1)
    assert peers["eu"].timestamp == pytest.approx(49.5)
    assert peers["eu"].available_replicas == 2
    # asia measures nothing itself: it gets us's measurement back
    st.heartbeat_batch([hb("asia", 1)])
    p = {p.region: p for p in peer_states_from_table(st.table(), 0.0, "asia")}
    assert p["us"].rtt_s == pytest.approx(0.17)


def _mirror(writer, state, snapshot, region="us", source="us/1", max_beats=100):
    """Heartbeat ``writer``'s deltas into ``state`` until the registry holds ``snapshot``; returns the
    JSON size in bytes of each heartbeat's delta."""
    sizes = []
    for _ in range(max_beats):
        delta = writer.delta(snapshot)
        if delta is None:
            return sizes
        sizes.append(len(json.dumps(delta)))
        table = state.heartbeat_batch([hb(region, 1, source=source, snapshot_delta=delta)])
        assert "errors" not in table, table["errors"]
        writer.acknowledge(table["snapshot_acks"][source])
    raise AssertionError("the snapshot never got across")


def _forwards(idx, lo, hi):
    for i in range(lo, hi):
        idx.insert(f"shared-system-prompt/{i % 37:04d}/{i:05d}/" + "x" * 40, "eu" if i % 2 else "asia", now=float(i))


def test_snapshot_mirrored_by_bounded_deltas_and_reloadable():
    idx = PrefixIndex(block_chars=8, growth=0.0)
    _forwards(idx, 0, 400)
    snap = idx.snapshot()
    n = len(snap["nodes"])
    st = RegistryState(clock=FakeClock())
    w = SnapshotWriter(max_rows=500)
    sizes = _mirror(w, st, snap)
    assert len(sizes) == -(-n // 500)  # cut into heartbeats of at most 500 rows each
    full = len(json.dumps(snap))
    assert max(sizes) < full / 2
    copy = PrefixIndex(block_chars=8, growth=0.0)
    copy.load_snapshot(st.snapshot("us"))
    copy.check_invariants()
    assert len(copy.snapshot()["nodes"]) == n
    # a few more forwards: the next heartbeat carries only the rows they changed
    _forwards(idx, 400, 410)
    snap2 = idx.snapshot()
    sizes2 = _mirror(w, st, snap2)
    assert len(sizes2) == 1 and sizes2[0] < full / 20, (sizes2, full)
    copy2 = PrefixIndex(block_chars=8, growth=0.0)
    copy2.load_snapshot(st.snapshot("us"))
    assert sorted(map(str, copy2.snapshot()["nodes"])) == sorted(map(str, snap2["nodes"]))
    assert w.delta(snap2) is None  # in sync: nothing to send
    assert st.table()["snapshot_versions"]["us"] == w.version


def test_registry_restart_or_lost_delta_makes_the_writer_reset():
    idx = PrefixIndex(block_chars=8, growth=0.0)
    _forwards(idx, 0, 100)
    st = RegistryState(clock=FakeClock())
    w = SnapshotWriter(max_rows=10_000)
    _mirror(w, st, idx.snapshot())
    # the registry restarts, empty: its reply acknowledges nothing from us
    st2 = RegistryState(clock=FakeClock())
    t = st2.heartbeat_batch([hb("us", 1, source="us/1")])
    w.acknowledge(t["snapshot_acks"]["us/1"])
    assert not w.in_sync()
    d = w.delta(idx.snapshot())
    assert d["reset"] and len(d["upsert"]) == len(idx.snapshot()["nodes"])
    # a delta whose base the registry does not hold is refused, the heartbeat's figures still apply
    _forwards(idx, 100, 105)
    stale = {**w.delta(idx.snapshot()), "base": 99, "reset": False}
    t = st2.heartbeat_batch([hb("us", 3, source="us/1", snapshot_delta=stale)])
    assert t["regions"]["us"]["available_replicas"] == 3
    assert any("reset" in e for e in t["errors"]) and t["snapshot_acks"]["us/1"] is None


@pytest.mark.parametrize("delta, needle", [
    ("junk", "must be a dict"),
    ({"version": 1, "reset": True, "geometry": [8, 0.0], "upsert": [[1, -1, 0, 8, {}]]}, "targets"),
    ({"version": 1, "reset": True, "geometry": [8, 0.0], "upsert": [[1, -1, 9, 8, {"eu": 1.0}]]}, "out of order"),
    ({"version": 1, "reset": False, "geometry": [8, 0.0]}, "base"),
    ({"version": 1, "reset": True, "geometry": [8, 0.0], "remove": list(range(11))}, "at most 10"),
])
def test_malformed_snapshot_deltas_are_refused_by_name(delta, needle):
    st = RegistryState(clock=FakeClock(), max_snapshot_rows=10)
    t = st.heartbeat_batch([hb("us", 2, source="us/1", snapshot_delta=delta)])
    assert t["regions"]["us"]["available_replicas"] == 2
    assert any(needle in e for e in t["errors"]), t["errors"]
    assert st.snapshot("us") is None


def test_whole_snapshots_are_refused_and_stored_copies_are_bounded():
    idx = PrefixIndex(block_chars=8, growth=0.0)
    _forwards(idx, 0, 200)
    snap = idx.snapshot()
    n = len(snap["nodes"])
    st = RegistryState(clock=FakeClock(), max_snapshot_nodes=n // 3)
    t = st.heartbeat_batch([hb("us", 1, snapshot=snap)])
    assert any("snapshot_delta" in e for e in t["errors"]) and st.snapshot("us") is None
    _mirror(SnapshotWriter(), st, snap)
    stored = st.snapshot("us")
    assert len(stored["nodes"]) == n // 3 and stored["trimmed_from"] == n
    idx2 = PrefixIndex(block_chars=8, growth=0.0)
    idx2.load_snapshot(stored)
    idx2.check_invariants()
    # the most recent forward (i=199, to eu) survives the trim
    assert idx2.longest(f"shared-system-prompt/{199 % 37:04d}/00199/" + "x" * 40)[0] == ["eu"]


def test_prefix_summaries_are_relayed_per_region_validated_and_bounded():
    from ray_geolb.policy.region.prefix_summary import PrefixSummary

    doc = "a long shared document about geography " * 60
    idx = PrefixIndex(block_chars=64, growth=0.125)
    idx.insert(doc, "r1", now=1.0)
    summary = PrefixSummary.build(idx)
    clk = FakeClock()
    st = RegistryState(clock=clk)
    st.heartbeat_batch([hb("eu", 1, source="eu/1", prefix_summary=summary.to_wire()), hb("us", 1)])
    clk.t += 1
    st.heartbeat_batch([hb("eu", 1, source="eu/1")])  # no summary this time: the last one is kept
    table = st.table()
    peers = {p.region: p for p in peer_states_from_table(table, 0.0, "us")}
    got = peers["eu"].prefix_summary
    assert got is not None and got.n == summary.n
    assert got.match(doc) == summary.match(doc) > len(doc) // 2
    assert peers["eu"].prefix_summary is not None and "us" not in table["prefix_summaries"]
    # a second ingress replica's newer summary is the one relayed (filters cannot be merged)
    idx.insert("another prompt entirely " * 30, "r1", now=2.0)
    newer = PrefixSummary.build(idx)
    st.heartbeat_batch([hb("eu", 1, source="eu/2", prefix_summary=newer.to_wire())])
    assert st.table()["prefix_summaries"]["eu"]["n"] == newer.n
    # malformed or oversized: refused by name, the heartbeat's figures still apply
    small = RegistryState(clock=clk, max_summary_bytes=50)
    t = small.heartbeat_batch([hb("eu", 2, source="eu/1", prefix_summary=summary.to_wire()),
                               hb("asia", 3, source="asia/1", prefix_summary={**summary.to_wire(), "k": 99})])
    assert t["regions"]["eu"]["available_replicas"] == 2 and t["regions"]["asia"]["available_replicas"] == 3
    assert any("eu/1" in e and "at most 50" in e for e in t["errors"]), t["errors"]
    assert any("asia/1" in e and "prefix_summary" in e for e in t["errors"]), t["errors"]
    assert t["prefix_summaries"] == {}


# ------------------------------------------------------------------ flooding
REAL = ("us", "eu", "asia")
#: the bound the docs state for a three-region deployment's registry (RegistryState.table_bound_bytes)
THREE_REGION_TABLE_BOUND = 67_121


def _real_heartbeats(summary_wire):
    """What the three real ingresses send: figures, RTTs to each other, cost extras and a prefix summary."""
    return [hb(r, 2 if r == "us" else 1, i, source=f"{r}/real", rtts={p: 0.1 for p in REAL if p != r},
               extra={"queued_tokens": 100.0 * i, "inflight": i, "t_p_s": 1e-4, "replicas": 1},
               prefix_summary=summary_wire) for i, r in enumerate(REAL)]


def _summary_wire():
    from ray_geolb.policy.region.prefix_summary import PrefixSummary

    idx = PrefixIndex(block_chars=64, growth=0.125)
    for i in range(300):
        idx.insert(f"document {i} " * 40, "r1", now=float(i))
    return PrefixSummary.build(idx).to_wire()


def _flood(fakes=200):
    """Heartbeats from a runaway or misconfigured client: 1 MB, 65-character, non-ASCII and control-character
    names, 200 well-formed fake regions with the largest figures, RTT tables and extras, fake sources."""
    huge = "x" * (1 << 20)
    bad_names = [huge, "r" * 65, "ü-region", "us\n", "us/1", "", " us", 12345, None, ["us"]]
    items = [hb(name, 1) for name in bad_names]
    items += [hb("us", 1, source=huge), hb("eu", 1, source="e" * 129), hb("asia", 1, source=b"asia/1")]
    big_extra = {f"k{i:02d}" + "z" * 61: 1e15 for i in range(16)}
    items += [hb(f"fake{i:03d}" + "f" * 57, 10**9, 10**9, source=f"fake{i:03d}/" + "s" * 100,
                 rtts={f"peer{j}" + "p" * 56: 9.99e14 for j in range(60)}, extra=big_extra)
              for i in range(fakes)]
    # junk in the fields of the real sources' own heartbeats: refused whole, or (the last two) the junk
    # part dropped and named (an RTT to an unknown peer, a snapshot delta) while the figures apply
    items += [hb("us", 10**5000, source="us/real"), hb("eu", 1, source="eu/real", extra={"inflight": 10**400}),
              hb("eu", 1, source="eu/real", extra={huge: 1.0}), hb("us", 2, source="us/real", rtts={huge: 0.1}),
              hb("asia", 1, source="asia/real", snapshot_delta={"version": 10**100, "reset": True})]
    return items


def _table_bytes(table):
    return len(json.dumps(table, separators=(",", ":")))


def test_a_flood_of_long_names_and_fake_regions_leaves_the_real_regions_and_a_bounded_table():
    clk = FakeClock()
    st = RegistryState(clock=clk, regions=REAL)
    assert st.table_bound_bytes() == THREE_REGION_TABLE_BOUND
    wire = _summary_wire()
    st.heartbeat_batch(_real_heartbeats(wire))
    sizes, replies = [], []
    flood = _flood()
    for i in range(0, len(flood), 32):  # in batches of MAX_BATCH_ITEMS (a larger batch: see below)
        clk.t += 0.1
        t = st.heartbeat_batch(flood[i:i + 32])
        sizes.append(_table_bytes(t))
        replies.append(t)
    t = st.heartbeat_batch(_real_heartbeats(wire))
    sizes.append(_table_bytes(t))
    assert set(t["regions"]) == set(REAL)  # the real regions stay, no fake one got in
    assert {r: t["regions"][r]["available_replicas"] for r in REAL} == {"us": 2, "eu": 1, "asia": 1}
    assert all(t["regions"][r]["sources"] == 1 for r in REAL)  # no flooded source got in
    assert t["rtts"] == {r: {p: 0.1 for p in REAL if p != r} for r in REAL}  # only known peers
    assert set(t["prefix_summaries"]) == set(REAL)
    assert max(sizes) <= st.table_bound_bytes() == THREE_REGION_TABLE_BOUND
    # every refusal typed and counted, the replies name why, and their error lines are short ASCII
    refused = st.stats()["refused"]
    assert refused["unknown_region"] == 200 and refused["bad_name"] >= 9 + 3, refused
    assert sum(refused.values()) == st.rejected == len(flood) - 2
    codes = set()
    for r in replies:
        codes |= set(r["refused"])
        assert all(len(e) <= 300 and e.isascii() for e in r["errors"]) and len(r["errors"]) <= 10
    assert codes == {"bad_name", "unknown_region", "malformed"}
    assert any("(1048576 characters)" in e for r in replies for e in r["errors"])
    # a single oversized batch: the first MAX_BATCH_ITEMS are read, the rest refused by name
    t = st.heartbeat_batch(_flood())
    assert t["refused"]["batch_too_large"] == 1 and _table_bytes(t) <= st.table_bound_bytes()
    assert set(t["regions"]) == set(REAL)


def test_without_a_region_list_a_full_registry_refuses_new_regions_and_never_evicts():
    """A bare RegistryState (the region list unknown): well-formed fakes fill the free places, then are
    refused; the real regions, heard first, keep theirs, and the table stays within the bound for
    ``max_regions`` regions."""
    clk = FakeClock()
    st = RegistryState(clock=clk)
    wire = _summary_wire()
    st.heartbeat_batch(_real_heartbeats(wire))
    flood = _flood()
    sizes = []
    for i in range(0, len(flood), 32):
        clk.t += 0.1
        sizes.append(_table_bytes(st.heartbeat_batch(flood[i:i + 32])))
        sizes.append(_table_bytes(st.heartbeat_batch(_real_heartbeats(wire))))
    t = st.table()
    assert set(REAL) <= set(t["regions"]) and len(t["regions"]) == st.max_regions == 64
    assert {r: t["regions"][r]["available_replicas"] for r in REAL} == {"us": 2, "eu": 1, "asia": 1}
    assert st.stats()["refused"]["registry_full"] == 200 - 61
    assert max(sizes) <= st.table_bound_bytes()
    # a fake region only leaves by not being heard from; the real ones, still heart-beating, stay
    clk.t += st.drop_after_s + 1
    t = st.heartbeat_batch(_real_heartbeats(wire))
    assert set(t["regions"]) == set(REAL)


def test_a_flood_of_sources_does_not_evict_a_live_source():
    clk = FakeClock()
    st = RegistryState(clock=clk, regions=REAL, max_sources_per_region=4)
    st.heartbeat_batch([hb("us", 2, source="us/real")])
    t = st.heartbeat_batch([hb("us", 0, source=f"us/fake{i}") for i in range(20)])
    assert t["refused"] == {"sources_full": 17} and st.table()["regions"]["us"]["sources"] == 4
    t = st.heartbeat_batch([hb("us", 2, source="us/real")])  # the live source keeps its place
    assert "refused" not in t and t["snapshot_acks"] == {"us/real": None}
    clk.t += st.drop_after_s + 1  # the fakes fall silent, age out, and a new real replica gets in
    st.heartbeat_batch([hb("us", 2, source="us/real")])
    t = st.heartbeat_batch([hb("us", 1, source="us/real2")])
    assert "refused" not in t and t["regions"]["us"]["sources"] == 2


def test_a_table_filled_to_every_bound_stays_within_the_stated_bound():
    """Names, figures, extras, RTTs, sources, acknowledgements and error lines all at their bounds, with
    prefix summaries of max_summary_bytes: the reply is within table_bound_bytes, which is not loose
    by more than a factor of two."""
    import base64

    clk = FakeClock()
    regions = [f"{i}" + "r" * 63 for i in range(3)]
    st = RegistryState(clock=clk, regions=regions, max_summary_bytes=16 * 1024)
    m = 8 * 12_000  # a well-formed summary just under 16 KB of JSON
    wire = {"v": 1, "geometry": [64, 0.125], "m": m, "k": 7, "n": 9000,
            "bits": base64.b64encode(bytes(range(256)) * (m // 8 // 256) + bytes(m // 8 % 256)).decode()}
    assert len(json.dumps(wire, separators=(",", ":"))) <= 16 * 1024
    extra = {f"k{i:02d}" + "z" * 61: 123456789.12345679 for i in range(16)}
    for r in regions:
        items = [hb(r, 10**9, 10**9, source=f"{r}/{j}" + "s" * 40,
                    rtts={p: 0.123456789012345 for p in regions if p != r}, extra=extra,
                    prefix_summary=wire, snapshot_delta={"version": 2**63, "reset": True, "geometry": [64, 0.125],
                                                         "upsert": [], "remove": []})
                 for j in range(22)]
        t = st.heartbeat_batch(items + [hb("x" * 400, 1)] * 10)
    size = _table_bytes(t)
    assert len(t["errors"]) == 10 and len(t["snapshot_acks"]) == 22
    assert st.table_bound_bytes() / 2 < size <= st.table_bound_bytes(), (size, st.table_bound_bytes())


@pytest.mark.parametrize("item, code", [
    (hb("r" * 65, 1), "bad_name"),
    (hb("us/1", 1), "bad_name"),
    (hb("ü", 1), "bad_name"),
    (hb("mars", 1), "unknown_region"),
    (hb("us", 1, source="s" * 129), "bad_name"),
    (hb("us", 1, source="us 1"), "bad_name"),
])
def test_bad_or_unknown_names_are_refused_by_a_typed_error(item, code):
    from ray_geolb.policy.region.registry_state import HeartbeatRefused, validate_region_name

    st = RegistryState(clock=FakeClock(), regions=REAL)
    t = st.heartbeat_batch([item, hb("eu", 1, source="eu/a1b2c3d4")])
    assert set(t["regions"]) == {"eu"} and t["refused"] == {code: 1} and t["errors"][0].startswith(code + ":")
    assert st.stats()["refused"] == {code: 1}
    with pytest.raises(HeartbeatRefused) as e:
        validate_region_name("r" * 65)
    assert e.value.code == "bad_name" and isinstance(e.value, ValueError)


def test_region_list_grows_by_add_regions_and_is_checked():
    st = RegistryState(clock=FakeClock(), regions=["us", "eu"])
    assert st.heartbeat_batch([hb("asia", 1)])["refused"] == {"unknown_region": 1}
    assert st.add_regions(["asia"]) == ["asia", "eu", "us"]
    assert "asia" in st.heartbeat_batch([hb("asia", 1)])["regions"]
    with pytest.raises(ValueError, match="max_regions"):
        RegistryState(regions=[f"r{i}" for i in range(5)], max_regions=4)
    with pytest.raises(ValueError, match="bad_name"):
        RegistryState(regions=["x" * 65])
    # a registry without a list takes the first list it is given: what it held outside it is forgotten
    open_st = RegistryState(clock=FakeClock())
    open_st.heartbeat_batch([hb("us", 1), hb("stray", 1)])
    open_st.add_regions(["us", "eu"])
    assert set(open_st.table()["regions"]) == {"us"} and open_st.stats()["regions_configured"] == ["eu", "us"]


def test_the_deployment_passes_its_regions_to_the_registry():
    from ray_geolb.serve.app import _registry_options

    opts = _registry_options(None, {"us": 2, "eu": 1, "asia": 1})
    assert opts["config"]["regions"] == {"asia": 1, "eu": 1, "us": 2}  # with their replica counts
    st = RegistryState(**opts["config"])  # a valid RegistryState config
    assert st.stats()["replicas_registered"] == {"asia": 1, "eu": 1, "us": 2}
    assert _registry_options({"config": {"regions": ["us", "eu", "asia", "au"]}},
                             {"us": 2, "eu": 1, "asia": 1})["config"]["regions"] == ["asia", "au", "eu", "us"]
    with pytest.raises(ValueError, match="lacks"):
        _registry_options({"config": {"regions": ["us"]}}, {"us": 2, "eu": 1})


def test_standby_registries_are_named_checked_and_pinned_as_the_apps_are():
    from pydantic import ValidationError

    from ray_geolb.serve.app import _registry_options, build_region_apps
    from ray_geolb.serve.ingress.config import IngressConfig, RegistryOptions

    regions = {"us": 2, "eu": 1, "asia": 1}
    assert RegistryOptions().standbys == [] and RegistryOptions().pin_standbys  # one registry by default
    assert _registry_options({"standbys": ["eu"]}, regions)["pin_standbys"] is True
    assert _registry_options({"standbys": ["eu"]}, regions, pin=False)["pin_standbys"] is False
    with pytest.raises(ValueError, match=r"standbys names region\(s\) \['mars'\]"):
        _registry_options({"standbys": ["mars"]}, regions)
    with pytest.raises(ValidationError, match="twice"):
        RegistryOptions(standbys=["eu", "eu"])
    with pytest.raises(ValueError, match="mars"):
        build_region_apps(regions, registry={"standbys": ["mars"]})
    apps = build_region_apps(regions, registry={"standbys": ["eu"]})
    assert all(IngressConfig.model_validate(a.config).registry.standbys == ["eu"] for a in apps)


def test_trim_keeps_parents():
    idx = PrefixIndex(block_chars=4, growth=0.0)
    for i in range(30):
        idx.insert("p" * 8 + f"{i:03d}" + "q" * 12, "r", now=float(i))
    snap = idx.snapshot()
    kept = trim_snapshot(snap, 10)
    keys = {row[0] for row in kept["nodes"]}
    for key, parent, *_ in kept["nodes"]:
        assert parent == -1 or parent in keys
    assert trim_snapshot(snap, 10**6) is snap
    with pytest.raises(ValueError, match="snapshot"):
        trim_snapshot({"nodes": []}, 5)


def test_config_validation():
    with pytest.raises(ValueError, match="max_regions"):
        RegistryState(max_regions=0)
    with pytest.raises(ValueError, match="drop_after_s"):
        RegistryState(drop_after_s=float("nan"))
    with pytest.raises(ValueError, match="period_s"):
        RegistryClient("us", "us/1", dict, lambda t, r: None, period_s=0)


# ------------------------------------------------------------------ latency injector (pure)
def test_latency_injector_defaults_and_scale():
    lat = LatencyInjector(scale=0.5)
    assert lat.rtt_s("us", "eu") == pytest.approx(0.098 * 0.5)
    assert lat.one_way_s("eu", "us") == pytest.approx(0.098 * 0.25)
    assert lat.rtt_s("us", "us") == 0
    lat.check_regions(["us", "eu", "asia"])
    with pytest.raises(ValueError, match="'us'<->'mars'"):
        lat.check_regions(["us", "mars"])
    LatencyInjector(scale=0).check_regions(["us", "mars"])  # injection off: nothing to check
    with pytest.raises(ValueError, match="scale"):
        LatencyInjector(scale=-1)
    with pytest.raises(ValueError, match="unknown keys"):
        LatencyInjector.from_spec({"scael": 1})
    custom = LatencyInjector.from_spec({"rtt_ms": {"a-b": 40, "b": {"c": 10}}, "scale": 1})
    assert custom.rtt_s("b", "a") == pytest.approx(0.04) and custom.rtt_s("c", "b") == pytest.approx(0.01)
    assert LatencyInjector.from_spec(custom.to_spec()).rtt_s("a", "b") == pytest.approx(0.04)


def test_latency_relay_delays_each_chunk():
    lat = LatencyInjector({"a,b": 200}, scale=1.0)  # one-way 0.1 s

    async def src():
        for i in range(3):
            yield i
            await asyncio.sleep(0.05)

    async def run():
        t0 = time.monotonic()
        out = []
        async for x in lat.relay(src(), "a", "b"):
            out.append((x, time.monotonic() - t0))
        return out

    out = asyncio.run(run())
    assert [x for x, _ in out] == [0, 1, 2]
    for i, (_, t) in enumerate(out):
        assert t == pytest.approx(0.1 + 0.05 * i, abs=0.04)


# ------------------------------------------------------------------ real actor + client
@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    from ray_geolb.serve.local import start_local_ray

    ctx = start_local_ray(num_cpus=1, prefix="rgR", namespace="geolb_test_registry")
    assert ctx.address_info["address"]  # our own cluster
    yield ray
    ray.shutdown()


@pytest.mark.ray
def test_actor_get_or_create_and_batch(ray_local):
    ray = ray_local
    from ray_geolb.serve.registry import get_or_create_registry

    a = get_or_create_registry(name="reg_t1", namespace="geolb_t")
    b = get_or_create_registry(name="reg_t1", namespace="geolb_t")
    assert a._actor_id == b._actor_id  # one named actor
    t = ray.get(a.heartbeat_batch.remote([hb("us", 2), hb("eu", 1, 4)]), timeout=30)
    assert t["regions"]["eu"]["queue_len"] == 4
    with pytest.raises(ValueError, match="max_regions"):
        get_or_create_registry(name="reg_bad", namespace="geolb_t", config={"max_regions": 0})
    ray.kill(a)


@pytest.mark.ray
def test_client_survives_registry_restart_and_goes_stale(ray_local):
    """Client keeps running while the registry is killed (and restarted by Ray); the table is
    rebuilt from the next heartbeats; with no registry at all the last table ages out."""
    ray = ray_local
    from ray_geolb.serve.registry import get_or_create_registry

    name, ns = "reg_t2", "geolb_t"
    actor = get_or_create_registry(name=name, namespace=ns)
    ray.get(actor.ping.remote(), timeout=30)

    async def main():
        tables = []
        us = RegistryClient("us", "us/1", lambda: {"available_replicas": 2, "queue_len": 0},
                            lambda t, r: tables.append((t, r)), name=name, namespace=ns, period_s=0.1,
                            timeout_s=0.5)
        eu = RegistryClient("eu", "eu/1", lambda: {"available_replicas": 1, "queue_len": 1, "rtts": {"us": 0.1}},
                            lambda t, r: None, name=name, namespace=ns, period_s=0.1, timeout_s=0.5)
        us.start()
        eu.start()
        await asyncio.sleep(1.0)
        assert us.connected and "eu" in us.last_table["regions"]
        # each leg is taken as half the round trip: declared by the next heartbeat, and the table is dated
        # that long before it arrived
        assert us.delay_s == pytest.approx(us.last_call_s / 2) and 0 < us.delay_s < 0.5
        assert tables[-1][1] == pytest.approx(us.last_ok - us.delay_s)
        before = us.successes
        ray.kill(actor, no_restart=False)  # Ray restarts it, empty
        t_kill = time.monotonic()
        while True:
            await asyncio.sleep(0.1)
            t = us.last_table
            if us.successes > before + 2 and t["uptime_s"] < time.monotonic() - t_kill + 0.5 and "eu" in t["regions"]:
                break
            assert time.monotonic() - t_kill < 30, f"registry state not rebuilt: {us.status()}"
        assert us.last_table["rtts"]["eu"]["us"] == pytest.approx(0.1)  # rebuilt from heartbeats
        # Now kill it for good: the client keeps the last table, which ages.
        ray.kill(actor, no_restart=True)
        await asyncio.sleep(0.1)
        eu_task = eu
        await eu_task.stop()
        tables.clear()
        await asyncio.sleep(0.3)
        # the client re-resolves and (create_if_missing) re-creates the registry: state empty of eu
        deadline = time.monotonic() + 30
        while not (tables and "eu" not in tables[-1][0]["regions"]):
            await asyncio.sleep(0.1)
            assert time.monotonic() < deadline, us.status()
        assert us.resolves >= 2
        peers = peer_states_from_table(us.last_table, time.monotonic(), "us")
        assert peers == []  # eu stopped heart-beating: it is gone from the new registry
        await us.stop()

    asyncio.run(main())
    ray.kill(ray.get_actor(name, namespace=ns))


@pytest.mark.ray
def test_client_without_registry_degrades(ray_local):
    async def main():
        got = []
        c = RegistryClient("us", "us/1", lambda: {"available_replicas": 1, "queue_len": 0},
                           lambda t, r: got.append(t), name="no_such_registry", namespace="geolb_t",
                           period_s=0.05, timeout_s=0.3, create_if_missing=False)
        c.start()
        await asyncio.sleep(0.6)
        assert not got and not c.connected and c.failures >= 2
        assert "no_such_registry" in (c.last_error or "") or "ValueError" in (c.last_error or "")
        await c.stop()

    asyncio.run(main())


@pytest.mark.ray
def test_the_actor_refuses_a_flood_and_a_client_adds_its_deployments_regions(ray_local):
    """The real actor: created with an older deployment's region list (us, asia), it refuses eu's first
    heartbeat as unknown_region; eu's RegistryClient, whose deployment lists eu, adds that list and is
    heard. Then a flood of long names and 200 fake regions: the real regions stay and every reply is
    within the stated bound."""
    ray = ray_local
    from ray_geolb.serve.registry import get_or_create_registry

    name, ns = "reg_flood", "geolb_t"
    actor = get_or_create_registry(name=name, namespace=ns, config={"regions": ["us", "asia"]})
    wire = _summary_wire()
    ray.get(actor.heartbeat_batch.remote([h for h in _real_heartbeats(wire) if h["region"] != "eu"]), timeout=30)

    async def main():
        eu = RegistryClient("eu", "eu/real", lambda: {"available_replicas": 1, "queue_len": 0}, lambda t, r: None,
                            name=name, namespace=ns, period_s=0.1, timeout_s=2.0,
                            registry_config={"regions": list(REAL)})
        eu.start()
        deadline = time.monotonic() + 30
        while not (eu.last_table and "eu" in eu.last_table["regions"]):
            await asyncio.sleep(0.1)
            assert time.monotonic() < deadline, eu.status()
        assert eu.status()["refused"] >= 1 and "unknown_region" in eu.status()["last_refusal"]
        await eu.stop()

    asyncio.run(main())
    flood = _flood()
    sizes = [_table_bytes(ray.get(actor.heartbeat_batch.remote(flood[i:i + 32]), timeout=60))
             for i in range(0, len(flood), 32)]
    t = ray.get(actor.heartbeat_batch.remote(_real_heartbeats(wire)), timeout=30)
    stats = ray.get(actor.stats.remote(), timeout=30)
    assert set(t["regions"]) == set(REAL) and set(t["prefix_summaries"]) == set(REAL)
    assert {r: t["regions"][r]["available_replicas"] for r in REAL} == {"us": 2, "eu": 1, "asia": 1}
    assert stats["regions_configured"] == sorted(REAL) and stats["refused"]["unknown_region"] >= 200
    assert max(sizes + [_table_bytes(t)]) <= stats["table_bound_bytes"] == THREE_REGION_TABLE_BOUND
    ray.kill(actor)


@pytest.mark.ray
def test_a_standby_registry_keeps_the_tables_coming_when_the_primary_is_gone(ray_local):
    """Two regions' clients heartbeat to the primary registry and to a standby (its own actor). The
    standby hears both, gets no snapshot (the primary alone mirrors it), and hands its tables to
    ``on_standby_table``. With the primary killed for good, the standby's tables keep coming, with the
    other region's figures fresh, and the standby's link reports itself connected."""
    ray = ray_local
    from ray_geolb.serve.clock import policy_now
    from ray_geolb.serve.registry import get_or_create_registry, standby_name

    name, ns = "reg_standby", "geolb_t"
    primary = get_or_create_registry(name=name, namespace=ns)
    standby = get_or_create_registry(name=standby_name(name, "eu"), namespace=ns)
    ray.get([primary.ping.remote(), standby.ping.remote()], timeout=30)
    idx = PrefixIndex(block_chars=8, growth=0.0)
    _forwards(idx, 0, 40)
    writer = SnapshotWriter(max_rows=500)

    def us_report():
        out = {"available_replicas": 2, "queue_len": 0}
        delta = writer.delta(idx.snapshot())
        if delta is not None:
            out["snapshot_delta"] = delta
        return out

    async def main():
        got = {"us": [], "eu": []}

        def client(region, report):
            return RegistryClient(region, f"{region}/1", report, lambda t, r: got[region].append(("primary", t, r)),
                                  name=name, namespace=ns, period_s=0.1, timeout_s=0.5, create_if_missing=False,
                                  standbys=[(standby_name(name, "eu"), None)],
                                  on_standby_table=lambda t, r: got[region].append(("standby", t, r)))

        us = client("us", us_report)
        eu = client("eu", lambda: {"available_replicas": 1, "queue_len": 3})
        us.start()
        eu.start()
        try:
            await asyncio.sleep(1.5)
            for c in (us, eu):
                st = c.status()["standbys"][standby_name(name, "eu")]
                assert c.connected and st["connected"] and st["successes"] >= 3, c.status()
            stats_p, stats_s = ray.get([primary.stats.remote(), standby.stats.remote()], timeout=30)
            assert stats_p["snapshot_nodes"].get("us", 0) > 0 and not stats_s["snapshot_nodes"]
            ray.kill(primary, no_restart=True)
            killed = policy_now()  # the clock tables are dated on
            await asyncio.sleep(1.5)
            assert not [r for kind, t, r in got["us"] if kind == "primary" and r > killed + 0.1]
            late = [(t, r) for kind, t, r in got["us"] if kind == "standby" and r > killed + 0.5]
            assert len(late) >= 3, us.status()
            peers = peer_states_from_table(late[-1][0], late[-1][1], "us")
            assert [(p.region, p.available_replicas, p.queue_len) for p in peers] == [("eu", 1, 3)]
            # fresh: measured after the primary died, so eu's heartbeats reached us through the standby (a fixed
            # age bound raced a loaded machine)
            assert killed < peers[0].timestamp <= policy_now(), (killed, peers[0].timestamp)
            assert not us.connected and us.status()["standbys"][standby_name(name, "eu")]["connected"]
        finally:  # the clients stop whatever failed (their ticks would otherwise outlive the test)
            await us.stop()
            await eu.stop()

    asyncio.run(main())
    ray.kill(standby)
