"""Mirroring a region's regional snapshot into the registry by deltas, both ends of the protocol.

The regional snapshot (SkyLB's record of which prefix this region forwarded where: a
:class:`~ray_geolb.policy.prefix_index.PrefixIndex`) is mirrored into the registry only so that a
restarted ingress can reload it. It can hold tens of thousands of nodes (4 MB as JSON), so a
heartbeat never carries all of it: each heartbeat carries at most ``max_rows`` changed rows.

* :class:`SnapshotWriter` (in the ingress, ``PeerMesh``): compares the snapshot with what it last
  sent and sends the difference as a **delta** -- rows to upsert (a row is
  ``[key, parent, start, end, {target: last_used}]``, one per block, hashes only) and keys to remove
  -- based on the version the registry acknowledged. Parents go before their children and removals
  before upserts, so a delta cut at ``max_rows`` is a consistent prefix of the whole one; the rest
  goes with the next heartbeat. When the registry's acknowledgement is not the version it expects
  (the registry restarted, another ingress replica wrote, a heartbeat was lost), the next delta is a
  ``reset``: the whole snapshot again, in chunks.
* :class:`SnapshotStore` (in the registry, ``RegistryState``): applies a delta when its ``base`` is
  the version stored for that source (else it is refused and the writer resets), bounds the stored
  rows (most recently used kept, parents before children: ``trim_snapshot``) and serves the most
  recently written source's snapshot of a region to a restarted ingress.

Wire format of a delta (the heartbeat's ``snapshot_delta``)::

    {"version": int, "base": int or None, "reset": bool, "geometry": [block_chars, growth],
     "upsert": [[key, parent, start, end, {target: ts}], ...], "remove": [key, ...], "more": bool}

``more`` says the writer has more rows to send for this version (the stored copy is partial until a
delta with ``more`` false arrives). The acknowledgement is ``table["snapshot_acks"][source]``, in the
reply to every heartbeat: the version the registry now holds for that source (None: nothing).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

__all__ = ["DEFAULT_MAX_ROWS", "SnapshotStore", "SnapshotWriter", "trim_snapshot", "validate_delta"]

#: rows (upserts + removals) one heartbeat may carry: ~100 bytes each as JSON, so ~200 KB at most
DEFAULT_MAX_ROWS = 2000


def trim_snapshot(snap: Optional[dict], max_nodes: int) -> Optional[dict]:
    """Keep at most ``max_nodes`` nodes of a ``PrefixIndex.snapshot()``: the most recently used ones.

    A parent was touched at least as recently as any of its children (inserts touch the whole path),
    and among equal times shorter (parent) nodes sort first, so a parent is never dropped while one
    of its children is kept.
    """
    if snap is None:
        return None
    if not isinstance(snap, dict) or "nodes" not in snap or "geometry" not in snap:
        raise ValueError("snapshot must be a PrefixIndex.snapshot() dict with 'geometry' and 'nodes'")
    nodes = snap["nodes"]
    if len(nodes) <= max_nodes:
        return snap
    kept = sorted(nodes, key=_recency)[:max_nodes]
    return {"geometry": snap["geometry"], "nodes": kept, "trimmed_from": len(nodes)}


def _recency(row):
    targets = row[4] or {}
    return (-max(targets.values(), default=0.0), row[3])


def _int(x, what: str) -> int:
    """An integer of at most 64 bits and a sign (keys are 64-bit hashes; versions count up)."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise ValueError(f"{what} must be an integer, got {type(x).__name__}")
    if not -(1 << 64) < x < (1 << 64):
        raise ValueError(f"{what} must fit in 64 bits, got an integer of {x.bit_length()} bits")
    return x


def _row(row, what: str) -> list:
    if not isinstance(row, (list, tuple)) or len(row) != 5:
        raise ValueError(f"{what} must be [key, parent, start, end, {{target: ts}}]")
    key, parent, start, end, targets = row
    for name, v in (("key", key), ("parent", parent), ("start", start), ("end", end)):
        _int(v, f"{what}.{name}")
    if not 0 <= start < end:
        raise ValueError(f"{what}: start {start} / end {end} out of order")
    if not isinstance(targets, dict) or not targets or len(targets) > 1024:
        raise ValueError(f"{what}.targets must be a non-empty dict of at most 1024 {{target: time}}")
    clean = {}
    for t, ts in targets.items():
        if not isinstance(t, str) or not 0 < len(t) <= 256:
            raise ValueError(f"{what}.targets: names must be strings of 1-256 characters")
        if (isinstance(ts, bool) or not isinstance(ts, (int, float)) or not -1e18 < ts < 1e18
                or not math.isfinite(ts)):
            raise ValueError(f"{what}.targets[{t!r}] must be a finite number")
        clean[t] = float(ts)
    return [key, parent, start, end, clean]


