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
* No load signal: a replica whose reports never carried a load field (``num_waiting`` /
  ``num_running`` or vLLM's names) ``load_signal_grace_s`` after it appeared -- a stock ``LLMServer``,
  whose ``record_routing_stats`` is only KV-event metadata -- leaves selective pushing blind (every
  replica looks empty). The router then logs one warning naming the fix (``server_cls =
  GeoVLLMServer``) and counts each such replica in ``counters["no_load_signal"]``.
* Idle engines: a new report of nothing waiting and nothing running goes to ``on_idle`` (the router
  drops in-flight records routed there long before: ``RequestBook.reconcile``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from ray_geolb.policy import ReplicaStats
from ray_geolb.serve.clock import policy_now

#: report fields that carry an engine's load (ours and vLLM's SchedulerStats names)
LOAD_FIELDS = ("num_waiting", "num_waiting_reqs", "waiting", "pending", "num_running", "num_running_reqs", "running")

__all__ = ["ReplicaSet"]


class ReplicaSet:
    def __init__(self, policy, region: Optional[str], counters: Dict[str, int], log_error: Callable[[str], None],
                 on_idle: Optional[Callable[[str, float], None]] = None):
        self.policy = policy
        self.on_idle = on_idle  # (replica, report time) of each new report of an idle engine
        self.region = region
        self.counters = counters
        self._log_error = log_error
        self.by_id: Dict[str, Any] = {}  # unique_id -> RunningReplica, every region's
        self.local_ids: List[str] = []
        self.local_set: frozenset = frozenset()
        self.local_reps: List[Any] = []
        self.last_stats: Dict[str, Any] = {}
        self.first_seen: Dict[str, float] = {}  # when each local replica appeared
        self.loaded: set = set()  # replicas that sent a report with a load field
        self.blind: set = set()  # replicas found without a load signal (counted once each)

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
        now = policy_now()
        for uid in self.local_ids:
            self.first_seen.setdefault(uid, now)
            st = by_id[uid].routing_stats
            if st:
                if uid not in self.loaded and any(k in st for k in LOAD_FIELDS):
                    self.loaded.add(uid)
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
            if self.on_idle is not None and rs.num_waiting == 0 and rs.num_running == 0 and uid in self.loaded:
                self.on_idle(uid, rs.timestamp)
            if rs.ttft_samples:  # TTFTs the replica measured since its previous report
                observe = self.policy.observe_ttft
                for x, y in rs.ttft_samples:
                    observe(uid, x, y)
                self.counters["ttft_samples"] += len(rs.ttft_samples)
        except Exception as e:  # a bad report must not break routing
            self.counters["bad_stats"] += 1
            self._log_error(f"bad routing_stats from {uid}: {e!r}")

    def find_blind(self, now: float, grace_s: float) -> list:
        """Local replicas that have had no report with a load field for ``grace_s`` since they
        appeared, not reported before (each is counted once in ``counters["no_load_signal"]``)."""
        new = [u for u in self.local_ids if u not in self.loaded and u not in self.blind
               and now - self.first_seen.get(u, now) >= grace_s]
        if new:
            self.blind.update(new)
            self.counters["no_load_signal"] = self.counters.get("no_load_signal", 0) + len(new)
        return new

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
        self.first_seen.pop(uid, None)

    def reported_load(self) -> Dict[str, list]:
        """``{replica: [waiting, running]}`` as last reported (any thread)."""
        out = {}
        for uid in list(self.local_ids):
            st = self.last_stats.get(uid) or {}
            out[uid] = [st.get("num_waiting", 0), st.get("num_running", 0)]
        return out
