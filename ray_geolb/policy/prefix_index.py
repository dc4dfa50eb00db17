"""Approximate prefix index (SkyLB §3.2): which targets were sent which prompt prefixes.

A target is a local replica (the replica trie) or a peer region (the regional snapshot).

Blocks and keys: chained block hashes over the UTF-8 bytes of the canonical text. Block *i* covers
bytes ``[end(i-1), end(i))``; its key is the 64-bit XXH3 hash of the block seeded with block
*i-1*'s key, so it identifies the whole prefix ``[0, end(i))`` (one C call per block; XXH3 hashes
a 32 KB prompt ~3× faster than zlib's CRC-32, which it replaced). Block sizes grow geometrically with the
offset (``block_chars`` at the start, then ``growth`` × offset), so a 128k-character prompt is ~55
blocks instead of 2,000, and a matched length is exact to within ``growth`` of itself. No prompt
text is stored unless ``store_text=True``. The index is approximate by design: it records what the
load balancer *sent*, not what the engine still caches.

Tree: a radix tree over block keys. A node is a *run* of consecutive blocks that every target
holding any of them holds entirely (``{target: last access}`` per run); a new prompt tail is one
run however many blocks it spans, and a run is split only where a later prompt diverges from it or
ends inside it. Matching and inserting therefore touch one node per *distinct branch point* on the
path (typically 1–3), not one per block: in the Ray router the per-block dictionaries were most of
the decision time, because every block was a cold-cache miss. Within a run, the first diverging
block is found by binary search (a chained key, once different, stays different). Invariant: a
child's targets ⊆ its parent's.

Memory: one global budget (``max_nodes`` blocks, ``max_entries`` (block, target) entries and/or
``max_chars`` = Σ block length × targets holding it), enforced on every insert by exact LRU
eviction of (block, target) entries, deepest first. LRU without per-entry bookkeeping: each insert
appends one record ``(time, deepest block, target)``; access times are strictly increasing, so the
oldest record names the least recently used path, and its entries are exactly the blocks on that
path (walking up from its deepest block) whose time for the target still equals the record's (a
later insert through them refreshed them and owns them now). Stale records are skipped or
compacted away (at most one live record per entry).

Lengths reported by :meth:`PrefixIndex.match` are in bytes of UTF-8 canonical text (characters,
for ASCII text).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from collections import deque
from typing import Callable, Dict, Hashable, Iterable, List, NamedTuple, Optional

import xxhash

__all__ = ["PreparedText", "PrefixIndex"]

_xxh3 = xxhash.xxh3_64_intdigest
_ROOT = -1  # parent key of first-level runs
_INF = math.inf


class PreparedText:
    """A prompt hashed for one index geometry; reuse it for match and insert of one request."""

    __slots__ = ("keys", "ends", "length", "_data")

    def __init__(self, keys: tuple, ends: List[int], length: int, data: Optional[bytes]):
        self.keys = keys
        self.ends = ends
        self.length = length
        self._data = data


class _Node(NamedTuple):
    """A read-only view of one *block* (introspection: :attr:`PrefixIndex._nodes`)."""

    parent: int
    start: int
    end: int
    targets: Dict[Hashable, float]


def _common(keys: tuple, i: int, rk: tuple) -> int:
    """How many leading blocks of run ``rk`` equal ``keys[i:]`` (``rk[0] == keys[i]`` is known).
    Chained keys: once a block differs every later one does, so binary search is exact."""
    lo, hi = 1, min(len(rk), len(keys) - i)
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if keys[i + mid - 1] == rk[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixIndex:
    """Global-budget, LRU-evicting approximate prefix index over targets (a radix tree of block runs)."""

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
        # head key -> (parent run's tail key or _ROOT, index of the first block, block keys):
        # a plain tuple of ints, which CPython's cyclic GC untracks (so does it the target dicts).
        self._runs: Dict[int, tuple] = {}
        self._tg: Dict[int, Dict[Hashable, float]] = {}  # head key -> {target: last access}
        self._tail: Dict[int, int] = {}  # tail key (last block) -> head key
        self._text: Dict[int, bytes] = {}  # block key -> raw block text, only with store_text
        self._records: deque = deque()  # (access time, deepest block key, target), oldest first
        self._last_ts = -_INF
        self._blocks = 0
        self._entries = 0
        self._chars = 0
        self._chars_by_target: Dict[Hashable, int] = {}
        self._bounds: List[int] = []
        self._slices: List[slice] = []
        self._extend_bounds(1 << 16)
        self.evictions = 0

    # ------------------------------------------------------------------ geometry
    def _extend_bounds(self, upto: int) -> None:
        b = self._bounds
        end = b[-1] if b else 0
        step_min, g = self.block_chars, self.growth
        while end < upto:
            nxt = end + max(step_min, int(end * g))
            self._slices.append(slice(end, nxt))
            b.append(nxt)
            end = nxt

    def _span(self, i0: int, k: int) -> int:
        """Bytes covered by blocks ``i0 .. i0+k-1``."""
        b = self._bounds
        return b[i0 + k - 1] - (b[i0 - 1] if i0 else 0)

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
        h = 0
        for sl in self._slices[:count]:
            h = _xxh3(mv[sl], h)
            append(h)
        return PreparedText(tuple(keys), ends, n, data if self.store_text else None)

    def prepared_from_keys(self, keys: tuple, length: int) -> PreparedText:
        """The ``PreparedText`` of a prompt of ``length`` characters whose block keys (hashed by an index of
        this geometry elsewhere: a sibling router) are ``keys``. ValueError if their number does not fit
        this geometry."""
        if length > self._bounds[-1]:
            self._extend_bounds(length)
        count = bisect_right(self._bounds, length)
        if len(keys) != count:
            raise ValueError(f"{len(keys)} block keys for a prompt of {length} characters; this index's geometry "
                             f"(block_chars={self.block_chars}, growth={self.growth}) has {count}")
        return PreparedText(tuple(keys), self._bounds[:count], length, None)

    # ------------------------------------------------------------------ queries
    def match(self, text, available: Optional[Iterable[Hashable]] = None,
              times: Optional[Dict[Hashable, float]] = None) -> Dict[Hashable, int]:
        """Matched prefix length (bytes) per target; only targets in ``available`` (all if None).

        Walks the prompt's runs and stops as soon as no available target remains on the path
        (children hold a subset of their parent's targets, so none can appear deeper).
        Targets with no match at all are absent from the result. If ``times`` is a dict, it is
        filled with each matched target's last access of its matched prefix (as
        :meth:`access_times`, in the same walk). The walk is written out here rather than shared
        with :meth:`access_times` through a generator: this is the decision's hot path.
        """
        p = self.prepare(text)
        keys = p.keys
        n = len(keys)
        runs = self._runs
        tgs = self._tg
        ends = p.ends
        avail = (None if available is None
                 else (available if isinstance(available, (set, frozenset)) else set(available)))
        result: Dict[Hashable, int] = {}
        alive = None
        alive_n = 0
        prev = _ROOT
        prev_tg = None  # targets of the deepest run matched so far
        last_end = 0
        i = 0
        while i < n:
            h = keys[i]
            node = runs.get(h)
            if node is None or node[0] != prev:
                break
            rk = node[2]
            L = len(rk)
            m = L if keys[i:i + L] == rk else _common(keys, i, rk)
            tg = tgs[h]
            if alive is None:
                alive = set(tg) if avail is None else (tg.keys() & avail)
            elif len(tg) < alive_n:
                # tg ⊆ parent's targets, so an equal count means an equal set: nobody drops out.
                new = alive & tg.keys()
                if len(new) < len(alive):
                    for t in alive - new:
                        result[t] = last_end
                        if times is not None:
                            times[t] = prev_tg[t]
                    alive = new
            alive_n = len(tg)
            if not alive:
                break
            last_end = ends[i + m - 1]
            prev_tg = tg
            if m < L:
                break
            prev = rk[-1]
            i += L
        if alive:
            for t in alive:
                result[t] = last_end
                if times is not None:
                    times[t] = prev_tg[t]
        return result

    def longest(self, text, available: Optional[Iterable[Hashable]] = None):
        """(targets with the longest match, matched length); ``([], 0)`` if nothing matches."""
        m = self.match(text, available)
        if not m:
            return [], 0
        best = max(m.values())
        return [t for t, v in m.items() if v == best], best

    def last_access_at(self, text, length: int, target: Hashable) -> Optional[float]:
        """When ``target`` was last sent the prefix of ``text`` that ends at byte ``length`` (a
        block boundary, e.g. a length :meth:`match` returned); None if the index does not hold it."""
        return self.access_times(text, {target: length}).get(target)

    def access_times(self, text, lengths: Dict[Hashable, int]) -> Dict[Hashable, float]:
        """For each ``target: length`` (e.g. what :meth:`match` returned), when ``target`` was last
        sent the prefix of ``text`` ending at byte ``length`` -- one walk for all targets; targets
        whose prefix the index does not hold (or not at a block boundary) are left out."""
        p = self.prepare(text)
        ends = p.ends
        want = []
        for t, length in lengths.items():
            b = bisect_left(ends, length)
            if b < len(ends) and ends[b] == length:
                want.append((b, t))
        if not want:
            return {}
        want.sort(key=lambda bt: bt[0])
        keys = p.keys
        runs, tgs = self._runs, self._tg
        out: Dict[Hashable, float] = {}
        prev = _ROOT
        i = 0
        w = 0
        nw = len(want)
        n = len(keys)
        while w < nw and i < n:
            h = keys[i]
            node = runs.get(h)
            if node is None or node[0] != prev:
                break
            rk = node[2]
            L = len(rk)
            m = L if keys[i:i + L] == rk else _common(keys, i, rk)
            tg = tgs[h]
            while w < nw and want[w][0] < i + m:
                t = want[w][1]
                ts = tg.get(t)
                if ts is not None:
                    out[t] = ts
                w += 1
            if m < L:
                break
            prev = rk[-1]
            i += L
        return out

    # ------------------------------------------------------------------ updates
    def insert(self, text, target: Hashable, now: Optional[float] = None) -> PreparedText:
        """Record that ``text`` was routed to ``target``; evicts LRU entries to stay in budget."""
        p = self.prepare(text)
        keys = p.keys
        n = len(keys)
        if not n:
            return p
        if now is None:
            now = self._clock()
        if now <= self._last_ts:  # access times must be strictly increasing (they order the LRU)
            now = math.nextafter(self._last_ts, _INF)
        self._last_ts = now
        runs = self._runs
        tgs = self._tg
        prev = _ROOT
        i = 0
        added_chars = 0
        added_entries = 0
        # 1) the runs that exist already (splitting the last one where the prompt leaves it)
        while i < n:
            h = keys[i]
            node = runs.get(h)
            if node is None:
                break
            if node[0] != prev:  # a hash collision with another path: stop here, never corrupt the tree
                n = i
                break
            rk = node[2]
            L = len(rk)
            if keys[i:i + L] == rk:
                m = L
            else:
                m = _common(keys, i, rk)
                if not self._split(h, node, m):
                    n = i
                    break
            tg = tgs[h]
            if target not in tg:
                added_entries += m
                added_chars += self._span(i, m)
            tg[target] = now
            prev = keys[i + m - 1]
            i += m
            if m < L:
                break
        # 2) one new run for the rest of the prompt
        if i < n:
            h = keys[i]
            if h in runs or keys[n - 1] in self._tail:  # hash collision: leave the rest out
                n = i
            else:
                k = n - i
                runs[h] = (prev, i, keys[i:n])
                tgs[h] = {target: now}
                self._tail[keys[n - 1]] = h
                self._blocks += k
                added_entries += k
                added_chars += self._span(i, k)
                if self.store_text and p._data is not None:
                    data = p._data
                    self._text.update(zip(keys[i:n], map(data.__getitem__, self._slices[i:n])))
                prev = keys[n - 1]
        if prev == _ROOT:
            return p
        self._records.append((now, prev, target))
        if added_entries:
            self._entries += added_entries
            self._chars += added_chars
            self._chars_by_target[target] = self._chars_by_target.get(target, 0) + added_chars
        if len(self._records) > 2 * self._entries + 256:
            self._compact_records()
        if self._over_budget():
            self._enforce_budget()
        return p

    def _split(self, h: int, node: tuple, m: int) -> bool:
        """Cut run ``h`` after its first ``m`` blocks; the front keeps the head key, the back (which
        keeps the tail, so children and records still point at it) gets a copy of the targets."""
        parent, i0, rk = node
        back, front_tail = rk[m], rk[m - 1]
        if back in self._runs or front_tail in self._tail:
            return False  # hash collision with another run: refuse rather than corrupt
        tg = self._tg[h]
        self._runs[h] = (parent, i0, rk[:m])
        self._runs[back] = (front_tail, i0 + m, rk[m:])
        self._tg[back] = tg
        self._tg[h] = dict(tg)
        self._tail[front_tail] = h
        self._tail[rk[-1]] = back
        return True

    def _compact_records(self) -> None:
        tails, tgs = self._tail, self._tg
        live = deque()
        for r in self._records:
            h = tails.get(r[1])
            if h is not None and tgs[h].get(r[2]) == r[0]:
                live.append(r)
        self._records = live

    def _over_budget(self) -> bool:
        return (self.max_nodes is not None and self._blocks > self.max_nodes) or (
            self.max_entries is not None and self._entries > self.max_entries) or (
            self.max_chars is not None and self._chars > self.max_chars
        )

    def _blocks_to_drop(self, i0: int, L: int, sole: bool) -> int:
        """How many of a run's deepest blocks must lose one target to get back within budget."""
        k = 1
        if self.max_entries is not None:
            k = max(k, self._entries - self.max_entries)
        if self.max_nodes is not None and self._blocks > self.max_nodes:
            k = max(k, self._blocks - self.max_nodes) if sole else L  # shared blocks free no node
        if self.max_chars is not None and self._chars > self.max_chars:
            over = self._chars - self.max_chars
            b = self._bounds
            j = i0 + L - 1
            c = 0
            kc = 0
            while j >= i0 and c < over:
                c += b[j] - (b[j - 1] if j else 0)
                kc += 1
                j -= 1
            k = max(k, kc)
        return min(k, L)

    def _enforce_budget(self) -> None:
        recs = self._records
        tails, tgs, runs = self._tail, self._tg, self._runs
        while recs and self._over_budget():
            ts, tk, t = recs[0]
            h = tails.get(tk)
            if h is None or tgs[h].get(t) != ts:
                recs.popleft()  # refreshed by a later insert (or removed): nothing of it is the oldest
                continue
            node = runs[h]
            parent, i0, rk = node
            L = len(rk)
            k = self._blocks_to_drop(i0, L, len(tgs[h]) == 1)
            if k < L and self._split(h, node, L - k):
                self._drop_run_entry(rk[L - k], t)
                recs[0] = (ts, rk[L - k - 1], t)
            else:
                k = L
                self._drop_run_entry(h, t)
                if parent == _ROOT:
                    recs.popleft()
                else:
                    recs[0] = (ts, parent, t)
            self.evictions += k

    def _drop_run_entry(self, h: int, target: Hashable) -> None:
        parent, i0, rk = self._runs[h]
        tg = self._tg[h]
        del tg[target]
        L = len(rk)
        size = self._span(i0, L)
        self._entries -= L
        self._chars -= size
        left = self._chars_by_target[target] - size
        if left:
            self._chars_by_target[target] = left
        else:
            del self._chars_by_target[target]
        if not tg:
            # Its children hold a subset of nothing: they are gone already.
            del self._runs[h]
            del self._tg[h]
            del self._tail[rk[-1]]
            self._blocks -= L
            if self._text:
                for key in rk:
                    self._text.pop(key, None)

    def remove_target(self, target: Hashable) -> int:
        """Forget a target everywhere (a replica or region went away). Returns entries removed."""
        runs = self._runs
        heads = [h for h, tg in self._tg.items() if target in tg]
        # Deepest first, so runs emptied bottom-up keep the parent links consistent.
        heads.sort(key=lambda h: runs[h][1] + len(runs[h][2]), reverse=True)
        count = 0
        for h in heads:
            count += len(runs[h][2])
            self._drop_run_entry(h, target)
        return count

    def clear(self) -> None:
        self._runs.clear()
        self._tg.clear()
        self._tail.clear()
        self._text.clear()
        self._records.clear()
        self._blocks = self._entries = self._chars = 0
        self._chars_by_target.clear()

    # ------------------------------------------------------------------ introspection
    @property
    def num_nodes(self) -> int:
        """Blocks held (a run of k blocks counts k)."""
        return self._blocks

    @property
    def num_runs(self) -> int:
        """Tree nodes (runs of blocks)."""
        return len(self._runs)

    @property
    def num_entries(self) -> int:
        """(block, target) entries."""
        return self._entries

    @property
    def stored_chars(self) -> int:
        return self._chars

    def _block_rows(self):
        """(key, parent key, start, end, targets) for every block, parents before children."""
        b = self._bounds
        for h, (parent, i0, rk) in sorted(self._runs.items(), key=lambda kv: kv[1][1]):
            tg = self._tg[h]
            for j, key in enumerate(rk):
                i = i0 + j
                yield key, parent if j == 0 else rk[j - 1], (b[i - 1] if i else 0), b[i], tg

    @property
    def _nodes(self) -> Dict[int, _Node]:
        """Every block as a :class:`_Node` (introspection and tests; O(blocks) to build)."""
        return {k: _Node(parent, s, e, tg) for k, parent, s, e, tg in self._block_rows()}

    def chars_of(self, target: Hashable) -> int:
        """How much text (Σ block lengths) the index attributes to ``target`` (its 'tree size')."""
        return self._chars_by_target.get(target, 0)

    def targets(self) -> List[Hashable]:
        return list(self._chars_by_target)

    def check_invariants(self) -> None:
        """Raise AssertionError if the tree, the subset invariant, the LRU records or the accounting
        are broken (for tests)."""
        runs, tgs, tails = self._runs, self._tg, self._tail
        assert tgs.keys() == runs.keys(), "run map and target map disagree"
        assert len(tails) == len(runs), "tail map and run map disagree"
        blocks = entries = chars = 0
        by_target: Dict[Hashable, int] = {}
        for h, node in runs.items():
            assert type(node) is tuple and len(node) == 3, f"run {h} is not a plain (parent, first, keys) tuple"
            parent, i0, rk = node
            assert rk and rk[0] == h, f"run {h} does not start with its head key"
            assert tails.get(rk[-1]) == h, f"run {h} is not found by its tail key"
            tg = tgs[h]
            assert tg, f"empty run {h} kept"
            assert all(type(k) is int and k >= 0 for k in rk), f"run {h} holds a key that is not a block hash"
            size = self._span(i0, len(rk))
            blocks += len(rk)
            entries += len(rk) * len(tg)
            chars += size * len(tg)
            for t in tg:
                by_target[t] = by_target.get(t, 0) + size
            if parent == _ROOT:
                assert i0 == 0, f"first-level run {h} does not start at block 0"
            else:
                ph = tails.get(parent)
                assert ph is not None, f"orphan run {h}"
                pi0, prk = runs[ph][1], runs[ph][2]
                assert pi0 + len(prk) == i0, f"run {h} does not start where its parent ends"
                assert tg.keys() <= tgs[ph].keys(), f"subset invariant broken at {h}"
                assert all(tg[t] <= tgs[ph][t] for t in tg), f"child {h} accessed after its parent"
        assert (blocks, entries, chars) == (self._blocks, self._entries, self._chars), (
            (blocks, entries, chars), (self._blocks, self._entries, self._chars))
        assert by_target == self._chars_by_target, "per-target accounting is off"
        assert set(self._text) <= {k for (_, _, rk) in runs.values() for k in rk}, "text kept for a freed block"
        live = set()
        for ts, tk, t in self._records:
            h = tails.get(tk)
            if h is not None and tgs[h].get(t) == ts:
                live.add((ts, t))
        for h, tg in tgs.items():
            for t, ts in tg.items():
                assert (ts, t) in live, f"entry ({h}, {t!r}) has no LRU record: it could never be evicted"
        assert not self._over_budget(), "memory budget exceeded"

    def change_mark(self) -> tuple:
        """Changes whenever an insert or an eviction changed the index (callers cache what they derive)."""
        return (self._last_ts, self._entries, self._blocks, self.evictions)

    def recent_block_keys(self, max_keys: int, min_chars: int = 0, max_records: Optional[int] = None) -> List[int]:
        """Block keys of the most recently used prefixes, newest first, at most ``max_keys``: for each live
        LRU record (newest first) its whole path from the root to its deepest block (ancestors before
        descendants, so the set is closed under taking a prefix unless the budget cuts a path's tail).
        Paths shorter than ``min_chars`` are skipped; at most ``max_records`` records are read (None: all).
        Hashes only: what a region publishes of its index (``region/prefix_summary.py``)."""
        out: List[int] = []
        if max_keys <= 0:
            return out
        seen = set()
        tails, tgs, runs, b = self._tail, self._tg, self._runs, self._bounds
        read = 0
        for ts, tk, t in reversed(self._records):
            if max_records is not None and read >= max_records:
                break
            read += 1
            h = tails.get(tk)
            if h is None or tk in seen or tgs[h].get(t) != ts:
                continue  # stale record, or its path is in already
            parent, i0, rk = runs[h]
            if b[i0 + len(rk) - 1] < min_chars:
                continue
            path = [rk]
            while parent != _ROOT and parent not in seen:
                h = tails[parent]
                parent, i0, rk = runs[h]
                path.append(rk)
            for rk in reversed(path):
                room = max_keys - len(out)
                if len(rk) > room:
                    out.extend(rk[:room])
                    return out
                out.extend(rk)
                seen.update(rk)
            if len(out) >= max_keys:
                break
        return out

    def stored_text_blocks(self) -> List[bytes]:
        """The raw blocks kept (empty unless ``store_text=True``)."""
        return list(self._text.values())

    def snapshot(self) -> dict:
        """A compact, JSON-able copy (hashes only, one row per block) to mirror into the registry."""
        return {
            "geometry": [self.block_chars, self.growth],
            "nodes": [[k, parent, s, e, {str(t): ts for t, ts in tg.items()}]
                      for k, parent, s, e, tg in self._block_rows()],
        }

    def load_snapshot(self, snap: dict) -> None:
        """Rebuild from :meth:`snapshot` (targets come back as strings; one run per block)."""
        if list(snap.get("geometry", [])) != [self.block_chars, self.growth]:
            raise ValueError("snapshot was taken with a different block geometry")
        self.clear()
        rows = sorted(snap["nodes"], key=lambda r: r[3])  # parents (shorter ends) first
        if rows and rows[-1][3] > self._bounds[-1]:
            self._extend_bounds(rows[-1][3])
        b = self._bounds
        entries = []
        for key, parent, start, end, targets in rows:
            i = bisect_left(b, end)
            if i >= len(b) or b[i] != end or start != (b[i - 1] if i else 0) or not targets:
                continue  # not a block of this geometry
            if parent == _ROOT:
                if i != 0:
                    continue
            else:
                ph = self._tail.get(parent)
                if ph is None or self._runs[ph][1] + len(self._runs[ph][2]) != i:
                    continue
                targets = {t: ts for t, ts in targets.items() if t in self._tg[ph]}
                if not targets:
                    continue
            if key in self._runs or key in self._tail:
                continue
            self._runs[key] = (parent, i, (key,))
            self._tg[key] = dict(targets)
            self._tail[key] = key
            self._blocks += 1
            size = end - start
            for t, ts in targets.items():
                self._entries += 1
                self._chars += size
                self._chars_by_target[t] = self._chars_by_target.get(t, 0) + size
                entries.append((ts, -end, key, t))
        entries.sort()  # oldest first; deepest first among equal times
        self._records.extend((ts, key, t) for ts, _, key, t in entries)
        if entries:
            self._last_ts = max(self._last_ts, entries[-1][0])
        self._enforce_budget()
