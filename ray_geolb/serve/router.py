"""GeoPrefixRouter: the ray_geolb policy core as a Ray Serve ``RequestRouter`` (layer 2: a replica in
this region).

Configure it on the model deployment::

    request_router_config={
        "request_router_class": "ray_geolb.serve.router.GeoPrefixRouter",
        "request_router_kwargs": {"policy": "geoprefix", "region": "us-east",
                                  "queue_bound": 1024, "wait_limit_s": 60.0},
        "request_routing_stats_period_s": 0.5,
    }

How it works (Ray 2.60; the traps are listed in the README's "Known traps"). Two helpers own the
state: :class:`~ray_geolb.serve.replica_set.ReplicaSet` (which replicas are this region's, and their
reports) and :class:`~ray_geolb.serve.request_book.RequestBook` (every request from its first
``choose_replicas`` call to its completion: entry, reservation, hold-queue place, in-flight record,
decision log). This class wires them into Ray's hooks.

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
  in-flight accounting: a *reservation* (``policy.reserve``) when ``choose_replicas`` picks a
  replica (so two requests routed before the first is acknowledged do not both see the same
  headroom), confirmed by ``on_request_routed`` -> ``policy.on_dispatch`` (prefix-index insert), and
  released by ``on_request_completed`` -> ``policy.on_complete`` (Ray 2.60 may call that one first,
  for a request answered at once: the book then completes it when it is routed, counted in
  ``counters["completed_before_routed"]``). Engine truth wins: when a replica
  reports an idle engine, the in-flight records routed there more than ``reconcile_after_s`` (2 s)
  before that report are released too (a completion Ray never delivered; counted in
  ``counters["reconciled"]``; the soak found one after a replica was killed under load).
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
from typing import Any, Dict, List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

import ray_geolb.serve as _serve_pkg
from ray_geolb.policy import build_policy
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.direct_streaming import refuse_direct_streaming
from ray_geolb.serve.errors import RouterQueueFull, RouterWaitTimeout
from ray_geolb.serve.metrics import MetricSink
from ray_geolb.serve.replica_set import ReplicaSet
from ray_geolb.serve.request_book import Entry, RequestBook, extract_prompt_text
from ray_geolb.serve.router_options import check_kwargs, check_share, holder_share

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


class GeoPrefixRouter(RequestRouter):
    """Prefix-aware, selective-pushing, region-local request router (see the module docstring)."""

    # ------------------------------------------------------------------ setup
    def initialize_state(
        self,
        policy: Any = None,
        region: Optional[str] = None,
        queue_bound: Optional[int] = 1024,
        queue_bound_tokens: Optional[int] = None,
        wait_limit_s: Optional[float] = 60.0,
        retry_after_s: float = 1.0,
        error_delivery: str = "wrap",
        decision_log_size: int = DECISION_LOG_SIZE,
        stats_seen_margin_s: float = 0.05,
        headroom_share: Any = "auto",
        load_signal_grace_s: float = 30.0,
        reconcile_after_s: Optional[float] = 2.0,
        _inject_error_every: int = 0,
        **unknown,
    ):
        check_kwargs(unknown, queue_bound, wait_limit_s, error_delivery, region)
        refuse_direct_streaming("GeoPrefixRouter")
        self.policy_spec = DEFAULT_POLICY if policy is None else policy
        self.policy = build_policy(self.policy_spec)
        # Replica reports come from another process: a request dispatched just before a report was
        # measured may not have reached the engine's scheduler yet, so it must not count as seen by
        # that report (SP-P would grant its slot twice). Unless the policy config sets it, use the
        # router's transport margin.
        if "seen_margin_s" not in self.policy.config.availability.model_fields_set:
            if not (isinstance(stats_seen_margin_s, (int, float)) and stats_seen_margin_s >= 0):
                raise ValueError(f"GeoPrefixRouter: stats_seen_margin_s must be >= 0, got {stats_seen_margin_s!r}")
            self.policy.set_seen_margin(float(stats_seen_margin_s))
        self.policy_name = self.policy.name
        self.region = region
        self.queue_bound = queue_bound
        if queue_bound_tokens is not None and (isinstance(queue_bound_tokens, bool)
                                               or not isinstance(queue_bound_tokens, int) or queue_bound_tokens < 1):
            raise ValueError(f"GeoPrefixRouter: queue_bound_tokens must be a positive int or None, "
                             f"got {queue_bound_tokens!r}")
        self.queue_bound_tokens = queue_bound_tokens
        self.wait_limit_s = None if wait_limit_s is None else float(wait_limit_s)
        self.retry_after_s = float(retry_after_s)
        self.error_delivery = error_delivery
        self._inject_every = int(_inject_error_every or 0)
        self._ncalls = 0
        self._rng = random.Random(0)
        self._last_err_log = 0.0
        self._suppressed_errs = 0
        self.counters: Dict[str, int] = {
            "routed": 0, "held": 0, "no_prompt": 0, "internal_errors": 0, "fallback": 0,
            "queue_full": 0, "wait_timeout": 0, "bad_stats": 0, "ttft_samples": 0, "no_load_signal": 0,
            "handed_over": 0, "reconciled": 0,
        }
        self.headroom_share = check_share(headroom_share)
        if not (isinstance(load_signal_grace_s, (int, float)) and load_signal_grace_s > 0):
            raise ValueError(f"GeoPrefixRouter: load_signal_grace_s must be > 0, got {load_signal_grace_s!r}")
        self.load_signal_grace_s = float(load_signal_grace_s)
        self._next_load_check = 0.0
        if reconcile_after_s is not None and (isinstance(reconcile_after_s, bool)
                                              or not isinstance(reconcile_after_s, (int, float))
                                              or not reconcile_after_s > 0):
            raise ValueError(f"GeoPrefixRouter: reconcile_after_s must be > 0 or None, got {reconcile_after_s!r}")
        self.reconcile_after_s = reconcile_after_s
        self.book = RequestBook(self.policy, region, self.counters, decision_log_size)
        on_idle = None if reconcile_after_s is None else (
            lambda uid, at: self.book.reconcile(uid, at, self.reconcile_after_s))
        self.replicas = ReplicaSet(self.policy, region, self.counters, self._log_error, on_idle=on_idle)
        dep = getattr(self, "_deployment_id", None)
        key = (getattr(dep, "app_name", ""), getattr(dep, "name", ""))
        self.deployment_key = key
        #: Prometheus metrics (serve/metrics.py): counted here, exported at most once a second
        self.metrics = MetricSink({"deployment": key[1], "region": region or ""})
        self._evictions_seen = 0
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
        return len(self.book.held)

    def num_local_replicas(self) -> int:
        return len(self.replicas.local_ids)

    def num_available(self) -> int:
        return len(self.policy.tracker.available)

    def free_slots(self) -> int:
        """Requests the policy may still place before it needs newer reports (``LoadTracker.free_slots``)."""
        return self.policy.tracker.free_slots()

    def queued_tokens(self) -> float:
        """Prompt tokens of the requests waiting in this router: held ones by their size, those Ray
        has not handed to ``choose_replicas`` yet at the policy's mean prompt length (the region
        layer's ``Q_lb``). Safe to call from another thread (the held queue's count and token sum
        are each read whole)."""
        held = self.book.held
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
            "timestamp": policy_now(),
        }

    def decision(self, request_id: str) -> Optional[dict]:
        """Routing decision of a request, by Serve ``request_id`` or ``internal_request_id``."""
        return self.book.decisions.get(request_id)

    def local_replica_ids(self) -> List[str]:
        return list(self.replicas.local_ids)

    def accounting(self) -> dict:
        """What requests hold in this router right now (leak checks; any thread). Idle values: every
        count 0, ``unavailable`` 0 once fresh reports arrived, ``engines`` all ``[0, 0]``."""
        tr = self.policy.tracker
        book = self.book
        return {
            "router_pending": self.queue_len(),  # Ray's pending requests for this deployment
            "router_entries": len(book.entries),  # requests choose_replicas saw, not yet routed
            "router_held": len(book.held),
            "router_inflight": len(book.inflight),  # routed, not completed
            "tracker_outstanding": tr.total_outstanding(),  # reservations + in flight, per policy
            "unavailable": len(self.replicas.local_ids) - len(tr.available),
            "distrusted_reports": tr.distrusted_reports,
            "engines": self.replicas.reported_load(),
            # the oldest few in-flight requests ([request id, replica]): what a leak holds
            "oldest_inflight": book.oldest_inflight(3),
            # the prefix tree's nodes (bounded by the policy's prefix.max_nodes): what memory holds
            "index_nodes": getattr(getattr(self.policy, "index", None), "num_nodes", None),
        }

    # ------------------------------------------------------------------ replicas and stats
    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._safe(self._sync, replicas)

    def _sync(self, replicas) -> None:
        self._update_share()
        self.replicas.sync(replicas)
        self._check_load_signal(policy_now())
        self._flush_metrics()
        if self.book.held and self.policy.tracker.available:
            self.book.wake_head()

    def _update_share(self) -> None:
        """``headroom_share="auto"``: this router is one of the N replicas of the deployment whose
        process holds the handle (several ingress replicas of a region): take 1/N of each report's
        headroom (``Policy.set_headroom_share``), N re-read at every replica-set change."""
        share = self.headroom_share
        if share == "auto":
            share = holder_share()
        if share is not None and share != self.policy.headroom_share:
            self.policy.set_headroom_share(*share)

    def _check_load_signal(self, now: float) -> None:
        if now < self._next_load_check:
            return
        self._next_load_check = now + 1.0
        blind = self.replicas.find_blind(now, self.load_signal_grace_s)
        if blind:
            logger.warning(
                f"GeoPrefixRouter[{self.deployment_key[1]}]: replica(s) {sorted(blind)} sent no report with a load "
                f"field (num_waiting / num_running) in {self.load_signal_grace_s:g} s: selective pushing runs blind "
                "(every replica looks empty). A stock LLMServer reports no load; deploy vLLM with "
                "server_cls=ray_geolb.serve.stats_plugin.GeoVLLMServer (and request_routing_stats_period_s set).")

    # ------------------------------------------------------------------ routing
    async def choose_replicas(
        self, candidate_replicas: List[RunningReplica], pending_request: Optional[PendingRequest] = None
    ) -> List[List[RunningReplica]]:
        if pending_request is None:
            return [candidate_replicas]
        try:
            pending_request.routing_context.should_backoff = True
            t0 = time.perf_counter()
            out = self._choose(candidate_replicas, pending_request)
            self.metrics.observe("geolb_router_decision_seconds", time.perf_counter() - t0, self.policy_name)
            return out
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
        book = self.book
        if book.loop is None:
            book.loop = asyncio.get_running_loop()
        if len(candidates) != len(self.replicas.by_id):
            self._sync(candidates)
        now = policy_now()
        if now >= self._next_load_check:
            self._check_load_signal(now)
        iid = pr.metadata.internal_request_id
        ent = book.entry_for(pr)
        if (self.error_delivery == "future" and self.wait_limit_s is not None
                and now - ent.created > self.wait_limit_s):
            self._fail_future(ent, self._timeout_error(now - ent.created))
            return [candidates]
        if not book.is_head(iid):  # strict FCFS: an older held request goes first
            book.hold(ent, iid)
            return []
        d = self.policy.choose(ent.req, now, None)
        if d is None and self.policy.revalidate(now):  # a frozen report hid an idle replica
            d = self.policy.choose(ent.req, now, None)
        if d is None:
            book.hold(ent, iid)
            self.metrics.count("geolb_router_decisions_total", self.policy_name, "held", "no_replica_available")
            return []
        rep = self.replicas.by_id.get(d.target)
        if rep is None:
            raise RuntimeError(f"policy chose unknown replica {d.target!r}")
        book.release_head(iid, ent)
        book.reserve(ent, d, now)
        self.metrics.count("geolb_router_decisions_total", self.policy_name, "routed", d.reason or "")
        return [[rep]]

    def _fallback(self, candidates, pr: PendingRequest):
        self.counters["fallback"] += 1
        self.metrics.count("geolb_router_decisions_total", self.policy_name, "fallback", "router_error")
        pool = self.replicas.local_reps or list(candidates)
        if not pool:
            return [list(candidates)]
        try:
            iid = pr.metadata.internal_request_id
            ent = self.book.entries.get(iid)
            if ent is not None:
                self.book.unreserve(ent)
                self.book.release_head(iid, ent)
                ent.fallback, ent.reason = True, "fallback_power_of_two"
        except Exception:
            pass
        return [self._rng.sample(pool, 2) if len(pool) > 2 else list(pool)]

    # ------------------------------------------------------------------ Ray hooks
    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        try:
            target = replica_id.unique_id
            local = target in self.replicas.local_set
            req = self.book.routed(pending_request, target, local, policy_now(), self.policy_name)
            rec = self.book.decisions.get(pending_request.metadata.internal_request_id)
            if local and rec is not None:
                self.metrics.observe("geolb_router_prefix_match_ratio",
                                     min(1.0, (rec.get("matched") or 0) / max(1, len(req.text))), self.policy_name)
            if self.metrics.due():
                self._flush_metrics()
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"on_request_routed failed: {e!r}")

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        try:
            self.book.completed(internal_request_id, replica_id.unique_id)
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"on_request_completed failed: {e!r}")

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self._safe(self._drop_replica, replica_id.unique_id)

    def _drop_replica(self, uid: str) -> None:
        self.book.drop_replica(uid)
        self.replicas.drop(uid)

    # ------------------------------------------------------------------ bounds and error delivery
    async def _choose_replica_for_request(self, pending_request: PendingRequest, *, is_retry: bool = False):
        """Ray 2.60's per-request coroutine (awaits ``pending_request.future``), wrapped with the
        queue bound (on arrival) and the wait limit (from ``created_at``). Whatever ends it --
        routed, timed out, failed or cancelled -- a request not routed leaves no trace
        (:meth:`RequestBook.forget`)."""
        iid = pending_request.metadata.internal_request_id
        if not is_retry and (self.queue_bound is not None or self.queue_bound_tokens is not None):
            q = self.queue_len()
            tok = self.queued_tokens() if self.queue_bound_tokens is not None else 0.0
            if (self.queue_bound is not None and q >= self.queue_bound) or \
                    (self.queue_bound_tokens is not None and tok >= self.queue_bound_tokens):
                self.counters["queue_full"] += 1
                self.metrics.count("geolb_router_rejections_total", "queue_full")
                raise RouterQueueFull(
                    f"router queue for {self.deployment_key[1]!r}"
                    + (f" in region {self.region!r}" if self.region else "")
                    + (f" is full ({q} >= queue_bound {self.queue_bound})" if self.queue_bound is not None
                       and q >= self.queue_bound else
                       f" holds {tok:.0f} prompt tokens (>= queue_bound_tokens {self.queue_bound_tokens})")
                    + "; retry later",
                    retry_after_s=self.retry_after_s, region=self.region, queue_len=q)
        base = super()._choose_replica_for_request
        if self.wait_limit_s is None or self.error_delivery != "wrap" or _timeout_ctx is None:
            try:
                return await base(pending_request, is_retry=is_retry)
            except BaseException:
                self.book.forget(iid)
                raise
        remaining = self.wait_limit_s - (policy_now() - pending_request.created_at)
        try:
            if remaining <= 0:
                raise TimeoutError
            async with _timeout_ctx(remaining):
                return await base(pending_request, is_retry=is_retry)
        except TimeoutError:
            self.book.forget(iid)
            self.counters["wait_timeout"] += 1
            self.metrics.count("geolb_router_rejections_total", "wait_timeout")
            raise self._timeout_error(policy_now() - pending_request.created_at) from None
        except BaseException:
            self.book.forget(iid)
            raise

    def _timeout_error(self, waited: float) -> RouterWaitTimeout:
        return RouterWaitTimeout(
            f"request waited {waited:.2f}s in the router for {self.deployment_key[1]!r}"
            + (f" in region {self.region!r}" if self.region else "")
            + f" without an available replica (wait_limit_s={self.wait_limit_s}); retry later",
            retry_after_s=self.retry_after_s, region=self.region, queue_len=self.queue_len())

    def _fail_future(self, ent: Entry, exc: Exception) -> None:
        pr = ent.pr
        self.counters["wait_timeout"] += 1
        self.book.forget(ent.req.request_id)
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
        ev = self.book.wake_event(asyncio.current_task())
        if ev is None:
            await asyncio.sleep(delay)
            return
        if not ev.is_set():
            # a timer sets the event rather than asyncio.wait_for(ev.wait(), delay): on Python 3.11,
            # wait_for drops the task's cancellation when the event is set in the same loop turn,
            # and a cancelled routing task must stop (the caller is gone)
            timer = asyncio.get_running_loop().call_later(delay, ev.set)
            try:
                await ev.wait()
            finally:
                timer.cancel()
        ev.clear()

    # ------------------------------------------------------------------ utilities
    def _flush_metrics(self) -> None:
        """Set the gauges from the live state and export what was counted (serve/metrics.py)."""
        try:
            m, pol, tr = self.metrics, self.policy, self.policy.tracker
            m.gauge("geolb_router_held", len(self.book.held))
            m.gauge("geolb_router_queued_tokens", float(self.queued_tokens()))
            m.gauge("geolb_router_inflight", len(self.book.inflight))
            m.gauge("geolb_router_available_replicas", len(tr.available))
            index = getattr(pol, "index", None)
            if index is not None:
                m.gauge("geolb_router_index_nodes", index.num_nodes)
                ev = int(getattr(index, "evictions", 0))
                if ev > self._evictions_seen:
                    m.count("geolb_router_index_evictions_total", n=ev - self._evictions_seen)
                    self._evictions_seen = ev
            t_p = getattr(pol, "pooled_t_p", None)
            if callable(t_p):
                m.gauge("geolb_router_t_p_seconds", float(t_p()))
            m.flush()
        except Exception as e:  # noqa: BLE001 - metrics never fail routing
            self._log_error(f"metrics flush failed: {e!r}")

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
