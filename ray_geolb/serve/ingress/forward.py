"""A request sent to a peer region: :class:`Forwarding`, the one-hop forward, streamed or not.

:meth:`Forwarding._forward` records the forward in the region layer (``RegionRouter.on_forward``, the
snapshot mirror, ``note_forward``), injects the one-way latency (``serve/latency.py``) and calls the
peer ingress's ``forwarded`` / ``forwarded_stream`` handle method with the context on the wire
(``hops=1``): the peer never forwards it again. It raises :class:`~.errors.ForwardFailed` when the
peer cannot be reached (the request path then marks it unreachable and decides again), or the
peer's typed :class:`~.errors.GeoHTTPError` (reached and answered: never retried elsewhere).

A held request a stealing peer was handed (a :class:`~.admission.HandOver` decision, ``steal.py``) goes
the same way to the thief's ``stolen`` / ``stolen_stream`` (with this region and the offer id), without
the forward's bookkeeping (the regional snapshot, ``note_forward``): it was pulled, not pushed.

A mixin of :class:`~.request_path.RequestPath`; it reads ``cfg``, ``region``, ``router``, ``peers``,
``counts`` and calls ``_deadline_exceeded``.
"""

from __future__ import annotations

import asyncio

from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.region import RegionDecision
from ray_geolb.serve.clock import policy_now

from .admission import HandOver
from .context import RequestContext, wait_bound
from .errors import ForwardFailed, GeoHTTPError, as_http_error
from .streams import NO_TOKEN, TokenStream, aclose_quietly, cancel_quietly

__all__ = ["Forwarding"]


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
        if ctx.stream:
            return await self._forward_stream(h, peer, ctx, fmeta, d, method, extra)
        resp = getattr(h, method).remote(dict(ctx.body), fmeta, *extra)
        try:
            meta, res = await asyncio.wait_for(resp, wait_bound(min(self.cfg.forward_timeout_s, ctx.remaining_s())))
        except asyncio.TimeoutError:
            # reached and working on it, or silent: typed, never retried elsewhere (no double serving)
            cancel_quietly(resp)
            raise self._deadline_exceeded(ctx, peer, self.cfg.forward_timeout_s) from None
        except Exception as e:
            await latency.hop(peer, self.region)
            err = as_http_error(e, peer)
            if err is not None:
                raise err from None
            raise ForwardFailed(f"{type(e).__name__}: {e}") from None
        await latency.hop(peer, self.region)
        return _forward_meta(meta, d), res

    async def _forward_stream(self, h, peer: str, ctx: RequestContext, fmeta: dict, d: RegionDecision,
                              method: str = "forwarded", extra: tuple = ()):
        gen = getattr(h.options(stream=True), method + "_stream").remote(dict(ctx.body), fmeta, *extra)
        relay = self.peers.latency.relay(gen, peer, self.region)
        left = ctx.remaining_s()
        try:
            meta = await asyncio.wait_for(relay.__anext__(), wait_bound(min(self.cfg.first_token_timeout_s, left)))
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
            err = as_http_error(e, peer)
            if err is not None:
                raise err from None
            raise ForwardFailed(f"{type(e).__name__}: {e}") from None

        async def close():
            cancel_quietly(gen)
            await aclose_quietly(relay)

        idle = self.cfg.stream_idle_timeout_s
        return _forward_meta(meta, d), TokenStream(relay, NO_TOKEN, on_close=close, idle_timeout_s=idle,
                                                   where=f"region {peer}")