def validate_delta(delta, max_rows: int) -> dict:
    """A heartbeat's ``snapshot_delta``, validated (see the module docstring). Raises ValueError naming
    the problem; a delta with more than ``max_rows`` rows is refused whole."""
    if not isinstance(delta, dict):
        raise ValueError(f"snapshot_delta must be a dict, got {type(delta).__name__}")
    version = _int(delta.get("version"), "snapshot_delta.version")
    reset = delta.get("reset", False)
    if not isinstance(reset, bool):
        raise ValueError("snapshot_delta.reset must be true or false")
    base = delta.get("base")
    if not reset:
        _int(base, "snapshot_delta.base")
    geometry = delta.get("geometry")
    if (not isinstance(geometry, (list, tuple)) or len(geometry) != 2
            or not all(isinstance(g, (int, float)) and not isinstance(g, bool) for g in geometry)):
        raise ValueError("snapshot_delta.geometry must be [block_chars, growth]")
    upsert, remove = delta.get("upsert") or [], delta.get("remove") or []
    if not isinstance(upsert, list) or not isinstance(remove, list):
        raise ValueError("snapshot_delta.upsert and .remove must be lists")
    if len(upsert) + len(remove) > max_rows:
        raise ValueError(f"snapshot_delta carries {len(upsert) + len(remove)} rows; at most {max_rows} per heartbeat")
    return {"version": version, "base": base, "reset": reset, "geometry": list(geometry),
            "upsert": [_row(r, f"snapshot_delta.upsert[{i}]") for i, r in enumerate(upsert)],
            "remove": [_int(k, f"snapshot_delta.remove[{i}]") for i, k in enumerate(remove)],
            "more": bool(delta.get("more", False))}


class SnapshotStore:
    """The registry's copies of the regions' snapshots: per region, per source (ingress replica), at
    most ``max_sources`` sources (least recently written dropped) of at most ``max_nodes`` rows."""

    def __init__(self, max_nodes: int = 20_000, max_rows: int = 5 * DEFAULT_MAX_ROWS, max_sources: int = 4):
        self.max_nodes = max_nodes
        self.max_rows = max_rows
        self.max_sources = max_sources
        # region -> source -> {"version", "geometry", "rows": {key: row}, "t", "complete", "trimmed"}
        self._by_region: Dict[str, Dict[str, dict]] = {}
        self.refused = 0
        self.rows_received = 0

    def apply(self, region: str, source: str, delta, now: float) -> Tuple[Optional[int], Optional[str]]:
        """Apply one delta. Returns ``(the version now stored for the source, error or None)``: a
        malformed delta or one whose base is not the stored version is refused (the writer resets)."""
        srcs = self._by_region.get(region, {})
        cur = srcs.get(source)
        held = None if cur is None else cur["version"]
        try:
            d = validate_delta(delta, self.max_rows)
        except ValueError as e:
            self.refused += 1
            return held, str(e)
        if not d["reset"] and (cur is None or d["base"] != cur["version"] or d["geometry"] != cur["geometry"]):
            self.refused += 1
            return held, (f"snapshot delta from {source!r} is based on version {d['base']}, the registry holds "
                          f"{held}: send it again from scratch (reset)")
        if d["reset"] or cur is None:
            cur = {"rows": {}, "trimmed": 0}
        rows = cur["rows"]
        for k in d["remove"]:
            rows.pop(k, None)
        for r in d["upsert"]:
            rows[r[0]] = r
        self.rows_received += len(d["upsert"]) + len(d["remove"])
        if len(rows) > self.max_nodes:
            kept = sorted(rows.values(), key=_recency)[: self.max_nodes]
            cur["trimmed"] += len(rows) - len(kept)
            cur["rows"] = {r[0]: r for r in kept}
        cur.update(version=d["version"], geometry=d["geometry"], t=now, complete=not d["more"])
        srcs = self._by_region.setdefault(region, {})
        srcs[source] = cur
        if len(srcs) > self.max_sources:
            del srcs[min(srcs, key=lambda s: srcs[s]["t"])]
        return d["version"], None

    def snapshot(self, region: str) -> Optional[dict]:
        """The region's snapshot as ``PrefixIndex.load_snapshot`` reads it: its most recently written
        complete copy (else the most recent partial one), or None."""
        srcs = self._by_region.get(region)
        if not srcs:
            return None
        cur = max(srcs.values(), key=lambda c: (c["complete"], c["t"]))
        out = {"geometry": list(cur["geometry"]), "nodes": list(cur["rows"].values())}
        if cur["trimmed"]:
            out["trimmed_from"] = len(cur["rows"]) + cur["trimmed"]
        return out

    def held(self, region: str, source: str) -> Optional[int]:
        """The version stored for ``source`` of ``region`` (None: nothing from it)."""
        cur = self._by_region.get(region, {}).get(source)
        return None if cur is None else cur["version"]

    def version(self, region: str) -> Optional[int]:
        """The version of the copy :meth:`snapshot` serves (None: none stored)."""
        srcs = self._by_region.get(region)
        if not srcs:
            return None
        return max(srcs.values(), key=lambda c: (c["complete"], c["t"]))["version"]

    def versions(self) -> Dict[str, int]:
        return {r: v for r in self._by_region if (v := self.version(r)) is not None}

    def nodes(self) -> Dict[str, int]:
        return {r: sum(len(c["rows"]) for c in srcs.values()) for r, srcs in self._by_region.items()}

    def forget(self, region: str, source: Optional[str] = None) -> None:
        if source is None:
            self._by_region.pop(region, None)
            return
        srcs = self._by_region.get(region)
        if srcs is not None:
            srcs.pop(source, None)
            if not srcs:
                del self._by_region[region]


