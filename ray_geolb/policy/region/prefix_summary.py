"""What a region's replicas hold, as a peer may see it: a hash-only summary of its prefix index.

A region's load balancer knows which prompt prefixes it sent to its replicas (the local policy's
:class:`~ray_geolb.policy.prefix_index.PrefixIndex`: chained 64-bit XXH3 block keys; a key identifies
the whole prefix up to the end of its block). :class:`PrefixSummary` publishes the block keys of the
region's most recently used prefixes (whole paths, root first: :meth:`PrefixIndex.recent_block_keys`)
as a **Bloom filter** -- no prompt text, no replica names -- in every heartbeat; a peer matches a
request against it to price forwarding there (the residual prefill at the peer:
``CostSelectorConfig.peer_summary``).

Bounds (the defaults, ``CostSelectorConfig.summary_max_keys`` = 2048, ``summary_bits_per_key`` = 10):

* **size**: ``m = 8 * ceil(n * bits_per_key / 8)`` bits for the ``n <= max_keys`` keys it holds
  (at least 64), i.e. at most 2,560 bytes of filter, 3,416 characters of base64, and under 3.6 KB of
  JSON for :meth:`to_wire` (:meth:`wire_bytes` measures it). :meth:`from_wire` refuses more than
  :data:`MAX_WIRE_BITS` bits.
* **false positives**: ``k = round(bits_per_key * ln 2)`` hash functions (7 at 10 bits per key)
  give a per-key false-positive rate of ``(1 - exp(-k n / m)) ** k`` <= 0.82 % at the full load
  (:meth:`false_positive_rate` states it for the actual ``n``, ``m``, ``k``). A match is the deepest
  block of the request found in the filter (:meth:`match_keys`: a binary search, since the published
  set is prefix-closed, whose answer must have its first block and the two blocks before it in the
  filter, else the blocks are walked from the first): a false positive lengthens a true match by one
  block with at most that probability, and a request with no true match gets a spurious one of
  ``min_match_chars`` = 256 characters (4 blocks at the default geometry) only if 4 lookups are false
  positives (~0.0082**4).
* **no false negatives** for the keys it was built from; the summary is as approximate as the
  index it summarises (what the LB sent, not what the engines still cache) and as old as the
  heartbeat that carried it.

Positions: double hashing of the 64-bit key, ``(lo + i * hi) mod m`` for ``i < k`` with ``lo`` the low
32 bits and ``hi`` the high 32 bits (odd). Bit ``p`` is bit ``p % 8`` of byte ``p // 8``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from ..prefix_index import PrefixIndex

__all__ = ["PrefixSummary", "SummarySendRule", "MAX_WIRE_BITS", "SUMMARY_REFRESH_S", "WIRE_VERSION"]

WIRE_VERSION = 1
#: the largest filter :meth:`PrefixSummary.from_wire` accepts (bits): 64 KiB
MAX_WIRE_BITS = 1 << 19
_M32 = 0xFFFFFFFF
_WIRE_KEYS = {"v", "geometry", "m", "k", "n", "bits"}
#: a region's prefix summary is sent when it changed, and at least this often (a restarted registry)
SUMMARY_REFRESH_S = 5.0


class SummarySendRule:
    """Which heartbeats carry this region's prefix summary: the first, each one after the summary
    changed (:meth:`RegionRouter.prefix_summary` returns a new object only when the index changed),
    and at least one every ``refresh_s`` (a restarted registry holds none). The registry keeps a
    region's last summary until a newer one replaces it and relays it in every table
    (``prefix_summaries``). The Serve ingress (``PeerMesh.heartbeat``) and the simulator's LB
    (``RegionLB.on_heartbeat``) both send by this rule, through the same registry code."""

    def __init__(self, refresh_s: float = SUMMARY_REFRESH_S):
        self.refresh_s = float(refresh_s)
        self._sent = None  # the last PrefixSummary sent, and when
        self._sent_at = float("-inf")

    def wire(self, summary: "PrefixSummary | None", now: float):
        """``summary.to_wire()`` if this heartbeat should carry it (and note it as sent), else None."""
        if summary is None or (summary is self._sent and now - self._sent_at < self.refresh_s):
            return None
        self._sent, self._sent_at = summary, now
        return summary.to_wire()


@lru_cache(maxsize=16)
def _hasher(block_chars: int, growth: float) -> PrefixIndex:
    """A PrefixIndex of the summary's geometry, used only to hash request text into block keys."""
    return PrefixIndex(block_chars, growth, max_nodes=1, max_entries=1)


