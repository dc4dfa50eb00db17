"""One FCFS hold queue: the requests waiting at a load balancer, in arrival order, with their prompt tokens.

Selective pushing holds a request at the LB when no replica is available for it; held requests are
served strictly first come, first served (only the head may take a local replica). The same class
holds them in the simulator's LB (``sim/region_lb.py``) and in the Serve model router's held queue
(``GeoPrefixRouter`` in ``serve/router.py``), so "what waits here" and "what waits ahead of this
request" -- the region layer's ``Q_lb`` and the slot wait's ``ahead`` -- are counted one way.

Entries are keyed (a request id, or any hashable); each keeps the prompt tokens it had when it was
queued (``tokens_of(item)``), and the queue keeps their sum, so ``tokens`` is O(1). Plain Python, no
lock: a reader on another thread sees each figure whole (``len``, ``tokens``), but not the two at one
instant.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, Iterator, Optional, Tuple, TypeVar

__all__ = ["HoldQueue"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class HoldQueue(Generic[K, V]):
    """Entries in arrival order with their prompt-token sum (see the module docstring)."""

    __slots__ = ("_items", "_tokens", "_tokens_of", "_seq")

    def __init__(self, tokens_of: Callable[[V], int]):
        self._items: "OrderedDict[K, Tuple[V, int, int]]" = OrderedDict()
        self._tokens = 0
        self._tokens_of = tokens_of
        self._seq = 0  # each entry's place: increasing in arrival order (restore puts one back by it)

    # ------------------------------------------------------------ reads
    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __contains__(self, key) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        """Keys, head first."""
        return iter(self._items)

    def __getitem__(self, key: K) -> V:
        return self._items[key][0]

    def items(self) -> Iterator[Tuple[K, V]]:
        """(key, item) pairs, head first."""
        return ((k, e[0]) for k, e in self._items.items())

    @property
    def tokens(self) -> int:
        """Prompt tokens of every queued entry."""
        return self._tokens

    def head(self) -> Optional[Tuple[K, V]]:
        """(key, item) of the oldest entry, or None when empty."""
        for k, e in self._items.items():
            return k, e[0]
        return None

    def is_head(self, key) -> bool:
        return bool(self._items) and next(iter(self._items)) == key

    def ahead(self, key) -> Tuple[int, int]:
        """(entries, prompt tokens) queued before ``key``; a key not queued is a newcomer, behind all."""
        n = tok = 0
        for k, e in self._items.items():
            if k == key:
                break
            n += 1
            tok += e[1]
        return n, tok

    def place(self, key) -> Optional[int]:
        """``key``'s place in arrival order (what :meth:`restore` takes), or None if it is not queued."""
        e = self._items.get(key)
        return e[2] if e is not None else None

    # ------------------------------------------------------------ changes
    def append(self, key: K, item: V) -> bool:
        """Queue ``item`` at the tail; False (and nothing changes) if ``key`` is already queued."""
        if key in self._items:
            return False
        t = self._tokens_of(item)
        self._seq += 1
        self._items[key] = (item, t, self._seq)
        self._tokens += t
        return True

    def restore(self, key: K, item: V, place: int) -> bool:
        """Put ``item`` back at its old ``place`` (from :meth:`place`), before every entry that came after it
        (a request handed to a peer that refused it); False if ``key`` is already queued. O(entries)."""
        if key in self._items:
            return False
        t = self._tokens_of(item)
        items = self._items
        later = [k for k, e in items.items() if e[2] > place]
        items[key] = (item, t, place)
        self._tokens += t
        for k in later:  # everything that came after it goes behind it again, in its order
            items.move_to_end(k)
        return True

    def __setitem__(self, key: K, item: V) -> None:
        """Append, or replace a queued entry's item in its place (its tokens taken anew)."""
        old = self._items.get(key)
        t = self._tokens_of(item)
        if old is None:
            self._seq += 1
        self._items[key] = (item, t, old[2] if old is not None else self._seq)
        self._tokens += t - (old[1] if old is not None else 0)

    def remove(self, key) -> Optional[V]:
        """Take ``key`` out wherever it stands; its item, or None if it was not queued."""
        e = self._items.pop(key, None)
        if e is None:
            return None
        self._tokens -= e[1]
        return e[0]

    def pop_head(self) -> Tuple[K, V]:
        """Take the oldest entry out (KeyError when empty)."""
        k, (v, t, _) = self._items.popitem(last=False)
        self._tokens -= t
        return k, v
