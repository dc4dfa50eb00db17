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
from typing import Callable, Dict, Hashable, Iterable, List, Optional

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


class _Node:
    __slots__ = ("parent", "start", "end", "targets", "children", "text")

    def __init__(self, parent: int, start: int, end: int):
        self.parent = parent
        self.start = start
        self.end = end
        self.targets: Dict[Hashable, float] = {}
        self.children = 0
        self.text: Optional[bytes] = None


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
    ):
        if not isinstance(block_chars, int) or block_chars < 1:
            raise ValueError(f"block_chars must be a positive integer, got {block_chars!r}")
        if not 0.0 <= growth <= 1.0:
            raise ValueError(f"growth must be in [0, 1], got {growth!r}")
        if max_nodes is not None and max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1 or None, got {max_nodes!r}")
        if max_chars is not None and max_chars < 1:
            raise ValueError(f"max_chars must be >= 1 or None, got {max_chars!r}")
        self.block_chars = block_chars
        self.growth = growth
        self.max_nodes = max_nodes
        self.max_chars = max_chars
        self.store_text = store_text
        self._clock = clock
        self._nodes: Dict[int, _Node] = {}
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
        nodes = self._nodes
        avail = None if available is None else (available if isinstance(available, (set, frozenset)) else set(available))
        result: Dict[Hashable, int] = {}
        alive = None
        alive_n = 0
        prev = _ROOT
        last_end = 0
        ends = p.ends
        for i, key in enumerate(p.keys):
            node = nodes.get(key)
            if node is None or node.parent != prev:
                break
            tg = node.targets
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
        nodes = self._nodes
        path = []  # (key, was this (node, target) entry already present?)
        append = path.append
        prev = _ROOT
        prev_node = None
        start = 0
        data = p._data
        added = 0
        get = nodes.get
        for key, end in zip(p.keys, p.ends):
            node = get(key)
            if node is None:
                node = _Node(prev, start, end)
                if data is not None:
                    node.text = data[start:end]
                nodes[key] = node
                if prev_node is not None:
                    prev_node.children += 1
                node.targets[target] = now
                added += end - start
                append((key, False))
            elif node.parent != prev:
                break  # CRC collision with another path: stop here, never corrupt the tree
            else:
                tg = node.targets
                if target in tg:
                    append((key, True))
                else:
                    added += end - start
                    append((key, False))
                tg[target] = now
            prev = key
            prev_node = node
            start = end
        if added:
            self._chars += added
            self._chars_by_target[target] = self._chars_by_target.get(target, 0) + added
        # Touch leaf first, root last: a child's entry always sits before its parent's in the
        # LRU order, so the front of the order is always a leaf for its target.
        lru = self._lru
        move = lru.move_to_end
        for key, present in reversed(path):
            if present:
                move((key, target))
            else:
                lru[(key, target)] = None
        self._enforce_budget()
        return p

    def _over_budget(self) -> bool:
        return (self.max_nodes is not None and len(self._nodes) > self.max_nodes) or (
            self.max_chars is not None and self._chars > self.max_chars
        )

    def _enforce_budget(self) -> None:
        if not self._over_budget():
            return
        lru = self._lru
        nodes = self._nodes
        while lru and self._over_budget():
            (key, target), _ = lru.popitem(last=False)
            self._drop_entry(nodes, key, target)
            self.evictions += 1

    def _drop_entry(self, nodes: Dict[int, _Node], key: int, target: Hashable) -> None:
        node = nodes[key]
        del node.targets[target]
        size = node.end - node.start
        self._chars -= size
        left = self._chars_by_target[target] - size
        if left:
            self._chars_by_target[target] = left
        else:
            del self._chars_by_target[target]
        if not node.targets:
            # Its children hold a subset of nothing: they are gone already.
            del nodes[key]
            parent = nodes.get(node.parent)
            if parent is not None:
                parent.children -= 1

    def remove_target(self, target: Hashable) -> int:
        """Forget a target everywhere (a replica or region went away). Returns entries removed."""
        keys = [k for (k, t) in self._lru if t == target]
        # Deepest first so nodes emptied bottom-up keep the parent links consistent.
        keys.sort(key=lambda k: self._nodes[k].end, reverse=True)
        for k in keys:
            del self._lru[(k, target)]
            self._drop_entry(self._nodes, k, target)
        return len(keys)

    def clear(self) -> None:
        self._nodes.clear()
        self._lru.clear()
        self._chars = 0
        self._chars_by_target.clear()

    # ------------------------------------------------------------------ introspection
    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    @property
    def num_entries(self) -> int:
        return len(self._lru)

    @property
    def stored_chars(self) -> int:
        return self._chars

    def chars_of(self, target: Hashable) -> int:
        """How much text (Σ block lengths) the index attributes to ``target`` (its 'tree size')."""
        return self._chars_by_target.get(target, 0)

    def targets(self) -> List[Hashable]:
        return list(self._chars_by_target)

    def check_invariants(self) -> None:
        """Raise AssertionError if the subset invariant or the accounting is broken (for tests)."""
        nodes = self._nodes
        chars = 0
        children: Dict[int, int] = {}
        for key, node in nodes.items():
            assert node.targets, f"empty node {key} kept"
            chars += (node.end - node.start) * len(node.targets)
            if node.parent != _ROOT:
                parent = nodes.get(node.parent)
                assert parent is not None, f"orphan node {key}"
                assert node.targets.keys() <= parent.targets.keys(), f"subset invariant broken at {key}"
                children[node.parent] = children.get(node.parent, 0) + 1
        for key, node in nodes.items():
            assert node.children == children.get(key, 0), f"child count wrong at {key}"
        assert chars == self._chars, (chars, self._chars)
        assert len(self._lru) == sum(len(n.targets) for n in nodes.values())
        assert not self._over_budget(), "memory budget exceeded"

    def stored_text_blocks(self) -> List[bytes]:
        """The raw blocks kept (empty unless ``store_text=True``)."""
        return [n.text for n in self._nodes.values() if n.text is not None]

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
            node = _Node(parent, start, end)
            if parent != _ROOT and parent not in self._nodes:
                continue
            self._nodes[key] = node
            if parent != _ROOT:
                self._nodes[parent].children += 1
            for t, ts in targets.items():
                node.targets[t] = ts
                self._chars += end - start
                self._chars_by_target[t] = self._chars_by_target.get(t, 0) + end - start
                entries.append((ts, -end, key, t))
        entries.sort()  # oldest first; deepest first among equal times
        for _, _, key, t in entries:
            self._lru[(key, t)] = None
        self._enforce_budget()
