"""Cross-region work stealing at the ingress: :class:`Stealing`, the Serve side of the exchange in
``policy/region/steal.py`` (the simulator's LB runs the same :class:`Thief` / :class:`Victim`).

Off unless ``two_layer.steal.enabled`` (``TwoLayerConfig.steal``; a region app turns it on with
``ingress: {two_layer: {steal: {enabled: true}}}``); then ``RegionRouter.thief`` / ``victim`` exist.

* **Offer** (thief, background only): after each new peer table and each local completion, a region
  whose admission queue is empty offers its available local replicas to the peers whose heartbeat
  showed held requests (``Thief.offers``). Each offer is one task: through the injected latency to the
  victim ingress's ``steal_offer`` handle method, bounded by :data:`OFFER_TIMEOUT_S`; the answer goes to
  ``Thief.answered``, a failure (or no answer) to ``Thief.forget`` -- the offer's slots are free again.
* **Pick** (victim, :meth:`Stealing.steal_offer`): ``StealOffer.from_wire`` (a malformed offer gets a
  typed error answer naming the field), ``Victim.pick`` over the admission queue's waiting requests
  (their stay cost priced with what waits ahead of each), and each picked request leaves the queue
  (``AdmissionQueue.hand_over``, recorded by ``Victim.sent``) and is woken with a
  :class:`~.admission.HandOver`. The answer: ``{"handed": n, "queue_left": q}``.
* **Hand-over** (victim, :meth:`Stealing._hand_over`): the woken request's own coroutine -- which still
  owns its deadline and its place in the request path -- sends it like a forward (``hops`` + 1, the time
  left on the wire) to the thief's ``stolen`` / ``stolen_stream``. The thief takes it while the offer
  lives (``Thief.take``) and serves it as a forwarded request, or refuses before doing any work (409
  ``steal_refused``). Refused, answered 429 (nothing served) or unreachable (nothing reached it): the
  victim puts it back in its queue at its old place (``Victim.settle`` -> ``admit(place=)``). Anything
  else -- served, a typed error from a thief that started, a timeout, a thief that died after the call was
  made (502 ``handover_lost``, ``forward.py``), the client leaving -- settles it as taken: never put back,
  so never served twice. A thief that took it and then answered 429 counts it ``sent_back``, as the victim
  counts it ``returned``.

A mixin of :class:`~.request_path.RequestPath`; it reads ``cfg``, ``region``, ``router``, ``local``,
``admission``, ``peers``, ``metrics`` and calls ``_forward`` and ``forwarded``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Dict, Optional, Set, Tuple

from ray_geolb.aio import within
from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.region.steal import StealOffer, StealOfferError
from ray_geolb.serve.clock import policy_now

from .admission import HandOver
from .context import RequestContext
from .errors import ForwardFailed, GeoHTTPError

logger = logging.getLogger("ray.serve")

__all__ = ["OFFER_TIMEOUT_S", "STEAL_EVENTS", "Stealing"]

#: the most an offer may wait for its victim's answer (then the thief forgets it: its slots are free again)
OFFER_TIMEOUT_S = 2.0
#: offers in flight at once from one ingress (Thief keeps one per peer; this bounds the tasks anyway)
MAX_OFFER_TASKS = 64
#: what the steal counters count, per peer too (``geolb_steals_total{event, peer}``): offers this region
#: sent (as a thief), failed (no answer) and received (as a victim); requests it handed over, requests
#: it took, refused, and sent back after taking them with a 429 (as a thief), requests its thieves took
#: or sent back (as a victim), and requests handed over whose client left before they could be sent
#: (settled, never sent)
STEAL_EVENTS = ("offers_sent", "offers_failed", "offers_received", "bad_offers", "handed", "taken", "refused",
                "sent_back", "settled_taken", "returned", "abandoned")


class Stealing:
    """See the module docstring."""

    def _init_stealing(self) -> None:
        self.steal_counts: Dict[str, int] = {k: 0 for k in STEAL_EVENTS}
        self.steal_by_peer: Dict[str, Dict[str, int]] = {}
        self.steal_offer_bytes_max = 0
        self._offer_tasks: Set[asyncio.Task] = set()
        self.admission.on_abandoned = self._abandoned
        if self.router.thief is not None:
            for peer in self.cfg.peers:
                for event in STEAL_EVENTS:
                    self.metrics.preregister("geolb_steals_total", event, peer)

    def _steal_note(self, event: str, peer: str, n: int = 1) -> None:
        self.steal_counts[event] += n
        per = self.steal_by_peer.setdefault(peer, {})
        per[event] = per.get(event, 0) + n
        self.metrics.count("geolb_steals_total", event, peer, n=n)

    def steal_state(self) -> Optional[dict]:
        """The state payload's ``steal`` entry (None: stealing is off)."""
        thief, victim = self.router.thief, self.router.victim
        if thief is None:
            return None
        return {"counters": dict(self.steal_counts), "by_peer": {p: dict(c) for p, c in self.steal_by_peer.items()},
                "offer_bytes_max": self.steal_offer_bytes_max, "offers_out": sorted(thief.out),
                "offer_tasks": len(self._offer_tasks), "thief": dict(thief.counts), "victim": dict(victim.counts),
                "victim_in_flight": {p: len(d) for p, d in victim.in_flight.items()}}

    def stop_stealing(self) -> None:
        """Cancel the offers in flight (the ingress is going away)."""
        for t in list(self._offer_tasks):
            t.cancel()

    # ------------------------------------------------------------ thief: offers (background)
    def offer_steals(self) -> None:
        """Offer this region's available local replicas to the peers holding requests (``Thief.offers``:
        nothing while this region's own requests wait). Never blocks: each offer is a bounded task."""
        thief = self.router.thief
        if thief is None or len(self._offer_tasks) >= MAX_OFFER_TASKS:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the event loop (a unit test's direct call): nothing to send with
            return
        try:
            offers = thief.offers(self.router, policy_now(), self.local.local_available(), len(self.admission),
                                  *self.router.steal_price())
        except Exception as e:  # noqa: BLE001 - stealing never stops the ingress
            logger.warning("region %s: steal offers failed: %r", self.region, e)
            return
        for peer, offer in offers:
            t = loop.create_task(self._send_offer(peer, offer))
            self._offer_tasks.add(t)
            t.add_done_callback(self._offer_tasks.discard)

    async def _send_offer(self, peer: str, offer: StealOffer) -> None:
        thief = self.router.thief
        wire = offer.to_wire()
        size = len(json.dumps(wire))
        self.steal_offer_bytes_max = max(self.steal_offer_bytes_max, size)
        self.metrics.count("geolb_steal_offer_bytes_total", peer, n=size)
        self._steal_note("offers_sent", peer)
        answered = False
        try:
            latency = self.peers.latency
            h = self.peers.handle(peer)
            await latency.hop(self.region, peer)
            ans = await within(h.steal_offer.remote(wire), OFFER_TIMEOUT_S)
            await latency.hop(peer, self.region)
            if isinstance(ans, dict) and "error" not in ans:
                thief.answered(peer, offer.offer_id, int(ans["handed"]), int(ans["queue_left"]))
                answered = True
            else:
                logger.warning("region %s: peer %s refused a steal offer: %s", self.region, peer, ans)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - unreachable, timed out: the offer is forgotten below
            logger.info("region %s: steal offer to %s failed: %r", self.region, peer, e)
        finally:
            if not answered:
                self._steal_note("offers_failed", peer)
                o = thief.out.get(peer)
                if o is not None and o[0] == offer.offer_id:  # this offer, not a newer one
                    thief.forget(peer)

    # ------------------------------------------------------------ victim: pick and hand over
    def steal_offer(self, wire: Any) -> dict:
        """A peer's offer (``StealOffer.to_wire``) arrives: hand it the held requests that gain by moving.
        Returns ``{"handed": n, "queue_left": q}``, or ``{"error": {...}}`` naming a malformed field."""
        try:
            offer = StealOffer.from_wire(wire)
        except StealOfferError as e:
            self._steal_note("bad_offers", "?")
            return {"error": {"type": "bad_steal_offer", "param": e.field, "message": str(e)}}
        if offer.thief not in self.cfg.peers:
            self._steal_note("bad_offers", "?")
            return {"error": {"type": "bad_steal_offer", "param": "offer.thief",
                              "message": f"offer.thief must be a peer of region {self.region}"}}
        self._steal_note("offers_received", offer.thief)
        victim, router = self.router.victim, self.router
        if victim is None or not len(self.admission) or self.peers.circuit_open(offer.thief):
            # (a thief this region cannot reach gets nothing: each hand-over would only come back)
            return {"handed": 0, "queue_left": len(self.admission)}
        now = policy_now()
        local = self.local

        def stay_cost_s(i: int, tokens: float, req: RouteRequest):
            router.set_queue(i + local.router_queue_len(), tokens + local.router_queued_tokens())
            return router.stay_cost(req, now)

        try:
            keys = victim.pick(offer, self.admission.held(), router.steal_rtt(offer.thief), stay_cost_s,
                               router.config.max_hops, router.chars_per_token(), router.min_match_chars())
        except Exception as e:  # noqa: BLE001 - a pricing bug hands nothing over; counted by the thief
            logger.warning("region %s: steal pick failed: %r", self.region, e)
            keys = []
        for w in keys:
            place = self.admission.hand_over(w, offer.thief, offer.offer_id)
            victim.sent(offer.thief, w, place)
        if keys:
            self._steal_note("handed", offer.thief, len(keys))
        return {"handed": len(keys), "queue_left": len(self.admission)}

    async def _hand_over(self, ctx: RequestContext, rreq: RouteRequest, d: HandOver,
                         wait_ms: float) -> Tuple[Optional[tuple], Optional[int]]:
        """Send a handed-over request to its thief. Returns ``(result, None)`` when the thief served it,
        or ``(None, place)`` when it must go back in this region's queue at ``place`` (refused, answered
        429, or unreachable: nothing was served). Raises what the thief raised once it took the request."""
        victim, thief = self.router.victim, d.target
        settled = False
        try:
            try:
                out = await self._forward(ctx, rreq, d, wait_ms)
            except ForwardFailed as e:  # nothing reached the thief
                logger.info("region %s: stolen request could not reach %s (%s); back in the queue", self.region,
                            thief, e)
                self.peers.unreachable(thief)
            except GeoHTTPError as e:
                if e.type != "steal_refused" and e.status != 429:
                    raise  # the thief took it and failed: typed, never retried (no double serving)
            else:
                victim.settle(thief, d.key, True)
                settled = True
                self._steal_note("settled_taken", thief)
                return out, None
            place = victim.settle(thief, d.key, False)
            settled = True
            self._steal_note("returned", thief)
            return None, d.place if place is None else place
        finally:
            if not settled:  # served or failing there, or the client left: never put back
                victim.settle(thief, d.key, True)
                self._steal_note("settled_taken", thief)

    def _abandoned(self, d: HandOver) -> None:
        """A handed-over request's client left before it was sent: settle it (nothing goes back)."""
        victim = self.router.victim
        if victim is not None:
            victim.settle(d.target, d.key, True)
            self._steal_note("abandoned", d.target)

    # ------------------------------------------------------------ thief: a stolen request arrives
    async def stolen(self, body: dict, fmeta: dict, victim: str, offer_id: Any, *, stream: bool):
        """A request ``victim`` handed over under our offer ``offer_id``: taken while that offer lives (then
        served exactly as a forwarded request), or, with several ingress replicas in this region, while this
        one has a free local slot and nothing waiting (a sibling made the offer: ``Thief.take``), else
        refused with a 409 ``steal_refused`` before any work.
        Counted when it ends, as the victim counts it: ``taken`` (served here, or failed here after work
        began), or ``sent_back`` when this region answered 429 (nothing ran; the victim counts it
        ``returned`` and puts it back in its queue)."""
        thief = self.router.thief
        known = isinstance(victim, str) and victim in self.cfg.peers
        # the offer is the region's: a sibling ingress replica may have made it (Thief.take)
        room = self.local.local_slots() if self.siblings.replicas() > 1 and not len(self.admission) else 0
        ok = (thief is not None and known and isinstance(offer_id, int) and not isinstance(offer_id, bool)
              and thief.take(victim, offer_id, policy_now(), sibling_room=max(0, room)))
        peer = victim if known else "?"
        if not ok:
            self._steal_note("refused", peer)
            raise GeoHTTPError(409, f"region {self.region} refused a request handed over by region {peer}: its "
                                    f"steal offer is closed (expired, used or unknown)",
                               type_="steal_refused", region=self.region)
        sent_back = False
        try:
            return await self.forwarded(body, fmeta, stream=stream)
        except GeoHTTPError as e:
            sent_back = e.status == 429  # taken, then found no room: nothing ran, the victim takes it back
            raise
        finally:
            if sent_back:
                thief.sent_back(peer)
                self._steal_note("sent_back", peer)
            else:
                self._steal_note("taken", peer)
