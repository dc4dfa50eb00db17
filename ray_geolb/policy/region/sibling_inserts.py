"""One affinity view for a region's several routers: their prefix inserts, shared through the registry.

A region with several ingress replicas runs one router per replica, each with its own prefix index
(which replica was sent which prefix) and regional snapshot (which region was forwarded which
prefix). A conversation's turns reach whichever replica the proxy picks, so with trees kept apart the
hit rate falls as the region scales out (benchmarks/RESULTS.md section 31: 0.57-0.65x of one router's
at 8 routers; 0.92-0.98x with inserts shared at 0.5 s).

The channel, both ends of it, without Ray:

* :class:`SiblingOutbox` (each router, writer side): the inserts it made -- a dispatch to a replica
  (kind ``"d"``: its prefix index) or a forward to a region (kind ``"f"``: its regional snapshot) --
  as **hash-only rows**, bounded (the oldest dropped first, counted). The heartbeat takes at most
  :data:`MAX_ROWS_PER_HEARTBEAT` of them.
* :class:`SiblingRing` (the registry, in ``RegistryState``): a bounded ring of rows per region, numbered.
  Each heartbeat that carries ``sibling_cursor`` (the cursor of the last reply, or None) appends the
  sender's rows and gets back its siblings' rows since that cursor (never its own), at most
  :data:`MAX_REPLY_ROWS`, with the new cursor (``table["sibling_inserts"][source]``).
* :func:`prepared_from_row` (each router, reader side): a row back into the
  :class:`~ray_geolb.policy.prefix_index.PreparedText` its index inserts (``Policy.learn_sibling_dispatch``,
  ``RegionRouter.learn_sibling_forward``).

A row is ``(kind, target, length, keys)``: the prompt's length in characters and its block keys (the
index's 64-bit chained hashes, packed as unsigned 64-bit integers): no prompt text, no request id.
Staleness: a sibling's insert reaches a router one heartbeat period plus two registry legs after it was
made, at most (the sender's next tick, then the reader's next tick). A lost heartbeat loses its rows
(affinity degrades; nothing else depends on them). A registry restart starts a new ``epoch``: cursors of
the old one read the new ring from its start.
"""

from __future__ import annotations

import random
from array import array
from collections import deque
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["KINDS", "MAX_REPLY_ROWS", "MAX_ROWS_PER_HEARTBEAT", "SiblingOutbox", "SiblingRing",
           "check_rows", "learn_dispatch_row", "learn_rows", "prepared_from_row", "row_of", "take_rows"]

#: ``"d"``: a dispatch to a replica of this region; ``"f"``: a forward to a peer region
KINDS = ("d", "f")
#: rows one heartbeat carries, and rows one reply carries (~8 bytes per block key, ~30 keys a prompt)
MAX_ROWS_PER_HEARTBEAT = 512
MAX_REPLY_ROWS = 1024
#: block keys of one row (a prompt of ~10^6 characters has ~110 blocks at the default geometry)
MAX_KEYS_PER_ROW = 1024
MAX_TARGET_LEN = 256
MAX_LENGTH = 1 << 40

Row = Tuple[str, str, int, bytes]


def row_of(kind: str, target: str, prepared) -> Row:
    """The hash-only row of one insert: ``prepared`` is the ``PreparedText`` the router inserted."""
    return (kind, target, int(prepared.length), array("Q", prepared.keys).tobytes())


def prepared_from_row(index, row: Row):
    """The ``PreparedText`` of ``row`` for ``index`` (a ``PrefixIndex``): its keys and the block ends
    that ``index``'s geometry gives the prompt's length. ValueError when the keys do not fit that
    geometry (a sibling with another ``block_chars`` / ``growth``)."""
    return index.prepared_from_keys(tuple(array("Q", row[3])), row[2])


def take_rows(*boxes: Optional["SiblingOutbox"], most: int = MAX_ROWS_PER_HEARTBEAT) -> List[Row]:
    """One heartbeat's rows: up to ``most``, from each box in turn (None: no box)."""
    rows: List[Row] = []
    for box in boxes:
        if box is not None and len(rows) < most:
            rows += box.take(most - len(rows))
    return rows


def learn_rows(rows: Sequence[Row], router, now: float,
               dispatch: Optional[Callable[[Row], None]] = None) -> Tuple[int, int]:
    """A reply's sibling rows learned by one router: forwards into ``router``'s regional snapshot
    (``RegionRouter.learn_sibling_forward``), dispatches into its local policy's prefix index
    (``Policy.learn_sibling_dispatch``), or handed to ``dispatch(row)`` when another thread owns that index
    (Serve). Returns ``(learned, unusable)``: a row of another geometry, or for a replica this router does
    not have, is unusable."""
    learned = unusable = 0
    policy = router.local
    for row in rows:
        try:
            if row[0] == "f":
                router.learn_sibling_forward(prepared_from_row(router.snapshot, row), row[1], now)
                ok = True
            elif dispatch is not None:
                dispatch(row)
                ok = True
            else:
                ok = learn_dispatch_row(policy, row, now)
        except ValueError:
            ok = False
        learned += ok
        unusable += not ok
    return learned, unusable


def learn_dispatch_row(policy, row: Row, now: float) -> bool:
    """A sibling's dispatch row into ``policy``'s prefix index (``Policy.learn_sibling_dispatch``): True if
    learned; False for a policy without an index, a replica it does not have, or another geometry."""
    idx = policy.index
    try:
        return idx is not None and policy.learn_sibling_dispatch(prepared_from_row(idx, row), row[1], now)
    except ValueError:
        return False


