"""The region layer's two estimators: RTT to each peer (:class:`RttTable`) and the rate at which this
region's local requests finish (:class:`DrainRate`, the 'cost' selector's wait for a local slot)."""

from __future__ import annotations

import math
from collections import deque
from typing import Deque, Dict, Optional

__all__ = ["RttTable", "DrainRate"]


class RttTable:
    """EWMA of measured RTTs per region: ``v += alpha * (sample - v)``, the first sample as is.

    A :class:`~ray_geolb.policy.region.router.RegionRouter` owns one (``RegionRouter.rtt``, fed by
    ``observe_rtt``: the simulator's probes riding on heartbeats, the Serve ingress's pings)."""

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self._v: Dict[str, float] = {}

    def observe(self, region: str, seconds: float) -> float:
        s = float(seconds)
        if not (s >= 0.0 and math.isfinite(s)):
            raise ValueError(f"RTT sample for {region!r} must be a finite number >= 0, got {seconds!r}")
        old = self._v.get(region)
        v = s if old is None else old + self.alpha * (s - old)
        self._v[region] = v
        return v

    def get(self, region: str) -> Optional[float]:
        return self._v.get(region)

    def forget(self, region: str) -> None:
        self._v.pop(region, None)

    def as_dict(self) -> Dict[str, float]:
        """A copy: region -> current estimate (seconds)."""
        return dict(self._v)


class DrainRate:
    """Local completions per second over a sliding window of ``window_s`` seconds.

    ``observe(now)`` per completion, ``rate(now)`` per query: both trim the timestamps older than the
    window from the left (amortised O(1)); at most ``max_samples`` are kept (past that the oldest go,
    and the rate is taken over the span of those kept, so it stays right). ``rate`` is
    ``n / (now - oldest)`` over the ``n`` completions in the window, None while ``n < min_samples``.
    Timestamps are kept non-decreasing (a sample older than the newest counts as the newest).
    """

    __slots__ = ("window_s", "min_samples", "_t")

    def __init__(self, window_s: float = 10.0, min_samples: int = 4, max_samples: int = 4096):
        window_s = float(window_s)
        if not (window_s > 0.0 and math.isfinite(window_s)):
            raise ValueError(f"drain_window_s must be a finite number > 0, got {window_s!r}")
        if int(min_samples) != min_samples or min_samples < 2:
            raise ValueError(f"drain_min_samples must be an integer >= 2, got {min_samples!r}")
        if int(max_samples) != max_samples or max_samples < min_samples:
            raise ValueError(f"max_samples must be an integer >= drain_min_samples, got {max_samples!r}")
        self.window_s = window_s
        self.min_samples = int(min_samples)
        self._t: Deque[float] = deque(maxlen=int(max_samples))

    def _trim(self, now: float) -> None:
        t = self._t
        lo = now - self.window_s
        while t and t[0] < lo:
            t.popleft()

    def observe(self, now: float) -> None:
        now = float(now)
        if not math.isfinite(now):
            raise ValueError(f"completion time must be finite, got {now!r}")
        t = self._t
        if t and now < t[-1]:
            now = t[-1]
        t.append(now)
        self._trim(now)

    def rate(self, now: float) -> Optional[float]:
        self._trim(now)
        t = self._t
        if len(t) < self.min_samples:
            return None
        return len(t) / max(now - t[0], 1e-3)

    def __len__(self) -> int:
        return len(self._t)
