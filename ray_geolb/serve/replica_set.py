"""GeoPrefixRouter's view of its deployment's replicas: which ones it routes to (those of its region),
and the reports they send.

* Candidates: replicas whose ``replica_metadata["region"]`` equals the router's ``region`` (replicas
  reporting no region count as local; ``region=None``: every replica is local). Other regions'
  replicas are ignored: cross-region forwarding is the region ingress's job. The policy's targets
  follow this set.
* Reports: each replica's ``routing_stats`` (``record_routing_stats``: num_waiting, num_running,
  kv_cache_usage, timestamp, max_num_seqs, num_gpu_blocks, block_tokens, ttft_samples), broadcast by
  Serve whenever one changes, go to ``policy.on_stats`` once per new report (de-duplicated by
  ``timestamp``), and the report's ``ttft_samples`` to ``policy.observe_ttft``. A malformed report
  (see ``ReplicaStats.from_dict``) is counted in ``counters["bad_stats"]``, logged, and ignored.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

from ray_geolb.policy import ReplicaStats

__all__ = ["ReplicaSet"]


class ReplicaSet:
    def __init__(self, policy, region: Optional[str], counters: Dict[str, int], log_error: Callable[[str], None]):
        self.policy = policy
        self.region = region
        self.counters = counters
        self._log_error = log_error
        self.by_id: Dict[str, Any] = {}  # unique_id -> RunningReplica, every region's
        self.local_ids: List[str] = []
        self.local_set: frozenset = frozenset()
        self.local_reps: List[Any] = []
        self.last_stats: Dict[str, Any] = {}

    def _is_local(self, replica) -> bool:
        if self.region is None:
            return True
        reg = (replica.replica_metadata or {}).get("region")
        return reg is None or reg == self.region

    def sync(self, replicas) -> None:
        """The deployment's replicas as Serve lists them now, with their latest reports."""
        by_id = {}
        local = []
        for r in replicas:
            uid = r.replica_id.unique_id
            by_id[uid] = r
            if self._is_local(r):
                local.append(uid)
        self.by_id = by_id
        if frozenset(local) != self.local_set:
            self._set_local(local)
        self.local_reps = [by_id[u] for u in self.local_ids]
        now = time.time()
        for uid in self.local_ids:
            st = by_id[uid].routing_stats
            if st:
                self._ingest(uid, st, now)

    def _set_local(self, local: List[str]) -> None:
        self.local_set = frozenset(local)
        self.local_ids = local
        self.policy.set_targets(local)
        for uid in list(self.last_stats):
            if uid not in self.local_set:
                del self.last_stats[uid]

    def _ingest(self, uid: str, st: dict, now: float) -> None:
        last = self.last_stats.get(uid)
        if last is st or (last is not None and last.get("timestamp") is not None
                          and last.get("timestamp") == st.get("timestamp")):
            return
        self.last_stats[uid] = st
        try:
            rs = ReplicaStats.from_dict(st, default_timestamp=now, now=now)
            self.policy.on_stats(uid, rs)
            if rs.ttft_samples:  # TTFTs the replica measured since its previous report
                observe = self.policy.observe_ttft
                for x, y in rs.ttft_samples:
                    observe(uid, x, y)
                self.counters["ttft_samples"] += len(rs.ttft_samples)
        except Exception as e:  # a bad report must not break routing
            self.counters["bad_stats"] += 1
            self._log_error(f"bad routing_stats from {uid}: {e!r}")

    def drop(self, uid: str) -> None:
        """A replica died: it stops being a target at once (Serve's next broadcast confirms it)."""
        if uid in self.local_set:
            rest = [u for u in self.local_ids if u != uid]
            self.local_set = frozenset(rest)
            self.local_ids = rest
            self.local_reps = [self.by_id[u] for u in rest if u in self.by_id]
            self.policy.set_targets(rest)
        self.by_id.pop(uid, None)
        self.last_stats.pop(uid, None)

    def reported_load(self) -> Dict[str, list]:
        """``{replica: [waiting, running]}`` as last reported (any thread)."""
        out = {}
        for uid in list(self.local_ids):
            st = self.last_stats.get(uid) or {}
            out[uid] = [st.get("num_waiting", 0), st.get("num_running", 0)]
        return out