class SnapshotWriter:
    """The ingress's side: what it last sent, and the next delta (see the module docstring)."""

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS):
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be a positive integer, got {max_rows!r}")
        self.max_rows = max_rows
        self.version = 0
        self._sent: Dict[int, list] = {}  # what the registry holds from us, as we sent it
        self._acked: Optional[int] = None  # the version the registry last said it holds for us
        self._pending = False  # a delta was cut at max_rows: the rest is still to go
        self.sent_rows = 0
        self.resets = 0

    def acknowledge(self, version: Optional[int]) -> None:
        """The registry's acknowledgement from a heartbeat reply (``table["snapshot_acks"][source]``;
        None: it holds nothing from us)."""
        self._acked = version

    @property
    def pending(self) -> bool:
        """Rows of a cut delta are still to be sent (send the next heartbeat without waiting)."""
        return self._pending

    def in_sync(self) -> bool:
        return self._acked is not None and self._acked == self.version

    def delta(self, snapshot: dict) -> Optional[dict]:
        """The next delta towards ``snapshot`` (a ``PrefixIndex.snapshot()``), or None if the registry
        already holds it."""
        rows = {r[0]: r for r in snapshot["nodes"]}
        reset = not self.in_sync()
        if reset:
            if not rows and self._acked is None and self.version == 0:
                return None  # nothing ever forwarded: nothing to mirror
            self._sent = {}
            self.resets += self.version > 0
        remove = [k for k in self._sent if k not in rows]
        upsert = sorted((r for k, r in rows.items() if self._sent.get(k) != r), key=lambda r: r[3])
        if not reset and not remove and not upsert:
            self._pending = False
            return None
        cut_remove = remove[: self.max_rows]
        cut_upsert = upsert[: self.max_rows - len(cut_remove)]
        more = len(cut_remove) + len(cut_upsert) < len(remove) + len(upsert)
        base, self.version = self.version, self.version + 1
        for k in cut_remove:
            del self._sent[k]
        for r in cut_upsert:
            self._sent[r[0]] = r
        self._pending = more
        self.sent_rows += len(cut_remove) + len(cut_upsert)
        return {"version": self.version, "base": None if reset else base, "reset": reset,
                "geometry": list(snapshot["geometry"]), "upsert": [list(r) for r in cut_upsert],
                "remove": cut_remove, "more": more}

