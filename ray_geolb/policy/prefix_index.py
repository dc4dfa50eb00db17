"""Approximate prefix index (SkyLB §3.2): which targets were sent which prompt prefixes.

A target is a local replica (the replica trie) or a peer region (the regional snapshot).

Representation: chained block hashes over the UTF-8 bytes of the canonical text. Block *i* covers
bytes ``[end(i-1), end(i))``; its key is the CRC-32 of the whole prefix ``[0, end(i))`` (computed
incrementally, one C call per block) packed with ``end(i)``. Nodes live in one flat dict, so
matching is one dict lookup per block, and no prompt text is stored at all unless
``store_text=True``. Block sizes grow geometrically with the offset (``block_chars`` at the start,
then ``growth`` × offset), so a 128k-character prompt is ~55 blocks instead of 2,000, and a matched
length is exact to within ``growth`` of itself (the index is approximate by design: it records what
the load balancer *sent*, not what the engine still caches).

Each node keeps ``{target: last_access_time}``. Invariant: a child's targets ⊆ its parent's.
Memory: one global budget (``max_nodes`` and/or ``max_chars``, where chars = Σ block length ×
number of targets holding the block), enforced on every insert by LRU eviction of
(node, target) entries. The LRU order is kept so that the oldest entry is always a leaf for its
target (each insert touches its path from the leaf up to the root), so eviction never breaks the
subset invariant, and a node whose last target goes is freed.

Lengths reported by :meth:`PrefixIndex.match` are in bytes of UTF-8 canonical text (characters,
for ASCII text).
"""

from __future__ import annotations

import time
import zlib
from bisect import bisect_right
from collections import OrderedDict
from collections import deque as _consume
from itertools import compress, repeat
from operator import contains, itemgetter, not_
from typing import Callable, Dict, Hashable, Iterable, List, NamedTuple, Optional

__all__ = ["PreparedText", "PrefixIndex"]

_crc32 = zlib.crc32
_ROOT = -1  # parent key of first-level nodes


class PreparedText:
    """A prompt hashed for one index geometry; reuse it for match and insert of one request."""

    __slots__ = ("keys", "ends", "length", "_data")

    def __init__(self, keys: List[int], ends: List[int], length: int, data: Optional[bytes]):
        self.keys = keys
        self.ends = ends
        self.length = length
        self._data = data


class _Node(NamedTuple):
    """A read-only *view* of one block of a prompt path (what ``PrefixIndex._nodes.get`` returns).

    The index stores a node as two entries: ``_map[key] = (parent, start, end)``, a plain tuple of
    ints, and ``_tg[key] = {target: last access}``, a dict of atomic keys and floats. CPython's
    cyclic GC untracks both, so a big index adds nothing to what every full collection walks (a
    node object, or a tuple holding a dict, would stay tracked forever: in the Ray router GC was
    most of the CPU p99).
    """

    parent: int
    start: int
    end: int
    targets: Dict[Hashable, float]


class _NodesView:
    """``index._nodes``: ``get``/``[]``/``in``/``len``/``items`` over the nodes, as :class:`_Node`."""

    __slots__ = ("_m", "_t")

    def __init__(self, m, t):
        self._m, self._t = m, t

    def get(self, key, default=None):
        v = self._m.get(key)
        return default if v is None else _Node(v[0], v[1], v[2], self._t[key])

    def __getitem__(self, key):
        v = self._m[key]
        return _Node(v[0], v[1], v[2], self._t[key])

    def __contains__(self, key):
        return key in self._m

    def __len__(self):
        return len(self._m)

    def items(self):
        t = self._t
        return ((k, _Node(v[0], v[1], v[2], t[k])) for k, v in self._m.items())

_parent_of = itemgetter(0)


