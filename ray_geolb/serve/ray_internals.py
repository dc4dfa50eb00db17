"""GeoPrefixRouter's base class: the one file that uses Ray 2.60's private ``RequestRouter`` members
(a test keeps them here, so a Ray upgrade re-checks this file against the facts note and no other).

* Reads: ``queue_len`` (``_pending_requests_by_id``: Ray's pending requests for this deployment,
  seen by ``choose_replicas`` or not), ``_ray_deployment_key`` (``_deployment_id``) and
  ``_ray_replicas`` (``_replicas``, the replica table as Serve last broadcast it).
* Bounds: a request arriving when ``queue_bound`` requests (or ``queue_bound_tokens`` prompt tokens)
  already wait in the router fails at once with :class:`~ray_geolb.serve.errors.RouterQueueFull`; a
  request not routed within ``wait_limit_s`` of its creation fails with
  :class:`~ray_geolb.serve.errors.RouterWaitTimeout`. Both carry ``retry_after_s`` and reach the caller
  of ``handle.remote(...)`` unchanged (the router runs in the caller's process). Mechanism: this class
  wraps Ray's ``_choose_replica_for_request`` -- the per-request coroutine that awaits
  ``PendingRequest.future`` -- in ``asyncio.timeout``; on timeout Ray's own cancellation path cleans
  up (cancels the future and the routing task) and the typed error is raised. With
  ``error_delivery="future"`` the wait limit is instead enforced inside ``choose_replicas`` via
  ``pending_request.future.set_exception`` (:meth:`_fail_future`; only for requests Ray has handed to
  ``choose_replicas``; kept as the documented public-API path). Whatever ends the coroutine --
  routed, timed out, failed or cancelled -- a request not routed leaves no trace
  (``RequestBook.forget``, in ``except``/``finally`` paths).
* Wake-up: instead of sleeping Ray's full backoff (25 ms doubling to 500 ms), a held request's routing
  task waits on its ``RequestBook`` event, set when capacity may have appeared, with Ray's backoff as
  the timeout (:meth:`_backoff`).

The subclass provides ``book`` (a ``RequestBook``), ``counters``, ``metrics``, ``region``,
``deployment_key``, ``queue_bound``, ``queue_bound_tokens``, ``wait_limit_s``, ``error_delivery``,
``retry_after_s``, ``queued_tokens()``, ``publish_soon()`` (the ingress's snapshot: the queue changed) and
``_safe``.
"""

from __future__ import annotations

import asyncio
from typing import List, Optional, Tuple

from ray.serve.request_router import PendingRequest, RequestRouter

from ray_geolb.aio import wait_or_timeout
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.errors import RouterQueueFull, RouterWaitTimeout

__all__ = ["RayRouterBase"]

try:  # Python >= 3.11
    _timeout_ctx = asyncio.timeout
except AttributeError:  # pragma: no cover
    _timeout_ctx = None


class RayRouterBase(RequestRouter):
    """See the module docstring."""

    # ------------------------------------------------------------------ Ray's state, read
    def queue_len(self) -> int:
        """Requests waiting for a replica in this router (Ray's pending queue, seen by us or not)."""
        return len(getattr(self, "_pending_requests_by_id", ()))

    def _ray_deployment_key(self) -> Tuple[str, str]:
        """``(app name, deployment name)`` of the deployment this router routes to ("" when unknown)."""
        dep = getattr(self, "_deployment_id", None)
        return getattr(dep, "app_name", ""), getattr(dep, "name", "")

    def _ray_replicas(self) -> List:
        """The replicas Ray already knows (none when built without Ray)."""
        reps = getattr(self, "_replicas", None)
        return list(reps.values()) if reps else []

    # ------------------------------------------------------------------ bounds and error delivery
    async def _choose_replica_for_request(self, pending_request: PendingRequest, *, is_retry: bool = False):
        """Ray 2.60's per-request coroutine (awaits ``pending_request.future``), wrapped with the
        queue bound (on arrival) and the wait limit (from ``created_at``)."""
        iid = pending_request.metadata.internal_request_id
        if not is_retry:
            self._check_queue_bound()
        # Ray adds the request to its pending queue before base awaits its future: the snapshot the
        # ingress reads counts it from the next loop turn, and no longer once this coroutine ends
        self.publish_soon()
        try:
            return await self._bounded(pending_request, iid, is_retry)
        finally:
            self._safe(self.publish_soon)

    async def _bounded(self, pending_request: PendingRequest, iid: str, is_retry: bool):
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

    def _check_queue_bound(self) -> None:
        """Raise RouterQueueFull when ``queue_bound`` requests or ``queue_bound_tokens`` prompt tokens
        already wait in this router."""
        if self.queue_bound is None and self.queue_bound_tokens is None:
            return
        q = self.queue_len()
        tok = self.queued_tokens() if self.queue_bound_tokens is not None else 0.0
        by_count = self.queue_bound is not None and q >= self.queue_bound
        if not by_count and not (self.queue_bound_tokens is not None and tok >= self.queue_bound_tokens):
            return
        self.counters["queue_full"] += 1
        self.metrics.count("geolb_router_rejections_total", "queue_full")
        raise RouterQueueFull(
            f"router queue for {self.deployment_key[1]!r}"
            + (f" in region {self.region!r}" if self.region else "")
            + (f" is full ({q} >= queue_bound {self.queue_bound})" if by_count else
               f" holds {tok:.0f} prompt tokens (>= queue_bound_tokens {self.queue_bound_tokens})")
            + "; retry later",
            retry_after_s=self.retry_after_s, region=self.region, queue_len=q)

    def _timeout_error(self, waited: float) -> RouterWaitTimeout:
        return RouterWaitTimeout(
            f"request waited {waited:.2f}s in the router for {self.deployment_key[1]!r}"
            + (f" in region {self.region!r}" if self.region else "")
            + f" without an available replica (wait_limit_s={self.wait_limit_s}); retry later",
            retry_after_s=self.retry_after_s, region=self.region, queue_len=self.queue_len())

    def _fail_future(self, ent, exc: Exception) -> None:
        """``error_delivery="future"``: fail a request's future from ``choose_replicas`` and drop it
        from Ray's pending indices."""
        pr = ent.pr
        self.counters["wait_timeout"] += 1
        self.book.forget(ent.req.request_id)
        if not pr.future.done():
            pr.future.set_exception(exc)
        rm = getattr(self, "_remove_pending_request_from_indices", None)
        if rm is not None:
            rm(pr)

    # ------------------------------------------------------------------ the held request's wake-up
    async def _backoff(self, attempt: int) -> None:
        """Ray's backoff sleep, cut short when this held request may now get a replica."""
        try:
            delay = self._compute_backoff_s(attempt)
        except Exception:
            delay = min(0.5, 0.025 * (2 ** min(attempt, 10)))
        ev: Optional[asyncio.Event] = self.book.wake_event(asyncio.current_task())
        if ev is None:
            await asyncio.sleep(delay)
            return
        if not ev.is_set():
            # cancellable: a cancelled routing task must stop (the caller is gone)
            await wait_or_timeout(ev, delay)
        ev.clear()
