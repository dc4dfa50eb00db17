"""A request served in this region: :class:`LocalCalls`, the local call with its one retry.

:meth:`LocalCalls._run_local` takes a :class:`~.local_view.LocalSlot` (capacity owned, returned on
every path, cancellation included) and calls the model deployment through the
:class:`~.model_client.ModelClient`; the GeoPrefixRouter of this process places the call (step 4 of
``docs/design.md`` section 3). A replica that dies before anything reached the client is retried
once on whichever replica the router picks (:data:`LOCAL_ATTEMPTS`, within the deadline and the retry
budget); after the first token a failure ends the stream with an error event instead.

A mixin of :class:`~.request_path.RequestPath`; it reads ``cfg``, ``region``, ``local``, ``llm``,
``retries``, ``counts``, ``served_ids``, ``crashes``, ``router`` (a stream's first token calibrates the
region layer's TTFT-SLO guard) and calls ``local_done``, ``_deadline_exceeded`` and
``_model_error``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from ray.exceptions import RayActorError

from ray_geolb.aio import within
from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.region import RegionDecision
from ray_geolb.serve.clock import policy_now

from .context import RequestContext, wait_bound
from .errors import GeoHTTPError
from .model_client import error_in
from .replies import ReplyCollector, hand_reply, reply_of_response
from .streams import NO_TOKEN, TokenStream, cancel_quietly

logger = logging.getLogger("ray.serve")

__all__ = ["LOCAL_ATTEMPTS", "LocalCalls", "replica_died"]

#: attempts of a local call whose replica died before anything reached the client (a retry goes to
#: whichever replica the router picks; it spends the retry budget and the request's deadline)
LOCAL_ATTEMPTS = 2


def _root(e: BaseException) -> BaseException:
    """The exception inside Ray's wrappers (``RayTaskError.cause``), else ``e``."""
    for _ in range(5):
        c = getattr(e, "cause", None)
        if not isinstance(c, BaseException):
            break
        e = c
    return e


def replica_died(e: BaseException) -> bool:
    """True if ``e`` says the replica serving a call died or became unreachable (a Ray actor error):
    the call's work is lost, so one that had sent nothing to the client may be retried."""
    return isinstance(e, RayActorError) or isinstance(_root(e), RayActorError)


