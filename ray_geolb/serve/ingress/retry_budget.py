"""The ingress's retry budget: :class:`RetryBudget` (Envoy's and SGLang's model gateway's idea).

A forward that could not reach its peer is retried with another peer or locally (never the same peer:
its circuit is open, ``peers.py``). Retries add load exactly when regions fail, so they are budgeted:
each request earns ``ratio`` of a retry (at most ``burst`` saved up), and ``min_per_s`` more are
earned every second whatever the traffic, so a quiet region still retries. A request that finds the
budget spent is answered 503 ``forward_failed`` with ``Retry-After`` instead of being retried.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["RetryBudget"]


class RetryBudget:
    """Retries earned by requests (``ratio`` each) and by time (``min_per_s``), at most ``burst`` saved."""

    def __init__(self, ratio: float = 0.2, min_per_s: float = 3.0, burst: float = 20.0,
                 clock: Callable[[], float] = time.monotonic):
        for name, v in (("ratio", ratio), ("min_per_s", min_per_s), ("burst", burst)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"retry budget: {name} must be a number >= 0, got {v!r}")
        self.ratio = float(ratio)
        self.min_per_s = float(min_per_s)
        self.burst = max(1.0, float(burst))
        self._clock = clock
        self._tokens = self.burst
        self._t = clock()
        self.spent = 0
        self.refused = 0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._t) * self.min_per_s)
        self._t = now

    def on_request(self) -> None:
        """A request arrived: it earns ``ratio`` of a retry."""
        self._tokens = min(self.burst, self._tokens + self.ratio)

    def try_spend(self) -> bool:
        """Take one retry if the budget has one."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            self.spent += 1
            return True
        self.refused += 1
        return False

    @property
    def available(self) -> float:
        self._refill()
        return self._tokens
