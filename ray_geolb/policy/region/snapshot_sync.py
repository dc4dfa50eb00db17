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

from typing import Annotated, Dict, List, Optional, Tuple, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ray_geolb.policy.region.heartbeat import first_error

__all__ = ["DEFAULT_MAX_ROWS", "SnapshotDelta", "SnapshotRow", "SnapshotStore", "SnapshotWriter", "trim_snapshot",
           "validate_delta"]

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


#: keys, parents, block offsets and versions: integers of at most 64 bits and a sign (keys are 64-bit
#: hashes; versions count up)
Int64 = Annotated[int, Field(strict=True, gt=-(1 << 64), lt=1 << 64)]
#: a row's targets: ``{target: last used}``, 1-1024 of them, names of 1-256 characters, finite times
Targets = Annotated[Dict[Annotated[str, Field(strict=True, min_length=1, max_length=256)],
                         Annotated[float, Field(strict=True, gt=-1e18, lt=1e18, allow_inf_nan=False)]],
                    Field(min_length=1, max_length=1024)]
_ROW_SHAPE = "[key, parent, start, end, {target: ts}]"


class SnapshotRow(BaseModel):
    """One node of the snapshot, ``[key, parent, start, end, {target: last used}]`` on the wire."""

    model_config = ConfigDict(frozen=True)

    key: Int64
    parent: Int64
    start: Int64
    end: Int64
    targets: Targets

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, row):
        if not isinstance(row, (list, tuple)) or len(row) != 5:
            raise PydanticCustomError("malformed", "must be {shape}", {"shape": _ROW_SHAPE})
        return dict(zip(("key", "parent", "start", "end", "targets"), row))

    @model_validator(mode="after")
    def _in_order(self):
        if not 0 <= self.start < self.end:
            raise PydanticCustomError("malformed", "start {start} / end {end} out of order",
                                      {"start": self.start, "end": self.end})
        return self

    def wire(self) -> list:
        return [self.key, self.parent, self.start, self.end, self.targets]


class SnapshotDelta(BaseModel):
    """A heartbeat's ``snapshot_delta`` (the wire format: see the module docstring). Validation context:
    ``max_rows``, the most rows (upserts + removals) one delta may carry: a larger one is refused whole,
    before its rows are read."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Int64
    #: the version this delta applies to; required unless ``reset``
    base: Optional[Int64] = None
    reset: bool = Field(False, strict=True)
    geometry: Tuple[Union[StrictInt, StrictFloat], Union[StrictInt, StrictFloat]]
    upsert: List[SnapshotRow] = Field(default_factory=list)
    remove: List[Int64] = Field(default_factory=list)
    #: the writer has more rows for this version (anything true)
    more: Annotated[bool, BeforeValidator(bool)] = False

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, delta, info: ValidationInfo):
        if not isinstance(delta, dict):
            raise PydanticCustomError("malformed", "must be a dict, got {got}", {"got": type(delta).__name__})
        upsert, remove = delta.get("upsert") or [], delta.get("remove") or []
        if not isinstance(upsert, list) or not isinstance(remove, list):
            raise PydanticCustomError("malformed", "upsert and .remove must be lists")
        most = (info.context or {}).get("max_rows")
        if most is not None and len(upsert) + len(remove) > most:
            raise PydanticCustomError("malformed", "carries {n} rows; at most {most} per heartbeat",
                                      {"n": len(upsert) + len(remove), "most": most})
        return {**delta, "upsert": upsert, "remove": remove}

    @model_validator(mode="after")
    def _based(self):
        if not self.reset and self.base is None:
            raise PydanticCustomError("malformed", "base must be an integer unless reset is true")
        return self


def validate_delta(delta, max_rows: int) -> SnapshotDelta:
    """A heartbeat's ``snapshot_delta`` read as a :class:`SnapshotDelta`. Raises ValueError naming the
    field; a delta with more than ``max_rows`` rows is refused whole."""
    try:
        return SnapshotDelta.model_validate(delta, context={"max_rows": max_rows})
    except ValidationError as e:
        raise ValueError(first_error(e, "snapshot_delta")[1]) from None


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
        geometry = list(d.geometry)
        if not d.reset and (cur is None or d.base != cur["version"] or geometry != cur["geometry"]):
            self.refused += 1
            return held, (f"snapshot delta from {source!r} is based on version {d.base}, the registry holds "
                          f"{held}: send it again from scratch (reset)")
        if d.reset or cur is None:
            cur = {"rows": {}, "trimmed": 0}
        rows = cur["rows"]
        for k in d.remove:
            rows.pop(k, None)
        for r in d.upsert:
            rows[r.key] = r.wire()
        self.rows_received += len(d.upsert) + len(d.remove)
        if len(rows) > self.max_nodes:
            kept = sorted(rows.values(), key=_recency)[: self.max_nodes]
            cur["trimmed"] += len(rows) - len(kept)
            cur["rows"] = {r[0]: r for r in kept}
        cur.update(version=d.version, geometry=geometry, t=now, complete=not d.more)
        srcs = self._by_region.setdefault(region, {})
        srcs[source] = cur
        if len(srcs) > self.max_sources:
            del srcs[min(srcs, key=lambda s: srcs[s]["t"])]
        return d.version, None

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

