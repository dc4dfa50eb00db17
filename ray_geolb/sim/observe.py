"""What a run is judged against, recorded while it runs: the ideal prefix-hit bound and the engines' load.

* :class:`IdealPrefixCache`, the **ideal** prefix-hit bound: one logical cache of unlimited size that
  sees every request the moment it is sent. Each request hits the longest prefix of its prompt blocks
  that any earlier request sent, counted as the engine counts hits (whole blocks of prompt tokens,
  at most ``(prompt - 1) // block_tokens`` blocks: the last prompt token is always computed), over
  its prompt tokens. No placement, eviction, capacity or timing can beat it on the same trace, so it
  is the maximum reuse the workload allows for an engine that caches prompt blocks (engines that also
  cache generated tokens could reuse more; the engine model does not). It is computed from the
  trace of the run itself (the requests sent, in send order), so a routing policy that changes the
  trace (a closed loop sends faster when it is served faster) moves the bound a little too. A
  request's hit is found when it is sent and counted once an engine has prefilled it (its first
  token), so the bound and the engines' hit rate cover the same requests (up to those an engine
  admitted but had not finished prefilling at the cut-off).
* :class:`LoadSampler`: per replica, every ``sample_period_s``: outstanding requests at the engine
  (pending + waiting + running), running, waiting and KV-cache usage; and the share of replica
  reports that said something was waiting (what SP-P reacts to).
"""

from __future__ import annotations

import math
from typing import Dict, List

from ray_geolb.percentile import percentile

__all__ = ["IdealPrefixCache", "LoadSampler"]


class IdealPrefixCache:
    """The ideal prefix-hit bound (module docstring); feed it every request as it is sent."""

    def __init__(self, block_tokens: int):
        self.block_tokens = block_tokens
        self._seen: set = set()
        self.hit_tokens = 0
        self.query_tokens = 0

    def observe(self, prompt_tokens: int, block_hashes) -> int:
        """One request's hit tokens against everything sent before it; its blocks are remembered.
        ``block_hashes`` are chained (block k's hash covers blocks 0..k), so a hit on block k means
        the whole prefix up to k was sent before. Add it to the totals with :meth:`count`."""
        seen = self._seen
        lim = min((prompt_tokens - 1) // self.block_tokens, len(block_hashes))
        k = 0
        while k < lim and block_hashes[k] in seen:
            k += 1
        seen.update(block_hashes)
        return k * self.block_tokens

    def remember(self, block_hashes) -> None:
        """Blocks a request's reply will fill (its prompt's were remembered by :meth:`observe`): an engine
        caches full output blocks, so the next turn, which replays the reply, can hit them."""
        self._seen.update(block_hashes)

    def count(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.hit_tokens += hit_tokens
        self.query_tokens += prompt_tokens

    def summary(self) -> Dict[str, float]:
        q = self.query_tokens
        return {"hit_tokens": self.hit_tokens, "query_tokens": q, "hit_rate": self.hit_tokens / q if q else 0.0}


def _dist(xs: List[float]) -> Dict[str, float]:
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "max": None}
    p50, p90 = percentile(xs, (50, 90))
    return {"mean": math.fsum(xs) / len(xs), "p50": p50, "p90": p90, "max": max(xs)}


class LoadSampler:
    """Per-replica engine load samples and the replica reports' waiting counts (module docstring)."""

    def __init__(self):
        self.outstanding: List[int] = []
        self.running: List[int] = []
        self.waiting: List[int] = []
        self.kv_usage: List[float] = []
        self.reports = 0
        self.reports_waiting = 0
        self.max_reported_waiting = 0

    def sample(self, engines) -> None:
        for eng in engines:
            st = eng.stats()
            self.outstanding.append(eng.num_unfinished)
            self.running.append(st["num_running"])
            self.waiting.append(st["num_waiting"])
            self.kv_usage.append(st["kv_cache_usage"])

    def report(self, num_waiting: int) -> None:
        self.reports += 1
        if num_waiting > 0:
            self.reports_waiting += 1
            if num_waiting > self.max_reported_waiting:
                self.max_reported_waiting = num_waiting

    def summary(self) -> dict:
        return {
            "outstanding_per_replica": _dist(self.outstanding),
            "running_per_replica": _dist(self.running),
            "waiting_per_replica": _dist(self.waiting),
            "kv_usage": _dist(self.kv_usage),
            "reports": self.reports,
            "reports_with_waiting": self.reports_waiting,
            "reports_with_waiting_share": self.reports_waiting / self.reports if self.reports else 0.0,
            "max_reported_waiting": self.max_reported_waiting,
        }
