"""GeoPrefixRouter: the ray_geolb policy core as a Ray Serve ``RequestRouter`` (layer 2: a replica in
this region).

Configure it on the model deployment::

    request_router_config={
        "request_router_class": "ray_geolb.serve.router.GeoPrefixRouter",
        "request_router_kwargs": {"policy": "geoprefix", "region": "us-east",
                                  "queue_bound": 1024, "wait_limit_s": 60.0},
        "request_routing_stats_period_s": 0.5,
    }

How it works (Ray 2.60, see /work/shared/notes/ray-2.60-facts.md):

* Candidates: replicas whose ``replica_metadata["region"]`` equals the router's ``region`` (replicas
  reporting no region count as local; ``region=None`` = every replica is local). Other regions'
  replicas are ignored here: cross-region forwarding is the region ingress's job.
* Policy: ``policy`` names any ``ray_geolb.policy`` policy (or a config dict); the default
  (:data:`DEFAULT_POLICY`) is ``geoprefix``: SP-P + prefix index + per-request TTFT cost with t_p
  learned online from the replicas' TTFT reports (below).
* Load: each replica's ``routing_stats`` (``record_routing_stats``: num_waiting, num_running,
  kv_cache_usage, timestamp, max_num_seqs, num_gpu_blocks, block_tokens) is fed to
  ``policy.on_stats`` whenever Serve broadcasts a change (``update_replicas``); a new report's
  ``ttft_samples`` (``[[uncached_prompt_tokens, ttft_s], ...]`` measured by the replica since its
  previous report: the emulated server and the vLLM stat-logger plugin send them) go to
  ``policy.observe_ttft`` once per report (reports are de-duplicated by ``timestamp``); a malformed
  report is counted in ``counters["bad_stats"]`` and ignored. The router's own
  in-flight accounting: a *reservation* (``tracker.on_dispatch``) when ``choose_replicas`` picks a
  replica (so two requests routed before the first is acknowledged do not both see the same
  headroom), confirmed by ``on_request_routed`` -> ``policy.on_dispatch`` (prefix-index insert), and
  released by ``on_request_completed`` -> ``policy.on_complete``.
* Selective pushing (SP-P): when the policy holds (returns None), ``choose_replicas`` returns ``[]``
  with ``routing_context.should_backoff = True``. Held requests are served strictly FCFS: a request
  may take a replica only if no older held request is waiting (the head of the held queue goes
  first). Instead of sleeping Ray's full backoff (25 ms doubling to 500 ms), a held request's
  routing task waits on a per-request event that is set when capacity may have appeared (a stats
  report, a completion, the previous head leaving), with Ray's backoff as the timeout.
  Requests beyond Ray's 2 x num_replicas routing tasks wait in Ray's own FIFO deque, in order.
* Bounds: a request arriving when ``queue_bound`` requests already wait in this router fails at once
  with :class:`~ray_geolb.serve.errors.RouterQueueFull`; a request not routed within
  ``wait_limit_s`` of its creation fails with :class:`~ray_geolb.serve.errors.RouterWaitTimeout`.
  Both carry ``retry_after_s`` and reach the caller of ``handle.remote(...)`` unchanged (the router
  runs in the caller's process). Mechanism: this class wraps Ray's (private, 2.60)
  ``_choose_replica_for_request`` -- the per-request coroutine that awaits ``PendingRequest.future``
  -- in ``asyncio.timeout``; on timeout Ray's own cancellation path cleans up (cancels the future
  and the routing task) and we raise the typed error. With ``error_delivery="future"`` the wait
  limit is instead enforced inside ``choose_replicas`` via ``pending_request.future.set_exception``
  (only for requests Ray has handed to ``choose_replicas``; kept as the documented public-API path).
* ``choose_replicas`` never raises (an exception there hangs that request forever in Ray 2.60): any
  internal error is logged (rate-limited), counted, and the request falls back to power-of-two over
  the local candidates (all candidates if none are local).
* Everything is in process, O(1)-ish per event, no blocking calls, no ``FIFOMixin``.

Ray cloudpickles this module by value into the processes that hold a handle, so module-level state
here is per-copy; the per-process registry lives in ``ray_geolb.serve`` (imported by reference):
``GeoPrefixRouter.instances()`` / ``GeoPrefixRouter.for_deployment(app, deployment)``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from typing import Any, Dict, List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

import ray_geolb.serve as _serve_pkg
from ray_geolb.policy import ReplicaStats, RouteRequest, build_policy, canonical_text
from ray_geolb.policy.canonical import PromptFormatError
from ray_geolb.policy.hold_queue import HoldQueue
from ray_geolb.serve.errors import RouterQueueFull, RouterWaitTimeout

__all__ = ["GeoPrefixRouter", "DEFAULT_POLICY", "extract_prompt_text"]

logger = logging.getLogger("ray.serve")

#: The policy a GeoPrefixRouter uses when ``request_router_kwargs`` names none.
DEFAULT_POLICY = "geoprefix"
DECISION_LOG_SIZE = 10_000
_ERROR_LOG_INTERVAL_S = 10.0

try:  # Python >= 3.11
    _timeout_ctx = asyncio.timeout
except AttributeError:  # pragma: no cover
    _timeout_ctx = None


class _NoPrompt(Exception):
    pass


def extract_prompt_text(args, kwargs) -> Optional[str]:
    """Canonical text of a Serve call's prompt, or None if there is none we understand.

    First positional argument with ``.messages`` / ``.prompt`` (Ray Serve LLM's
    ChatCompletionRequest / CompletionRequest), a plain string, or a dict body; else keyword
    arguments ``body`` / ``request`` / ``prompt`` / ``messages``.
    """
    cands = []
    if args:
        cands.append(args[0])
    if kwargs:
        for k in ("body", "request", "prompt_or_body", "prompt"):
            if k in kwargs:
                cands.append(kwargs[k])
        if "messages" in kwargs:
            cands.append({"messages": kwargs["messages"]})
    for c in cands:
        if isinstance(c, (str, bytes, dict)) or hasattr(c, "messages") or hasattr(c, "prompt"):
            try:
                return canonical_text(c)
            except PromptFormatError:
                continue
    return None


class _Entry:
    """A request ``choose_replicas`` has seen and that is not yet confirmed routed."""

    __slots__ = ("req", "pr", "created", "target", "matched", "reason", "fallback", "wake", "task")

    def __init__(self, req: RouteRequest, pr: PendingRequest, created: float):
        self.req = req
        self.pr = pr
        self.created = created
        self.target: Optional[str] = None  # reserved replica (unique_id)
        self.matched = 0
        self.reason = ""
        self.fallback = False
        self.wake: Optional[asyncio.Event] = None
        self.task = None


def _entry_tokens(ent: _Entry) -> int:
    return ent.req.prompt_tokens


class GeoPrefixRouter(RequestRouter):
    """Prefix-aware, selective-pushing, region-local request router (see the module docstring)."""

    # ------------------------------------------------------------------ setup
    def initialize_state(
        self,
        policy: Any = None,
        region: Optional[str] = None,
        queue_bound: Optional[int] = 1024,
        wait_limit_s: Optional[float] = 60.0,
        retry_after_s: float = 1.0,
        error_delivery: str = "wrap",
        decision_log_size: int = DECISION_LOG_SIZE,
        stats_seen_margin_s: float = 0.05,
        _inject_error_every: int = 0,
        **unknown,
    ):
        if unknown:
            raise ValueError(
                f"GeoPrefixRouter: unknown request_router_kwargs {sorted(unknown)}; known: policy, region, "
                "queue_bound, wait_limit_s, retry_after_s, error_delivery, decision_log_size, stats_seen_margin_s")
        if queue_bound is not None and (not isinstance(queue_bound, int) or queue_bound < 1):
            raise ValueError(f"GeoPrefixRouter: queue_bound must be a positive int or None, got {queue_bound!r}")
        if wait_limit_s is not None and not (isinstance(wait_limit_s, (int, float)) and wait_limit_s > 0):
            raise ValueError(f"GeoPrefixRouter: wait_limit_s must be > 0 or None, got {wait_limit_s!r}")
        if error_delivery not in ("wrap", "future"):
            raise ValueError(f"GeoPrefixRouter: error_delivery must be 'wrap' or 'future', got {error_delivery!r}")
        if region is not None and (not isinstance(region, str) or not region):
            raise ValueError(f"GeoPrefixRouter: region must be a non-empty string or None, got {region!r}")
        self.policy_spec = DEFAULT_POLICY if policy is None else policy
        self.policy = build_policy(self.policy_spec)
        # Replica reports come from another process: a request dispatched just before a report was
        # measured may not have reached the engine's scheduler yet, so it must not count as seen by
        # that report (SP-P would grant its slot twice). Unless the policy config sets it, use the
        # router's transport margin.
        if "seen_margin_s" not in self.policy.config.availability.model_fields_set:
            if not (isinstance(stats_seen_margin_s, (int, float)) and stats_seen_margin_s >= 0):
                raise ValueError(f"GeoPrefixRouter: stats_seen_margin_s must be >= 0, got {stats_seen_margin_s!r}")
            self.policy.tracker.seen_margin_s = float(stats_seen_margin_s)
        self.policy_name = self.policy.name
        self.region = region
        self.queue_bound = queue_bound
        self.wait_limit_s = None if wait_limit_s is None else float(wait_limit_s)
        self.retry_after_s = float(retry_after_s)
        self.error_delivery = error_delivery
        self._inject_every = int(_inject_error_every or 0)
        self._ncalls = 0
        self._rng = random.Random(0)

        self._by_id: Dict[str, RunningReplica] = {}
        self._local_ids: List[str] = []
        self._local_set: frozenset = frozenset()
        self._local_reps: List[RunningReplica] = []
        self._last_stats: Dict[str, Any] = {}
        self._entries: Dict[str, _Entry] = {}
        # held requests, FCFS by internal id, with their prompt-token sum (the region layer's Q_lb)
        self._held: "HoldQueue[str, _Entry]" = HoldQueue(_entry_tokens)
        self._task_iid: Dict[Any, str] = {}
        self._inflight: Dict[str, tuple] = {}  # internal id -> (target, RouteRequest)
        self._decisions: "OrderedDict[str, dict]" = OrderedDict()
        self._decision_log_size = int(decision_log_size)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._last_err_log = 0.0
        self._suppressed_errs = 0
        self.counters: Dict[str, int] = {
            "routed": 0, "held": 0, "no_prompt": 0, "internal_errors": 0, "fallback": 0,
            "queue_full": 0, "wait_timeout": 0, "bad_stats": 0, "ttft_samples": 0,
        }
        dep = getattr(self, "_deployment_id", None)
        key = (getattr(dep, "app_name", ""), getattr(dep, "name", ""))
        self.deployment_key = key
        _serve_pkg.register_router(key, self)
        if getattr(self, "_replicas", None):
            self._safe(self._sync, list(self._replicas.values()))

    @classmethod
    def instances(cls, app_name: Optional[str] = None, deployment_name: Optional[str] = None) -> list:
        """Live GeoPrefixRouter instances in this process (any copy of the class)."""
        return _serve_pkg.routers(app_name, deployment_name)

    @classmethod
    def for_deployment(cls, app_name: str, deployment_name: str):
        return _serve_pkg.router_for(app_name, deployment_name)

    # ------------------------------------------------------------------ read-only views (any thread)
    def queue_len(self) -> int:
        """Requests waiting for a replica in this router (Ray's pending queue, seen by us or not)."""
        return len(getattr(self, "_pending_requests_by_id", ()))

    def held_len(self) -> int:
        return len(self._held)

    def num_local_replicas(self) -> int:
        return len(self._local_ids)

    def num_available(self) -> int:
        return len(self.policy.tracker.available)

    def queued_tokens(self) -> float:
        """Prompt tokens of the requests waiting in this router: held ones by their size, those Ray
        has not handed to ``choose_replicas`` yet at the policy's mean prompt length (the region
        layer's ``Q_lb``). Safe to call from another thread (the held queue's count and token sum
        are each read whole)."""
        held = self._held
        n = len(held)
        tok = float(held.tokens)
        rest = self.queue_len() - n
        if rest > 0:
            mean = self.policy.mean_prompt_tokens
            tok += rest * float(mean or self.policy.tracker.request_tokens)
        return tok

    def heartbeat_info(self) -> dict:
        return {
            "region": self.region,
            "available_replicas": self.num_available(),
            "queue_len": self.queue_len(),
            "local_replicas": self.num_local_replicas(),
            "timestamp": time.time(),
        }

    def decision(self, request_id: str) -> Optional[dict]:
        """Routing decision of a request, by Serve ``request_id`` or ``internal_request_id``."""
        return self._decisions.get(request_id)

    def local_replica_ids(self) -> List[str]:
        return list(self._local_ids)

    def accounting(self) -> dict:
        """What requests hold in this router right now (leak checks; any thread). Idle values: every
        count 0, ``unavailable`` 0 once fresh reports arrived, ``engines`` all ``[0, 0]``."""
        tr = self.policy.tracker
        engines = {}
        for uid in list(self._local_ids):
            st = self._last_stats.get(uid) or {}
            engines[uid] = [st.get("num_waiting", 0), st.get("num_running", 0)]
        return {
            "router_pending": self.queue_len(),  # Ray's pending requests for this deployment
            "router_entries": len(self._entries),  # requests choose_replicas saw, not yet routed
            "router_held": len(self._held),
            "router_inflight": len(self._inflight),  # routed, not completed
            "tracker_outstanding": tr.total_outstanding(),  # reservations + in flight, per policy
            "unavailable": len(self._local_ids) - len(tr.available),
            "distrusted_reports": tr.distrusted_reports,
            "engines": engines,
        }

    # ------------------------------------------------------------------ replicas and stats
    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._safe(self._sync, replicas)

    def _sync(self, replicas) -> None:
        by_id = {}
        local = []
        region = self.region
        for r in replicas:
            uid = r.replica_id.unique_id
            by_id[uid] = r
            if region is None:
                local.append(uid)
            else:
                md = r.replica_metadata or {}
                reg = md.get("region")
                if reg is None or reg == region:
                    local.append(uid)
        self._by_id = by_id
        if frozenset(local) != self._local_set:
            self._local_set = frozenset(local)
            self._local_ids = local
            self.policy.set_targets(local)
            for uid in list(self._last_stats):
                if uid not in self._local_set:
                    del self._last_stats[uid]
        self._local_reps = [by_id[u] for u in self._local_ids]
        now = time.time()
        for uid in self._local_ids:
            st = by_id[uid].routing_stats
            if not st:
                continue
            last = self._last_stats.get(uid)
            if last is st or (last is not None and last.get("timestamp") is not None
                              and last.get("timestamp") == st.get("timestamp")):
                continue
            self._last_stats[uid] = st
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
        if self._held and self.policy.tracker.available:
            self._wake_head()

    # ------------------------------------------------------------------ routing
    async def choose_replicas(
        self, candidate_replicas: List[RunningReplica], pending_request: Optional[PendingRequest] = None
    ) -> List[List[RunningReplica]]:
        if pending_request is None:
            return [candidate_replicas]
        try:
            pending_request.routing_context.should_backoff = True
            return self._choose(candidate_replicas, pending_request)
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"choose_replicas failed, falling back to power-of-two: {e!r}")
            try:
                return self._fallback(candidate_replicas, pending_request)
            except Exception:
                return [list(candidate_replicas)]

    def _choose(self, candidates, pr: PendingRequest):
        self._ncalls += 1
        if self._inject_every and self._ncalls % self._inject_every == 0:
            raise RuntimeError(f"injected router error (call {self._ncalls})")
        if pr.future.done():  # failed or cancelled: let Ray's loop notice and stop
            return [candidates]
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if len(candidates) != len(self._by_id):
            self._sync(candidates)
        now = time.time()
        iid = pr.metadata.internal_request_id
        ent = self._entries.get(iid)
        if ent is None:
            ent = self._new_entry(pr)
        elif ent.target is not None:  # retried (rejected, or Ray could not use our pick): undo
            self._unreserve(ent)
        if (self.error_delivery == "future" and self.wait_limit_s is not None
                and now - ent.created > self.wait_limit_s):
            self._fail_future(ent, self._timeout_error(now - ent.created))
            return [candidates]
        held = self._held
        if held:
            self._purge_head()
            if held and held.head()[0] != iid:
                self._hold(ent, iid)
                return []
        d = self.policy.choose(ent.req, now, None)
        if d is None and self.policy.tracker.revalidate(now):  # a frozen report hid an idle replica
            d = self.policy.choose(ent.req, now, None)
        if d is None:
            self._hold(ent, iid)
            return []
        rep = self._by_id.get(d.target)
        if rep is None:
            raise RuntimeError(f"policy chose unknown replica {d.target!r}")
        if iid in held:
            self._unhold(iid, ent)
            self._wake_head()
        self.policy.tracker.on_dispatch(d.target, iid, now, tokens=ent.req.prompt_tokens)
        ent.target, ent.matched, ent.reason, ent.fallback = d.target, d.matched, d.reason, False
        return [[rep]]

    def _fallback(self, candidates, pr: PendingRequest):
        self.counters["fallback"] += 1
        pool = self._local_reps or list(candidates)
        if not pool:
            return [list(candidates)]
        try:
            iid = pr.metadata.internal_request_id
            ent = self._entries.get(iid)
            if ent is not None:
                if ent.target is not None:
                    self._unreserve(ent)
                if iid in self._held:
                    self._unhold(iid, ent)
                    self._wake_head()
                ent.fallback, ent.reason = True, "fallback_power_of_two"
        except Exception:
            pass
        return [self._rng.sample(pool, 2) if len(pool) > 2 else list(pool)]

    def _new_entry(self, pr: PendingRequest) -> _Entry:
        md = pr.metadata
        text = extract_prompt_text(pr.args, pr.kwargs)
        if text is None:
            self.counters["no_prompt"] += 1
            text = ""
        req = RouteRequest(
            request_id=md.internal_request_id,
            text=text,
            session_key=getattr(md, "session_id", None) or None,
            region=self.region,
        )
        ent = _Entry(req, pr, pr.created_at)
        self._entries[md.internal_request_id] = ent
        return ent

    def _hold(self, ent: _Entry, iid: str) -> None:
        if self._held.append(iid, ent):
            self.counters["held"] += 1
        if ent.wake is None:
            ent.wake = asyncio.Event()
        task = asyncio.current_task()
        if task is not None and ent.task is not task:
            if ent.task is not None:
                self._task_iid.pop(ent.task, None)
            ent.task = task
            self._task_iid[task] = iid

    def _unhold(self, iid: str, ent: Optional[_Entry]) -> None:
        self._held.remove(iid)
        if ent is not None and ent.task is not None:
            self._task_iid.pop(ent.task, None)
            ent.task = None

    def _purge_head(self) -> None:
        held = self._held
        while held:
            iid, ent = held.head()
            if not ent.pr.future.done():
                return
            self._forget(iid)

    def _wake_head(self) -> None:
        self._purge_head()
        if not self._held:
            return
        ent = self._held.head()[1]
        if ent.wake is None:
            return
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            ent.wake.set()
        else:
            loop.call_soon_threadsafe(ent.wake.set)

    def _unreserve(self, ent: _Entry) -> None:
        if ent.target is not None:
            self.policy.tracker.on_complete(ent.req.request_id, ent.target, time.time())
            ent.target = None

    def _forget(self, iid: str) -> None:
        """Drop every trace of a request that will not be routed (failed, cancelled, timed out)."""
        ent = self._entries.pop(iid, None)
        was_head = self._held.is_head(iid)
        self._unhold(iid, ent)
        if ent is not None:
            self._unreserve(ent)
        if was_head:
            self._wake_head()

    # ------------------------------------------------------------------ Ray hooks
    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        try:
            now = time.time()
            md = pending_request.metadata
            iid = md.internal_request_id
            target = replica_id.unique_id
            ent = self._entries.pop(iid, None)
            if ent is None:
                ent = self._new_entry(pending_request)
                self._entries.pop(iid, None)
            if iid in self._held:
                self._unhold(iid, ent)
            if ent.target is not None and ent.target != target:
                self._unreserve(ent)
            if target in self._local_set:
                self.policy.on_dispatch(ent.req, target, now)
                self._inflight[iid] = (target, ent.req)
            self.counters["routed"] += 1
            rec = {
                "replica": target,
                "matched": ent.matched if ent.target == target else 0,
                "reason": ent.reason if ent.target == target or ent.fallback else "ray_reassigned",
                "queue_wait_s": max(0.0, now - pending_request.created_at),
                "region": self.region,
                "policy": self.policy_name,
                "fallback": ent.fallback,
                "request_id": md.request_id,
                "internal_request_id": iid,
            }
            dec = self._decisions
            dec[iid] = rec
            if md.request_id and md.request_id != iid:
                dec[md.request_id] = rec
            while len(dec) > self._decision_log_size:
                dec.popitem(last=False)
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"on_request_routed failed: {e!r}")

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        try:
            x = self._inflight.pop(internal_request_id, None)
            if x is not None:
                target, req = x
                self.policy.on_complete(internal_request_id, target, time.time(), req=req)
            else:
                # Never accepted: the replica rejected it (Ray routes it again and choose_replicas
                # makes a new entry), or the caller went away after the replica was chosen and
                # before it answered (Ray cancels the send). Either way the entry and its reservation
                # go -- unless a retry already reserved another replica for it.
                ent = self._entries.get(internal_request_id)
                if ent is not None and ent.target in (None, replica_id.unique_id):
                    self._forget(internal_request_id)
            if self._held:
                self._wake_head()
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"on_request_completed failed: {e!r}")

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self._safe(self._drop_replica, replica_id.unique_id)

    def _drop_replica(self, uid: str) -> None:
        for iid, (t, _req) in list(self._inflight.items()):
            if t == uid:
                del self._inflight[iid]
        if uid in self._local_set:
            rest = [u for u in self._local_ids if u != uid]
            self._local_set = frozenset(rest)
            self._local_ids = rest
            self._local_reps = [self._by_id[u] for u in rest if u in self._by_id]
            self.policy.set_targets(rest)
        self._by_id.pop(uid, None)
        self._last_stats.pop(uid, None)

    # ------------------------------------------------------------------ bounds and error delivery
    async def _choose_replica_for_request(self, pending_request: PendingRequest, *, is_retry: bool = False):
        """Ray 2.60's per-request coroutine (awaits ``pending_request.future``), wrapped with the
        queue bound (on arrival) and the wait limit (from ``created_at``)."""
        iid = pending_request.metadata.internal_request_id
        if not is_retry and self.queue_bound is not None:
            q = self.queue_len()
            if q >= self.queue_bound:
                self.counters["queue_full"] += 1
                raise RouterQueueFull(
                    f"router queue for {self.deployment_key[1]!r}"
                    + (f" in region {self.region!r}" if self.region else "")
                    + f" is full ({q} >= queue_bound {self.queue_bound}); retry later",
                    retry_after_s=self.retry_after_s, region=self.region, queue_len=q)
        base = super()._choose_replica_for_request
        if self.wait_limit_s is None or self.error_delivery != "wrap" or _timeout_ctx is None:
            try:
                return await base(pending_request, is_retry=is_retry)
            except BaseException:
                self._forget(iid)
                raise
        remaining = self.wait_limit_s - (time.time() - pending_request.created_at)
        try:
            if remaining <= 0:
                raise TimeoutError
            async with _timeout_ctx(remaining):
                return await base(pending_request, is_retry=is_retry)
        except TimeoutError:
            self._forget(iid)
            self.counters["wait_timeout"] += 1
            raise self._timeout_error(time.time() - pending_request.created_at) from None
        except BaseException:
            self._forget(iid)
            raise

    def _timeout_error(self, waited: float) -> RouterWaitTimeout:
        return RouterWaitTimeout(
            f"request waited {waited:.2f}s in the router for {self.deployment_key[1]!r}"
            + (f" in region {self.region!r}" if self.region else "")
            + f" without an available replica (wait_limit_s={self.wait_limit_s}); retry later",
            retry_after_s=self.retry_after_s, region=self.region, queue_len=self.queue_len())

    def _fail_future(self, ent: _Entry, exc: Exception) -> None:
        pr = ent.pr
        iid = ent.req.request_id
        self.counters["wait_timeout"] += 1
        self._forget(iid)
        if not pr.future.done():
            pr.future.set_exception(exc)
        rm = getattr(self, "_remove_pending_request_from_indices", None)
        if rm is not None:
            rm(pr)

    async def _backoff(self, attempt: int) -> None:
        """Ray's backoff sleep, cut short when this held request may now get a replica."""
        try:
            delay = self._compute_backoff_s(attempt)
        except Exception:
            delay = min(0.5, 0.025 * (2 ** min(attempt, 10)))
        iid = self._task_iid.get(asyncio.current_task())
        ent = self._entries.get(iid) if iid is not None else None
        if ent is None or ent.wake is None:
            await asyncio.sleep(delay)
            return
        ev = ent.wake
        if not ev.is_set():
            try:
                await asyncio.wait_for(ev.wait(), delay)
            except asyncio.TimeoutError:
                pass
        ev.clear()

    # ------------------------------------------------------------------ utilities
    def _safe(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"{getattr(fn, '__name__', fn)} failed: {e!r}")

    def _log_error(self, msg: str) -> None:
        now = time.monotonic()
        if now - self._last_err_log >= _ERROR_LOG_INTERVAL_S:
            extra = f" ({self._suppressed_errs} similar messages suppressed)" if self._suppressed_errs else ""
            logger.warning(f"GeoPrefixRouter[{self.deployment_key[1]}]: {msg}{extra}")
            self._last_err_log = now
            self._suppressed_errs = 0
        else:
            self._suppressed_errs += 1