def check_rows(rows, what: str = "sibling_inserts") -> List[Row]:
    """``rows`` read as a list of rows (module docstring), at most :data:`MAX_ROWS_PER_HEARTBEAT`.
    Raises ValueError naming the first bad row and field; reads nothing else."""
    if rows is None:
        return []
    if not isinstance(rows, (list, tuple)):
        raise ValueError(f"{what} must be a list of rows, got {type(rows).__name__}")
    if len(rows) > MAX_ROWS_PER_HEARTBEAT:
        raise ValueError(f"{what} has {len(rows)} rows; at most {MAX_ROWS_PER_HEARTBEAT}")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 4:
            raise ValueError(f"{what}[{i}] must be [kind, target, length, keys]")
        kind, target, length, keys = row
        if kind not in KINDS:
            raise ValueError(f"{what}[{i}].kind must be one of {KINDS}, got {str(kind)[:20]!r}")
        if not isinstance(target, str) or not 1 <= len(target) <= MAX_TARGET_LEN:
            raise ValueError(f"{what}[{i}].target must be a name of 1-{MAX_TARGET_LEN} characters")
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= MAX_LENGTH:
            raise ValueError(f"{what}[{i}].length must be an integer in [0, {MAX_LENGTH}]")
        if not isinstance(keys, bytes) or len(keys) % 8 or len(keys) > 8 * MAX_KEYS_PER_ROW:
            raise ValueError(f"{what}[{i}].keys must be packed 64-bit keys (bytes, a multiple of 8), at most "
                             f"{MAX_KEYS_PER_ROW} of them")
        out.append((kind, target, length, keys))
    return out


class SiblingOutbox:
    """A router's inserts waiting for its next heartbeat (module docstring). ``add`` runs on the router's
    thread and ``take`` on the heartbeat's: a ``deque``'s append and popleft are atomic in CPython."""

    def __init__(self, max_rows: int = 4096, enabled: bool = True):
        if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1:
            raise ValueError(f"max_rows must be a positive integer, got {max_rows!r}")
        self._rows: deque = deque(maxlen=max_rows)
        #: False: :meth:`add` keeps nothing (nobody takes the rows: a router whose process has no ingress
        #: sharing them, e.g. Ray Serve LLM's OpenAI app with several replicas)
        self.enabled = enabled
        self.added = 0
        self.dropped = 0  # rows pushed out unsent by newer ones (a heartbeat link down, or too slow)

    def add(self, kind: str, target: str, prepared) -> None:
        """One insert: kept as made (the keys are packed into a row by :meth:`take`, off the decision path)."""
        if not self.enabled:
            return
        if len(self._rows) == self._rows.maxlen:
            self.dropped += 1
        self._rows.append((kind, target, prepared))
        self.added += 1

    def take(self, most: int = MAX_ROWS_PER_HEARTBEAT) -> List[Row]:
        """Up to ``most`` rows, oldest first, removed from the box."""
        out = []
        rows = self._rows
        while rows and len(out) < most:
            out.append(row_of(*rows.popleft()))
        return out

    def __len__(self) -> int:
        return len(self._rows)


class SiblingRing:
    """The registry's end (module docstring): per region, the last ``max_rows`` rows, numbered from 1."""

    def __init__(self, max_rows: int = 4096, max_reply_rows: int = MAX_REPLY_ROWS):
        for name, v in (("max_rows", max_rows), ("max_reply_rows", max_reply_rows)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.max_rows = max_rows
        self.max_reply_rows = max_reply_rows
        self.epoch = random.getrandbits(62)
        # region -> (number of the first row held, [(source, row), ...])
        self._rings: Dict[str, Tuple[int, list]] = {}
        self.rows_received = 0
        self.rows_relayed = 0

    def exchange(self, region: str, source: str, rows: Sequence, cursor) -> Tuple[dict, Optional[str]]:
        """Append ``source``'s ``rows`` to ``region``'s ring, and return ``(reply, error)``: the reply is
        ``{"cursor": [epoch, n], "rows": [...], "more": bool}``, the siblings' rows after ``cursor``
        (``[epoch, n]`` of an earlier reply; None or another epoch's: from the ring's start). Malformed
        rows are refused as a whole (``error`` names the first problem) and the reply is still given."""
        error = None
        try:
            clean = check_rows(rows)
        except ValueError as e:
            clean, error = [], f"sibling_inserts refused: {e}"
        first, ring = self._rings.get(region, (1, []))
        after = first - 1
        if (isinstance(cursor, (list, tuple)) and len(cursor) == 2 and cursor[0] == self.epoch
                and isinstance(cursor[1], int) and not isinstance(cursor[1], bool)):
            after = min(max(cursor[1], first - 1), first - 1 + len(ring))
        out, i, end = [], after - first + 1, len(ring)
        while i < end and len(out) < self.max_reply_rows:
            src, row = ring[i]
            if src != source:
                out.append(row)
            i += 1
        reply = {"cursor": [self.epoch, first + i - 1], "rows": out, "more": i < end}
        if clean:
            ring.extend((source, row) for row in clean)
            if len(ring) > 2 * self.max_rows:  # trimmed in chunks: amortized O(1) per row
                cut = len(ring) - self.max_rows
                first, ring = first + cut, ring[cut:]
            self.rows_received += len(clean)
        if not reply["more"]:  # the reader has read up to the end: its own rows just added are not news
            reply["cursor"][1] = first + len(ring) - 1
        self._rings[region] = (first, ring)
        self.rows_relayed += len(out)
        return reply, error

    def forget(self, region: str) -> None:
        self._rings.pop(region, None)

    def rows(self) -> int:
        return sum(len(r) for _, r in self._rings.values())