class PrefixIndex:
    """Global-budget, LRU-evicting approximate prefix index over targets."""

    def __init__(
        self,
        block_chars: int = 64,
        growth: float = 1.0 / 8,
        max_nodes: Optional[int] = 200_000,
        max_chars: Optional[int] = None,
        store_text: bool = False,
        clock: Callable[[], float] = time.monotonic,
        max_entries: Optional[int] = 1_000_000,
    ):
        if not isinstance(block_chars, int) or block_chars < 1:
            raise ValueError(f"block_chars must be a positive integer, got {block_chars!r}")
        if not 0.0 <= growth <= 1.0:
            raise ValueError(f"growth must be in [0, 1], got {growth!r}")
        if max_nodes is not None and max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1 or None, got {max_nodes!r}")
        if max_chars is not None and max_chars < 1:
            raise ValueError(f"max_chars must be >= 1 or None, got {max_chars!r}")
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 or None, got {max_entries!r}")
        self.block_chars = block_chars
        self.growth = growth
        self.max_nodes = max_nodes
        self.max_chars = max_chars
        self.max_entries = max_entries
        self.store_text = store_text
        self._clock = clock
        self._map: Dict[int, tuple] = {}  # key -> (parent key, start, end)
        self._tg: Dict[int, Dict[Hashable, float]] = {}  # key -> {target: last access}
        self._text: Dict[int, bytes] = {}  # raw block text, only with store_text
        self._lru: "OrderedDict[tuple, None]" = OrderedDict()
        self._chars = 0
        self._chars_by_target: Dict[Hashable, int] = {}
        self._bounds: List[int] = []
        self._extend_bounds(1 << 16)
        self.evictions = 0

    # ------------------------------------------------------------------ geometry
    def _extend_bounds(self, upto: int) -> None:
        b = self._bounds
        end = b[-1] if b else 0
        step_min, g = self.block_chars, self.growth
        while end < upto:
            end += max(step_min, int(end * g))
            b.append(end)

    def prepare(self, text) -> PreparedText:
        """Hash ``text`` (str, bytes or an existing PreparedText) into block keys."""
        if isinstance(text, PreparedText):
            return text
        if isinstance(text, str):
            data = text.encode("utf-8", "surrogatepass")
        elif isinstance(text, (bytes, bytearray)):
            data = bytes(text)
        else:
            raise TypeError(f"prefix index needs str text, got {type(text).__name__}")
        n = len(data)
        if n > self._bounds[-1]:
            self._extend_bounds(n)
        count = bisect_right(self._bounds, n)
        ends = self._bounds[:count]
        keys = []
        append = keys.append
        mv = memoryview(data)
        crc = 0
        start = 0
        for end in ends:
            crc = _crc32(mv[start:end], crc)
            append((crc << 32) | end)
            start = end
        return PreparedText(keys, ends, n, data if self.store_text else None)

    # ------------------------------------------------------------------ queries
    def match(self, text, available: Optional[Iterable[Hashable]] = None) -> Dict[Hashable, int]:
        """Matched prefix length (bytes) per target; only targets in ``available`` (all if None).

        Walks the prompt's blocks and stops as soon as no available target remains on the path
        (children hold a subset of their parent's targets, so none can appear deeper).
        Targets with no match at all are absent from the result.
        """
        p = self.prepare(text)
        nodes = self._map
        tgs = self._tg
        avail = None if available is None else (available if isinstance(available, (set, frozenset)) else set(available))
        result: Dict[Hashable, int] = {}
        alive = None
        alive_n = 0
        prev = _ROOT
        last_end = 0
        ends = p.ends
        for i, key in enumerate(p.keys):
            node = nodes.get(key)
            if node is None or node[0] != prev:
                break
            tg = tgs[key]
            if alive is None:
                alive = set(tg) if avail is None else (tg.keys() & avail)
            elif len(tg) < alive_n:
                # tg ⊆ parent's targets, so an equal count means an equal set: nobody drops out.
                new = alive & tg.keys()
                if len(new) < len(alive):
                    for t in alive - new:
                        result[t] = last_end
                    alive = new
            alive_n = len(tg)
            if not alive:
                break
            last_end = ends[i]
            prev = key
        if alive:
            for t in alive:
                result[t] = last_end
        return result

    def longest(self, text, available: Optional[Iterable[Hashable]] = None):
        """(targets with the longest match, matched length); ``([], 0)`` if nothing matches."""
        m = self.match(text, available)
        if not m:
            return [], 0
        best = max(m.values())
        return [t for t, v in m.items() if v == best], best

    # ------------------------------------------------------------------ updates
    def insert(self, text, target: Hashable, now: Optional[float] = None) -> PreparedText:
        """Record that ``text`` was routed to ``target``; evicts LRU entries to stay in budget."""
        p = self.prepare(text)
        if now is None:
            now = self._clock()
        nodes = self._map
        get = nodes.get
        keys = p.keys
        ends = p.ends
        n = len(keys)
        prev = _ROOT
        start = 0
        added = 0
        fresh = ()  # path positions whose (node, target) entry is new, existing nodes only
        # 1) the part of the path that exists already (bulk lookups in C)
        found = list(map(get, keys))
        try:
            i = found.index(None)
        except ValueError:
            i = n
        if i:
            exist = found[:i] if i < n else found
            parents = list(map(_parent_of, exist))
            if parents[0] != _ROOT or parents[1:] != keys[:i - 1]:
                # a CRC collision with another path: stop right before it, never corrupt the tree
                m = 0
                expect = _ROOT
                while m < i and parents[m] == expect:
                    expect = keys[m]
                    m += 1
                n = i = m
                exist = exist[:m]
        if i:
            tgs = list(map(self._tg.__getitem__, keys[:i]))
            have = list(map(contains, tgs, repeat(target, i)))
            if not all(have):
                fresh = list(compress(range(i), map(not_, have)))
                for k in fresh:
                    added += ends[k] - (ends[k - 1] if k else 0)
            for tg in tgs:
                tg[target] = now
            prev = keys[i - 1]
            start = ends[i - 1]
        j = i  # 2) new nodes for keys[j:n] (a new node's descendants cannot exist: their keys
        #          chain through it -- unless a CRC collides, checked in C below)
        if j < n:
            new_keys = keys[j:n]
            if not nodes.keys().isdisjoint(new_keys):
                m = j
                while m < n and keys[m] not in nodes:
                    m += 1
                n = m
                new_keys = keys[j:n]
            k = n - j
            if k:
                new_ends = ends[j:n]
                parents = [prev]
                parents += keys[j:n - 1]
                starts = [start]
                starts += ends[j:n - 1]
                nodes.update(zip(new_keys, zip(parents, starts, new_ends)))
                self._tg.update(zip(new_keys, [{target: now} for _ in repeat(None, k)]))
                added += new_ends[-1] - start
                if self.store_text and p._data is not None:
                    data = p._data
                    self._text.update(zip(new_keys, map(data.__getitem__, map(slice, starts, new_ends))))
        if added:
            self._chars += added
            self._chars_by_target[target] = self._chars_by_target.get(target, 0) + added
        # Touch leaf first, root last: a child's entry always sits before its parent's in the
        # LRU order, so the front of the order is always a leaf for its target.
        lru = self._lru
        if n > j:
            lru.update(zip(zip(reversed(keys[j:n]), repeat(target)), repeat(None)))
        if j:
            if fresh:
                lru.update(zip(zip(map(keys.__getitem__, fresh), repeat(target)), repeat(None)))
            # every entry of the existing part to the end, deepest first (fresh ones included)
            _consume(map(lru.move_to_end, zip(reversed(keys[:j]), repeat(target))), maxlen=0)
        if self._over_budget():
            self._enforce_budget()
        return p

    def _over_budget(self) -> bool:
        return (self.max_nodes is not None and len(self._map) > self.max_nodes) or (
            self.max_entries is not None and len(self._lru) > self.max_entries) or (
            self.max_chars is not None and self._chars > self.max_chars
        )

    def _enforce_budget(self) -> None:
        if not self._over_budget():
            return
        lru = self._lru
        nodes = self._map
        while lru and self._over_budget():
            (key, target), _ = lru.popitem(last=False)
            self._drop_entry(nodes, key, target)
            self.evictions += 1

    def _drop_entry(self, nodes: Dict[int, tuple], key: int, target: Hashable) -> None:
        node = nodes[key]
        tg = self._tg[key]
        del tg[target]
        size = node[2] - node[1]
        self._chars -= size
        left = self._chars_by_target[target] - size
        if left:
            self._chars_by_target[target] = left
        else:
            del self._chars_by_target[target]
        if not tg:
            # Its children hold a subset of nothing: they are gone already.
            del nodes[key]
            del self._tg[key]
            if self._text:
                self._text.pop(key, None)

    def remove_target(self, target: Hashable) -> int:
        """Forget a target everywhere (a replica or region went away). Returns entries removed."""
        keys = [k for (k, t) in self._lru if t == target]
        # Deepest first so nodes emptied bottom-up keep the parent links consistent.
        keys.sort(key=lambda k: self._map[k][2], reverse=True)
        for k in keys:
            del self._lru[(k, target)]
            self._drop_entry(self._map, k, target)
        return len(keys)

    def clear(self) -> None:
        self._map.clear()
        self._tg.clear()
        self._text.clear()
        self._lru.clear()
        self._chars = 0
        self._chars_by_target.clear()

    # ------------------------------------------------------------------ introspection
    @property
    def num_nodes(self) -> int:
        return len(self._map)

    @property
    def num_entries(self) -> int:
        return len(self._lru)

    @property
    def stored_chars(self) -> int:
        return self._chars

    def last_access(self, key: int, target: Hashable) -> Optional[float]:
        """When ``target`` was last sent the prefix ending at block ``key`` (a
        :attr:`PreparedText.keys` entry); None if the index does not hold that entry.
        Use this rather than reading ``_nodes`` (its node representation may change)."""
        tg = self._tg.get(key)
        return None if tg is None else tg.get(target)

    @property
    def _nodes(self) -> _NodesView:
        """Read-only view of the nodes as :class:`_Node` (introspection; prefer :meth:`last_access`)."""
        return _NodesView(self._map, self._tg)

    def chars_of(self, target: Hashable) -> int:
        """How much text (Σ block lengths) the index attributes to ``target`` (its 'tree size')."""
        return self._chars_by_target.get(target, 0)

    def targets(self) -> List[Hashable]:
        return list(self._chars_by_target)

    def check_invariants(self) -> None:
        """Raise AssertionError if the subset invariant or the accounting is broken (for tests)."""
        assert self._tg.keys() == self._map.keys(), "node map and target map disagree"
        for key, v in self._map.items():
            assert type(v) is tuple and len(v) == 3, f"node {key} is not a plain (parent, start, end) tuple"
        nodes = dict(self._nodes.items())
        chars = 0
        for key, node in nodes.items():
            assert node.targets, f"empty node {key} kept"
            assert node.end == key & 0xFFFFFFFF and node.start < node.end, f"bad block bounds at {key}"
            chars += (node.end - node.start) * len(node.targets)
            if node.parent != _ROOT:
                parent = nodes.get(node.parent)
                assert parent is not None, f"orphan node {key}"
                assert parent.end == node.start, f"block {key} does not start where its parent ends"
                assert node.targets.keys() <= parent.targets.keys(), f"subset invariant broken at {key}"
            else:
                assert node.start == 0, f"first-level block {key} does not start at 0"
        assert set(self._text) <= set(nodes), "text kept for a freed node"
        for (key, t) in self._lru:
            assert t in nodes[key].targets, f"LRU entry {(key, t)} has no node entry"
        assert chars == self._chars, (chars, self._chars)
        assert len(self._lru) == sum(len(n.targets) for n in nodes.values())
        assert not self._over_budget(), "memory budget exceeded"

    def stored_text_blocks(self) -> List[bytes]:
        """The raw blocks kept (empty unless ``store_text=True``)."""
        return list(self._text.values())

    def snapshot(self) -> dict:
        """A compact, JSON-able copy (hashes only) to mirror into the registry."""
        return {
            "geometry": [self.block_chars, self.growth],
            "nodes": [
                [k, n.parent, n.start, n.end, {str(t): ts for t, ts in n.targets.items()}]
                for k, n in self._nodes.items()
            ],
        }

    def load_snapshot(self, snap: dict) -> None:
        """Rebuild from :meth:`snapshot` (targets come back as strings)."""
        if list(snap.get("geometry", [])) != [self.block_chars, self.growth]:
            raise ValueError("snapshot was taken with a different block geometry")
        self.clear()
        rows = sorted(snap["nodes"], key=lambda r: r[3])  # parents (shorter ends) first
        entries = []
        for key, parent, start, end, targets in rows:
            if parent != _ROOT and parent not in self._map:
                continue
            tg = {}
            self._map[key] = (parent, start, end)
            self._tg[key] = tg
            for t, ts in targets.items():
                tg[t] = ts
                self._chars += end - start
                self._chars_by_target[t] = self._chars_by_target.get(t, 0) + end - start
                entries.append((ts, -end, key, t))
        entries.sort()  # oldest first; deepest first among equal times
        for _, _, key, t in entries:
            self._lru[(key, t)] = None
        self._enforce_budget()