class LocalCalls:
    """See the module docstring."""

    async def _run_local(self, ctx: RequestContext, d: RegionDecision, wait_ms: float,
                         rreq: Optional[RouteRequest] = None):
        """Run a request on this region's model deployment. The local slot each call takes (its minted
        ``call_id`` in the view's ``unrouted`` set until the router places it, then :meth:`local_done`
        when it leaves) is owned by a :class:`LocalSlot` and returned on every path, cancellation
        included. ``rreq`` (the prompt canonicalised, maybe hashed, here) travels to the router with
        the call, on the slot's ``call_id`` (a ``CallTicket``), which brings the router's decision back.

        A replica that dies before anything reached the client (a Ray actor error before the first
        token, or before a non-streamed response) is retried once on whichever replica the router
        picks (:data:`LOCAL_ATTEMPTS`), within the request's deadline and the retry budget; after the
        first token a failure ends the stream with an error event instead (never retried: the
        client has part of an answer)."""
        attempt = 0
        while True:
            attempt += 1
            self.estimates.started()  # its slot's return (_local_slot_done) ends it, on every path
            slot = self.local.take_slot(ctx.request_id, self._local_slot_done, rreq)
            try:
                if ctx.stream:
                    return await self._run_local_stream(ctx, d, wait_ms, slot)
                return await self._run_local_call(ctx, d, wait_ms, slot)
            except GeoHTTPError:
                raise
            except Exception as e:
                if (replica_died(e) and attempt < LOCAL_ATTEMPTS and ctx.remaining_s() > 0
                        and self.retries.try_spend()):
                    self.counts["local_retries"] += 1
                    logger.info("region %s: the replica died before the first token (%s); retrying on "
                                "another replica", self.region, type(_root(e)).__name__)
                    continue
                err = self._model_error(e)
                if err is not None:
                    raise err from None
                raise

    async def _run_local_call(self, ctx: RequestContext, d: RegionDecision, wait_ms: float, slot):
        t0 = policy_now()
        try:
            res = await within(self.llm.complete(ctx, slot.call_id), wait_bound(ctx.remaining_s()))
        except asyncio.TimeoutError:  # the call is cancelled (complete() cancels its stream)
            raise self._deadline_exceeded(ctx, self.region) from None
        finally:
            slot.release()
        self.estimates.served("complete", policy_now() - t0)
        self.served_ids.append(ctx.request_id)
        if ctx.hops:
            self.crashes.reached("served_for_peer")
        geo = self._reply_learner()
        if geo is not None:
            hand_reply(geo, ctx.body, reply_of_response(res, ctx.kind), (slot.decision or {}).get("replica"))
        return self._local_meta(ctx, d, wait_ms, slot), res

    def _reply_learner(self):
        """This process's GeoPrefixRouter if its policy learns the replies its replicas cached (``replies.py``),
        else None."""
        geo = self.local.geo_router()
        return geo if geo is not None and getattr(geo.policy, "learns_replies", False) else None

    def _reply_collector(self, ctx: RequestContext, slot) -> Optional[ReplyCollector]:
        """What reads a stream's reply at its end for the router (None: the router does not learn replies)."""
        geo = self._reply_learner()
        if geo is None:
            return None
        return ReplyCollector(ctx.kind, lambda reply: hand_reply(geo, ctx.body, reply,
                                                                 (slot.decision or {}).get("replica")))

    async def _run_local_stream(self, ctx: RequestContext, d: RegionDecision, wait_ms: float, slot):
        gen = None
        try:
            t0 = policy_now()
            gen = self.llm.stream(ctx, slot.call_id)
            left = ctx.remaining_s()
            try:
                first = await within(gen.__anext__(), wait_bound(min(self.cfg.first_token_timeout_s, left)))
            except StopAsyncIteration:
                first = NO_TOKEN
            except asyncio.TimeoutError:
                if left < self.cfg.first_token_timeout_s:
                    raise self._deadline_exceeded(ctx, self.region) from None
                raise GeoHTTPError(504, f"region {self.region}: no first token within "
                                        f"{self.cfg.first_token_timeout_s:g} s (first_token_timeout_s)",
                                   type_="stream_timeout", region=self.region) from None
            err = error_in(first, self.region)  # the server refused it (an ErrorResponse first)
            if err is not None:
                raise err
            ttft = policy_now() - t0
            self.estimates.served("stream", ttft)
            self.router.observe_local_ttft(ctx.request_id, ttft, wait_ms / 1000.0)  # the TTFT-SLO guard's calibration
        except BaseException:  # CancelledError too: the client left before the first token
            cancel_quietly(gen)
            slot.release()
            raise
        slot.routed()
        self.served_ids.append(ctx.request_id)
        if ctx.hops:
            self.crashes.reached("served_for_peer")
        try:
            meta = self._local_meta(ctx, d, wait_ms, slot)
            watch = self._reply_collector(ctx, slot)
        except BaseException:
            cancel_quietly(gen)
            slot.release()
            raise
        return meta, TokenStream(gen, first, on_close=slot.release, idle_timeout_s=self.cfg.stream_idle_timeout_s,
                                 where=f"region {self.region}", watch=watch)

    def _local_meta(self, ctx: RequestContext, d: RegionDecision, wait_ms: float, slot) -> dict:
        info = slot.decision  # the router's, on the call's ticket
        meta = {"region": self.region, "route": "local" if ctx.hops == 0 else "forwarded", "origin": ctx.origin,
                "replica": None, "reason": d.reason, "matched_prefix": 0, "queue_wait_ms": wait_ms, "hops": ctx.hops,
                "ingress": self.peers.source}
        if info:
            meta["replica"] = info.get("replica")
            meta["reason"] = info.get("reason") or d.reason
            meta["matched_prefix"] = int(info.get("matched") or 0)
            meta["queue_wait_ms"] = wait_ms + 1000.0 * float(info.get("queue_wait_s") or 0.0)
        return meta
