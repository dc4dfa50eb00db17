"""GeoPrefixRouter: the ray_geolb policy core as a Ray Serve ``RequestRouter`` (layer 2: a replica in
this region).

Configure it on the model deployment::

    request_router_config={
        "request_router_class": "ray_geolb.serve.router.GeoPrefixRouter",
        "request_router_kwargs": {"policy": "geoprefix", "region": "us-east",
                                  "queue_bound": 1024, "wait_limit_s": 60.0},
        "request_routing_stats_period_s": 0.5,
    }

Every option, with its type, default, bounds and description, is a field of
:class:`~ray_geolb.serve.router_options.RouterOptions`, validated once in ``initialize_state`` (a bad
or unknown key raises a ``ValueError`` naming it).

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
  first). A held request's routing task sleeps on a per-request event that is set when capacity
  may have appeared (a stats report, a completion, the previous head leaving), with Ray's backoff as
  the timeout. Requests beyond Ray's 2 x num_replicas routing tasks wait in Ray's own FIFO deque.
* Bounds: ``queue_bound`` / ``queue_bound_tokens`` (RouterQueueFull on arrival) and ``wait_limit_s``
  (RouterWaitTimeout), both with ``retry_after_s``.
* ``choose_replicas`` never raises (an exception there hangs that request forever in Ray 2.60): any
  internal error is logged (rate-limited), counted, and the request falls back to power-of-two over
  the local candidates (all candidates if none are local).
* Everything is in process, O(1)-ish per event, no blocking calls, no ``FIFOMixin``.

The class is this file (the algorithm's wiring into Ray's hooks) plus three bases, one concern each:
:class:`~ray_geolb.serve.ray_internals.RayRouterBase` (the bounds, the held request's wake-up, and
every use of Ray's private ``RequestRouter`` members), :class:`~ray_geolb.serve.router_views.RouterViews`
(read-only figures for the ingress and leak checks) and
:class:`~ray_geolb.serve.router_telemetry.RouterTelemetry` (metrics and rate-limited warnings).
After each event it publishes what the region ingress of its process reads, a frozen
:class:`~ray_geolb.serve.router_snapshot.RouterSnapshot`, by one attribute swap (:meth:`publish`).

Ray cloudpickles this module by value into the processes that hold a handle, so module-level state
here is per-copy; the per-process registry lives in ``ray_geolb.serve`` (imported by reference):
``GeoPrefixRouter.instances()`` / ``GeoPrefixRouter.for_deployment(app, deployment)``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from typing import Any, Dict, List, Optional

from ray.serve.request_router import PendingRequest, RunningReplica

import ray_geolb.serve as _serve_pkg
from ray_geolb.policy import build_policy
from ray_geolb.policy.region.sibling_inserts import SiblingOutbox, learn_dispatch_row
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.direct_streaming import refuse_direct_streaming
from ray_geolb.serve.ray_internals import RayRouterBase
from ray_geolb.serve.replica_set import ReplicaSet
from ray_geolb.serve.request_book import RequestBook, extract_prompt_text
from ray_geolb.serve.router_options import RouterOptions, holder_share
from ray_geolb.serve.router_snapshot import snapshot_of
from ray_geolb.serve.router_telemetry import RouterTelemetry
from ray_geolb.serve.router_views import RouterViews

__all__ = ["GeoPrefixRouter", "DEFAULT_POLICY", "extract_prompt_text"]

#: The policy a GeoPrefixRouter uses when ``request_router_kwargs`` names none.
DEFAULT_POLICY = "geoprefix"
#: sibling routers' rows waiting for :meth:`GeoPrefixRouter.publish` (the oldest dropped beyond)
SIBLING_INBOX_ROWS = 8192
#: finished requests' texts waiting for the router's loop (``reply_inbox``); more drops the oldest
REPLY_INBOX = 256


class GeoPrefixRouter(RouterViews, RouterTelemetry, RayRouterBase):
    """Prefix-aware, selective-pushing, region-local request router (see the module docstring)."""

    # ------------------------------------------------------------------ setup
    def initialize_state(self, **kwargs: Any):
        """Serve passes ``request_router_kwargs`` here; they are validated once, as
        :class:`~ray_geolb.serve.router_options.RouterOptions` (a bad key raises a ``ValueError`` naming it)."""
        self.router_options = opts = RouterOptions(**kwargs)
        refuse_direct_streaming("GeoPrefixRouter")
        self.policy_spec = DEFAULT_POLICY if opts.policy is None else opts.policy
        self.policy = build_policy(self.policy_spec)
        # Replica reports come from another process: a request dispatched just before a report was
        # measured may not have reached the engine's scheduler yet, so it must not count as seen by
        # that report (SP-P would grant its slot twice). Unless the policy config sets it, use the
        # router's transport margin.
        if "seen_margin_s" not in self.policy.config.availability.model_fields_set:
            self.policy.set_seen_margin(opts.stats_seen_margin_s)
        self.policy_name = self.policy.name
        self.region = region = opts.region
        self.queue_bound = opts.queue_bound
        self.queue_bound_tokens = opts.queue_bound_tokens
        self.wait_limit_s = opts.wait_limit_s
        self.retry_after_s = opts.retry_after_s
        self.error_delivery = opts.error_delivery
        self._rng = random.Random(0)
        self.counters: Dict[str, int] = {
            "routed": 0, "held": 0, "no_prompt": 0, "internal_errors": 0, "fallback": 0,
            "queue_full": 0, "wait_timeout": 0, "bad_stats": 0, "ttft_samples": 0, "no_load_signal": 0,
            "handed_over": 0, "reconciled": 0, "sibling_inserts_learned": 0, "sibling_rows_unusable": 0,
            "replies_learned": 0,
        }
        self.headroom_share = opts.headroom_share
        #: several ingress replicas of a region (one router each): this router's dispatches as hash-only rows
        #: for its siblings (``policy/region/sibling_inserts.py``; kept once the region ingress of this process
        #: enables it -- at once when its channel is already open, else at its next heartbeat -- and taken by
        #: its heartbeat), and their rows for this router's prefix index (the ingress puts them here;
        #: :meth:`publish` learns them)
        self.sibling_outbox = SiblingOutbox(enabled=_serve_pkg.SIBLING_CHANNEL_OPEN)
        self.sibling_inbox: deque = deque(maxlen=SIBLING_INBOX_ROWS)
        #: finished requests' prompt + reply texts with their replica, from the region ingress of this process
        #: (``serve/ingress/replies.py``); :meth:`publish` records them (``Policy.learn_reply``)
        self.reply_inbox: deque = deque(maxlen=REPLY_INBOX)
        self.load_signal_grace_s = opts.load_signal_grace_s
        self.reconcile_after_s = reconcile_after_s = opts.reconcile_after_s
        self.book = RequestBook(self.policy, region, self.counters, opts.decision_log_size)
        on_idle = None if reconcile_after_s is None else (
            lambda uid, at: self.book.reconcile(uid, at, self.reconcile_after_s))
        self.replicas = ReplicaSet(self.policy, region, self.counters, self._log_error, on_idle=on_idle)
        self.deployment_key = key = self._ray_deployment_key()
        self._init_telemetry(key[1], region or "")
        _serve_pkg.register_router(key, self)
        known = self._ray_replicas()
        if known:
            self._safe(self._sync, known)
        self.publish()

    def publish(self) -> None:
        """Publish what the region ingress of this process reads, by one attribute swap: a frozen
        :class:`~ray_geolb.serve.router_snapshot.RouterSnapshot` of the state now (the ingress never
        reads the live policy). Events on the router's loop call :meth:`publish_soon` instead. The sibling
        routers' inserts that arrived since are learned first (off any request's decision)."""
        self._publish_pending = False
        if self.sibling_inbox:
            self._learn_from_siblings()
        if self.reply_inbox:
            self._learn_replies()
        self.snapshot = snapshot_of(self)

    def _learn_replies(self) -> None:
        """The replies the ingress read from finished requests (``reply_inbox``: prompt + reply texts with the
        replica that cached them) into this router's prefix index (``Policy.learn_reply``: a conversation's
        next turn then matches its whole history at that replica; no load counted)."""
        inbox, policy, now = self.reply_inbox, self.policy, policy_now()
        while inbox:
            text, target = inbox.popleft()
            self.counters["replies_learned"] += policy.learn_reply(text, target, now)

    def _learn_from_siblings(self) -> None:
        """The sibling routers' dispatches (rows the ingress put in ``sibling_inbox``) into this router's
        prefix index, as if this router had made them (``Policy.learn_sibling_dispatch``: no load counted).
        A row that fits neither this index's geometry nor a replica of this router is counted unusable."""
        inbox, policy, now = self.sibling_inbox, self.policy, policy_now()
        while inbox:
            ok = learn_dispatch_row(policy, inbox.popleft(), now)
            self.counters["sibling_inserts_learned" if ok else "sibling_rows_unusable"] += 1

    def publish_soon(self) -> None:
        """Publish after the event that changed the state, once per loop turn: on the router's event
        loop the snapshot is built by one callback scheduled at the first event of the turn (a request
        arriving, chosen, routed and completed in one turn make one snapshot, built outside Ray's
        hooks, so it is not on a request's decision path); with no running loop (a router driven
        without Ray), at once. The ingress reads the state at most one loop turn old."""
        if getattr(self, "_publish_pending", False):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.publish()
            return
        self._publish_pending = True
        loop.call_soon(self._safe, self.publish)

    def publish_soon_threadsafe(self) -> None:
        """:meth:`publish_soon` from another thread (the ingress, with sibling rows for ``sibling_inbox``): on
        the router's loop once it has one; before that, the router's next event publishes."""
        loop = self.book.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._safe, self.publish_soon)

    @classmethod
    def instances(cls, app_name: Optional[str] = None, deployment_name: Optional[str] = None) -> list:
        """Live GeoPrefixRouter instances in this process (any copy of the class)."""
        return _serve_pkg.routers(app_name, deployment_name)

    @classmethod
    def for_deployment(cls, app_name: str, deployment_name: str):
        return _serve_pkg.router_for(app_name, deployment_name)

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
        self.publish_soon()

    def _update_share(self) -> None:
        """``headroom_share="auto"``: this router is one of the N replicas of the deployment whose
        process holds the handle (several ingress replicas of a region): take 1/N of each report's
        headroom (``Policy.set_headroom_share``), N re-read at every replica-set change. With N > 1 (any
        ``headroom_share``) its dispatches also go to ``sibling_outbox`` for the sibling routers."""
        held_by = holder_share()
        share = held_by if self.headroom_share == "auto" else self.headroom_share
        if share is not None and share != self.policy.headroom_share:
            self.policy.set_headroom_share(*share)
        several = held_by is not None and held_by[1] > 1  # sibling routers: share this one's inserts
        self.policy.sibling_outbox = self.sibling_outbox if several else None

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
        finally:
            self._safe(self.publish_soon)  # placed, held or fallen back: what the ingress reads changed

    def _choose(self, candidates, pr: PendingRequest):
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
            self._count_decision("held", "no_replica_available")
            return []
        rep = self.replicas.by_id.get(d.target)
        if rep is None:
            raise RuntimeError(f"policy chose unknown replica {d.target!r}")
        book.release_head(iid, ent)
        book.reserve(ent, d, now)
        self._count_decision("routed", d.reason or "")
        return [[rep]]

    def _fallback(self, candidates, pr: PendingRequest):
        self.counters["fallback"] += 1
        self._count_decision("fallback", "router_error")
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
            self.publish_soon()
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"on_request_routed failed: {e!r}")

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        try:
            self.book.completed(internal_request_id, replica_id.unique_id)
            self.publish_soon()
        except Exception as e:
            self.counters["internal_errors"] += 1
            self._log_error(f"on_request_completed failed: {e!r}")

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self._safe(self._drop_replica, replica_id.unique_id)

    def _drop_replica(self, uid: str) -> None:
        self.book.drop_replica(uid)
        self.replicas.drop(uid)
        self.publish()
