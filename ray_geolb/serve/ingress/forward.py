"""A request sent to a peer region: :class:`Forwarding`, the one-hop forward, streamed or not.

:meth:`Forwarding._forward` records the forward in the region layer (``RegionRouter.on_forward``, the
snapshot mirror, ``note_forward``), injects the one-way latency (``serve/latency.py``) and calls the
peer ingress's ``forwarded`` / ``forwarded_stream`` handle method with the context on the wire
(``hops=1``): the peer never forwards it again.

Every hand-over (a forward or a steal) carries a fresh id (``handover_id`` on the wire); the peer records
it before any work (``handovers.py``: a repeated id is refused, 409 ``duplicate_handover``) and names
its model call after the request (``CallTicket``). What the origin does with a failure depends on
whether the request can have reached the peer:

* **Nothing reached it** -- the peer's handle could not be had, the crossing was dropped on the way out
  (an injected partition), or Serve refused the call before any replica got it (``BackPressureError``,
  ``DeploymentUnavailableError``): :class:`~.errors.ForwardFailed`; the request path marks the peer
  unreachable and decides again (a steal goes back in the victim's queue).
* **The peer answered** with a typed :class:`~.errors.GeoHTTPError`: raised as it is, never retried
  elsewhere (a 429 is the one answer that says nothing was started: the request path decides again).
* **Unknown** -- the call was made and failed without a typed answer (the peer's ingress died: an
  ``ActorDiedError``, or any other system error): the peer may have taken it and its engine may still
  run it. The request is **not run again**: the client gets 502 ``handover_lost`` (with
  ``Retry-After``), the peer is marked unreachable, and ``handovers_lost`` counts it. So each request
  gets exactly one answer and runs to completion at most once (``docs/design.md`` section 3).

A held request a stealing peer was handed (a :class:`~.admission.HandOver` decision, ``steal.py``) goes
the same way to the thief's ``stolen`` / ``stolen_stream`` (with this region and the offer id), without
the forward's bookkeeping (the regional snapshot, ``note_forward``): it was pulled, not pushed.

A mixin of :class:`~.request_path.RequestPath`; it reads ``cfg``, ``region``, ``router``, ``peers``,
``counts``, ``metrics`` and calls ``_deadline_exceeded``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from ray_geolb.aio import within
from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.region import RegionDecision
from ray_geolb.serve.clock import policy_now

from .admission import HandOver
from .context import RequestContext, wait_bound
from .errors import ForwardFailed, GeoHTTPError, as_http_error, error_cause
from .streams import NO_TOKEN, TokenStream, aclose_quietly, cancel_quietly

logger = logging.getLogger("ray.serve")

__all__ = ["Forwarding", "nothing_started"]


def nothing_started(e: BaseException) -> bool:
    """True if Serve refused a handle call before any replica got it (its queue was full, or the
    deployment has no replica): the peer never saw the request."""
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    return isinstance(error_cause(e), (BackPressureError, DeploymentUnavailableError))


def _forward_meta(meta: dict, d: RegionDecision) -> dict:
    meta = dict(meta)
    meta["route"] = "forwarded"
    meta["forward_reason"] = d.reason
    return meta


class Forwarding:
    """See the module docstring."""

    async def _forward(self, ctx: RequestContext, rreq: RouteRequest, d: RegionDecision, wait_ms: float):
        """Send the request to peer ``d.target``'s ingress (one hop). Raises :class:`ForwardFailed` if the
        peer cannot be reached, or the peer's :class:`GeoHTTPError`."""
        peer = d.target
        stolen = isinstance(d, HandOver)
        if not stolen:
            self.router.on_forward(rreq, peer, policy_now())
            self.peers.snapshot_changed()
            # optimistic: count the forward in the peer's LB queue until its next heartbeat, so a burst
            # stops going to a peer after ~tau forwards per heartbeat period instead of herding there
            self.router.note_forward(peer)
            self.counts["forwarded_out"] += 1
        method, extra = ("stolen", (self.region, d.offer_id)) if stolen else ("forwarded", ())
        try:
            h = self.peers.handle(peer)
        except Exception as e:  # noqa: BLE001
            raise ForwardFailed(str(e)) from None
        latency = self.peers.latency
        try:
            await latency.hop(self.region, peer)
        except ConnectionError as e:  # dropped on the way (an injected partition): nothing reached the peer
            raise ForwardFailed(str(e)) from None
        fmeta = ctx.wire(wait_ms, d)  # after the hop: the deadline it carries is the time left on arrival
        fmeta["handover_id"] = hid = uuid.uuid4().hex
        if ctx.stream:
            return await self._forward_stream(h, peer, ctx, fmeta, d, method, extra)
        resp = getattr(h, method).remote(dict(ctx.body), fmeta, *extra)
        try:
            meta, res = await within(resp, wait_bound(min(self.cfg.forward_timeout_s, ctx.remaining_s())))
        except asyncio.TimeoutError:
            # reached and working on it, or silent: typed, never retried elsewhere (no double serving)
            cancel_quietly(resp)
            raise self._deadline_exceeded(ctx, peer, self.cfg.forward_timeout_s) from None
        except Exception as e:
            await latency.hop(peer, self.region)
            raise self._failed_after_call(e, peer, hid) from None
        await latency.hop(peer, self.region)
        return _forward_meta(meta, d), res

    def _failed_after_call(self, e: BaseException, peer: str, hid: str) -> Exception:
        """What a hand-over call that failed after it was made becomes (see the module docstring): the
        peer's typed error, :class:`ForwardFailed` when Serve says no replica got it, else 502
        ``handover_lost`` -- the peer may have taken it, so it is never run again here."""
        err = as_http_error(e, peer)
        if err is not None:
            return err
        if nothing_started(e):
            return ForwardFailed(f"{type(error_cause(e)).__name__}: {e}")
        self.counts["handovers_lost"] += 1
        self.metrics.count("geolb_handovers_lost_total", peer)
        self.peers.unreachable(peer)
        logger.warning("region %s: region %s failed after the hand-over of %s was sent (%s); not run again",
                       self.region, peer, hid, type(error_cause(e)).__name__)
        return GeoHTTPError(502, f"region {peer} failed after it may have taken this request (hand-over {hid}: "
                                 f"{type(error_cause(e)).__name__}); it was not run again, so it runs at most "
                                 f"once -- retry it if you need an answer", type_="handover_lost",
                            retry_after_s=self.cfg.retry_after_s, region=peer)

    async def _forward_stream(self, h, peer: str, ctx: RequestContext, fmeta: dict, d: RegionDecision,
                              method: str = "forwarded", extra: tuple = ()):
        gen = getattr(h.options(stream=True), method + "_stream").remote(dict(ctx.body), fmeta, *extra)
        relay = self.peers.latency.relay(gen, peer, self.region)
        left = ctx.remaining_s()
        try:
            meta = await within(relay.__anext__(), wait_bound(min(self.cfg.first_token_timeout_s, left)))
        except BaseException as e:  # CancelledError too: the peer must stop working on it
            await aclose_quietly(relay)
            cancel_quietly(gen)
            if not isinstance(e, Exception):
                raise
            if isinstance(e, asyncio.TimeoutError) and left < self.cfg.first_token_timeout_s:
                raise self._deadline_exceeded(ctx, peer) from None
            if isinstance(e, asyncio.TimeoutError):  # reached but silent: typed, not "unreachable"
                raise GeoHTTPError(504, f"region {peer} did not start the stream within "
                                        f"{self.cfg.first_token_timeout_s:g} s (first_token_timeout_s)",
                                   type_="stream_timeout", region=peer) from None
            raise self._failed_after_call(e, peer, fmeta["handover_id"]) from None

        async def close():
            cancel_quietly(gen)
            await aclose_quietly(relay)

        idle = self.cfg.stream_idle_timeout_s
        return _forward_meta(meta, d), TokenStream(relay, NO_TOKEN, on_close=close, idle_timeout_s=idle,
                                                   where=f"region {peer}")