class PrefixSummary:
    """A Bloom filter over prefix-index block keys of one geometry (see the module docstring)."""

    __slots__ = ("block_chars", "growth", "m", "k", "n", "_bits", "_flat")

    def __init__(self, block_chars: int, growth: float, m: int, k: int, n: int, bits: bytes):
        self.block_chars = block_chars
        self.growth = growth
        self.m = m
        self.k = k
        self.n = n
        self._bits = bits
        # one byte per bit (m bytes, kept locally, never sent): a probe is then one index per hash
        self._flat = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little").tobytes()

    # ------------------------------------------------------------ building
    @classmethod
    def from_keys(cls, keys: Sequence[int], block_chars: int, growth: float,
                  bits_per_key: int = 10) -> "PrefixSummary":
        if bits_per_key < 1:
            raise ValueError(f"bits_per_key must be >= 1, got {bits_per_key!r}")
        n = len(keys)
        m = max(64, 8 * math.ceil(n * bits_per_key / 8))
        k = max(1, round(bits_per_key * math.log(2)))
        bits = np.zeros(m, dtype=np.uint8)
        if n:
            arr = np.fromiter(keys, dtype=np.uint64, count=n)
            lo = (arr & np.uint64(_M32)).astype(np.int64)
            hi = ((arr >> np.uint64(32)) | np.uint64(1)).astype(np.int64)
            pos = (lo[:, None] + np.arange(k, dtype=np.int64)[None, :] * hi[:, None]) % m
            bits[pos.ravel()] = 1
        return cls(block_chars, float(growth), m, k, n, np.packbits(bits, bitorder="little").tobytes())

    @classmethod
    def build(cls, index: PrefixIndex, max_keys: int = 2048, bits_per_key: int = 10,
              min_chars: int = 0) -> "PrefixSummary":
        """The summary of ``index``: the keys of its most recently used prefixes, at most ``max_keys``."""
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        keys = index.recent_block_keys(max_keys, min_chars, max_records=8 * max_keys)
        return cls.from_keys(keys, index.block_chars, index.growth, bits_per_key)

    # ------------------------------------------------------------ wire format
    def to_wire(self) -> dict:
        """``{"v": 1, "geometry": [block_chars, growth], "m": bits, "k": hashes, "n": keys,
        "bits": base64 of the m/8 filter bytes}`` -- JSON-able, bounded (module docstring)."""
        return {"v": WIRE_VERSION, "geometry": [self.block_chars, self.growth], "m": self.m, "k": self.k,
                "n": self.n, "bits": base64.b64encode(self._bits).decode("ascii")}

    def wire_bytes(self) -> int:
        """Bytes of :meth:`to_wire` as compact JSON (what a heartbeat carries)."""
        return len(json.dumps(self.to_wire(), separators=(",", ":")))

    @classmethod
    def from_wire(cls, d) -> "PrefixSummary":
        """Parse and validate :meth:`to_wire`'s dict; ValueError naming the problem."""
        if not isinstance(d, dict):
            raise ValueError(f"prefix summary must be a dict, got {type(d).__name__}")
        missing = _WIRE_KEYS - set(d)
        if missing:
            raise ValueError(f"prefix summary lacks {sorted(missing)}")
        extra = set(d) - _WIRE_KEYS
        if extra:
            raise ValueError(f"prefix summary has unknown fields {sorted(extra)}")
        if d["v"] != WIRE_VERSION:
            raise ValueError(f"prefix summary version {d['v']!r} is not {WIRE_VERSION}")
        geo = d["geometry"]
        if not (isinstance(geo, list) and len(geo) == 2):
            raise ValueError(f"prefix summary geometry must be [block_chars, growth], got {geo!r}")
        bc, growth = geo
        if not _is_int(bc) or bc < 1:
            raise ValueError(f"prefix summary block_chars must be an integer >= 1, got {bc!r}")
        if isinstance(growth, bool) or not isinstance(growth, (int, float)) or not 0.0 <= growth <= 1.0:
            raise ValueError(f"prefix summary growth must be a number in [0, 1], got {growth!r}")
        m, k, n = d["m"], d["k"], d["n"]
        if not _is_int(m) or m < 8 or m % 8 or m > MAX_WIRE_BITS:
            raise ValueError(f"prefix summary m must be a multiple of 8 in [8, {MAX_WIRE_BITS}], got {m!r}")
        if not _is_int(k) or not 1 <= k <= 32:
            raise ValueError(f"prefix summary k must be an integer in [1, 32], got {k!r}")
        if not _is_int(n) or n < 0:
            raise ValueError(f"prefix summary n must be an integer >= 0, got {n!r}")
        b = d["bits"]
        if not isinstance(b, str) or len(b) > 4 * (m // 24 + 1):
            raise ValueError(f"prefix summary bits must be a base64 string of {m // 8} bytes")
        try:
            raw = base64.b64decode(b.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as e:
            raise ValueError(f"prefix summary bits are not base64 ({e})") from None
        if len(raw) != m // 8:
            raise ValueError(f"prefix summary bits hold {len(raw)} bytes, m={m} needs {m // 8}")
        return cls(int(bc), float(growth), int(m), int(k), int(n), raw)

    # ------------------------------------------------------------ queries
    def false_positive_rate(self) -> float:
        """The filter's per-key false-positive rate by the standard estimate, for its own n, m, k."""
        return (1.0 - math.exp(-self.k * self.n / self.m)) ** self.k if self.n else 0.0

    def __contains__(self, key: int) -> bool:
        m, flat = self.m, self._flat
        p = (key & _M32) % m  # positions (lo + i * hi) mod m, stepped
        step = ((key >> 32) | 1) % m
        for _ in range(self.k):
            if not flat[p]:
                return False
            p += step
            if p >= m:
                p -= m
        return True

    def prepare(self, text):
        """The request text hashed into this summary's block keys (a ``PreparedText``)."""
        return _hasher(self.block_chars, self.growth).prepare(text)

    def same_geometry(self, index: PrefixIndex) -> bool:
        return index.block_chars == self.block_chars and index.growth == self.growth

    def match_keys(self, keys: Sequence[int], ends: Sequence[int]) -> int:
        """Matched prefix length (bytes of canonical text) of a prompt with these block keys / ends.

        The true member set is prefix-closed (whole paths are published), so the deepest member is
        found by binary search (O(log blocks) probes); the two blocks before it are checked too, and if
        they are not members (a false positive misled the search) the blocks are walked from the first."""
        n = len(keys)
        if not n or keys[0] not in self:
            return 0
        lo, hi = 0, n - 1  # keys[lo] is a member
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if keys[mid] in self:
                lo = mid
            else:
                hi = mid - 1
        if all(keys[j] in self for j in range(max(1, lo - 2), lo)):
            return ends[lo]
        j = 0
        while j + 1 < n and keys[j + 1] in self:
            j += 1
        return ends[j]

    def match(self, req, prepared=None) -> int:
        """Matched prefix length (bytes) of a :class:`~ray_geolb.policy.base.RouteRequest` (or a text).
        ``prepared``: the request already hashed at this geometry (e.g. for the regional snapshot)."""
        if prepared is None:
            prepared = self.prepare(req) if isinstance(req, (str, bytes)) else \
                req.prepared_for(_hasher(self.block_chars, self.growth))
        return self.match_keys(prepared.keys, prepared.ends)

    def __repr__(self) -> str:
        return (f"PrefixSummary(n={self.n}, m={self.m}, k={self.k}, fpr={self.false_positive_rate():.4f}, "
                f"geometry=({self.block_chars}, {self.growth}))")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)

