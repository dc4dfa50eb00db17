"""Cross-region work stealing: an idle region pulls held requests from a busy peer, exactly once.

Every push rule a per-region router has (forward on overflow, forward before saturation) acts on what a
peer was a heartbeat ago, and a burst pushed on that knowledge lands on the peer at once. Stealing turns
it round: the region with free capacity knows it is free *now*, and the busy region knows *now* what it
holds. One exchange, for both drivers (the simulator's LB, ``sim/region_lb.py``; the Serve ingress,
``serve/ingress/steal.py``):

1. **Offer** (thief -> victim). A region whose hold queue is empty and whose local layer has free slots
   (``LocalLoad.free_slots``, what SP-P would grant now) sends each peer whose last heartbeat showed held
   requests one :class:`StealOffer`: its free slots, what a stolen request would cost it (a fixed wait and
   a price per uncached prompt token) and its prefix summary. The trigger is the peer table -- each new
   table, and each local completion while a table shows a queue somewhere -- so an idle region pulls
   within one heartbeat of a peer's queue forming, and again whenever it frees a slot. :class:`Thief`
   keeps at most one offer per peer outstanding (answered, or expired after ``offer_ttl_s``): the slots
   it offers are never offered twice.
2. **Pick** (victim). :meth:`Victim.pick` picks from its hold queue the requests that gain by moving:
   the thief's cost plus the RTT beats the request's expected wait and prefill here by ``min_gain_s``.
   Those the thief's summary matches come first, then the oldest. Never one whose allowed regions
   exclude the thief, never one past the hop limit, never more than the offer's slots or than
   ``max_in_flight`` steals outstanding to that peer. The picked requests leave the victim's queue
   *before* they are sent (:meth:`Victim.sent`), with their place in it.
3. **Hand-over** (victim -> thief). Each picked request travels like a forward (its deadline with it,
   ``hops`` + 1, so it can never move again). The thief takes it while the offer lives and has a slot
   (:meth:`Thief.take`) and decides it like any forwarded request; otherwise it refuses, and the victim
   puts it back in its queue at its old place (:meth:`Victim.settle`: ``returned``); an unreachable thief
   is a refusal. The thief's answer settles the in-flight count. So a request is in exactly one queue or
   in flight to exactly one place: never served twice, never lost.

Everything here is plain data and O(held requests scanned) per offer; nothing imports Ray.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Tuple

from .config import MAX_OFFER_SLOTS, StealConfig
from .prefix_summary import PrefixSummary

__all__ = ["StealConfig", "StealOffer", "StealOfferError", "Thief", "Victim", "MAX_OFFER_SLOTS"]

class StealOfferError(ValueError):
    """A malformed offer on the wire; ``field`` names what is wrong (``offer.<name>``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _finite(d: dict, k: str, lo: float = 0.0, hi: float = 1e9) -> float:
    v = d.get(k)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise StealOfferError(f"offer.{k}", f"offer.{k} must be a finite number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


@dataclass(frozen=True)
class StealOffer:
    """A thief's offer: ``slots`` free now; a request moved here costs about ``wait_s + t_p_s`` x its
    uncached prompt tokens (matched against ``summary``, the thief's prefix summary, if any)."""

    offer_id: int
    thief: str
    slots: int
    wait_s: float
    t_p_s: float
    summary: Optional[PrefixSummary] = None

    def cost_s(self, req, rtt_s: float, chars_per_token: float = 4.0) -> float:
        """The thief's expected TTFT for ``req`` (a ``RouteRequest``), the round trip included."""
        hit = 0.0
        if self.summary is not None and req.text is not None:
            hit = self.summary.match(req) / chars_per_token
        return rtt_s + self.wait_s + self.t_p_s * max(0.0, req.prompt_tokens - hit)

    def to_wire(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"offer_id": self.offer_id, "thief": self.thief, "slots": self.slots,
                             "wait_s": self.wait_s, "t_p_s": self.t_p_s}
        if self.summary is not None:
            d["summary"] = self.summary.to_wire()
        return d

    @classmethod
    def from_wire(cls, d) -> "StealOffer":
        """Validate an offer received from a peer (:class:`StealOfferError` names the bad field)."""
        if not isinstance(d, dict):
            raise StealOfferError("offer", f"offer must be a dict, got {type(d).__name__}")
        extra = set(d) - {"offer_id", "thief", "slots", "wait_s", "t_p_s", "summary"}
        if extra:
            raise StealOfferError("offer", f"offer has unknown field(s) {sorted(extra)}")
        oid, slots, thief = d.get("offer_id"), d.get("slots"), d.get("thief")
        if isinstance(oid, bool) or not isinstance(oid, int) or not 0 <= oid < 2**63:
            raise StealOfferError("offer.offer_id", f"offer.offer_id must be an integer in [0, 2^63), got {oid!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_OFFER_SLOTS:
            raise StealOfferError("offer.slots", f"offer.slots must be an integer in [1, {MAX_OFFER_SLOTS}], "
                                                 f"got {slots!r}")
        if not isinstance(thief, str) or not 1 <= len(thief) <= 64:
            raise StealOfferError("offer.thief", f"offer.thief must be a region name, got {thief!r:.60}")
        summary = None
        if d.get("summary") is not None:
            try:
                summary = PrefixSummary.from_wire(d["summary"])
            except ValueError as e:
                raise StealOfferError("offer.summary", f"offer.summary: {e}") from None
        return cls(oid, thief, slots, _finite(d, "wait_s", hi=3600.0), _finite(d, "t_p_s", hi=1.0), summary)


_ids = itertools.count(1)


class Thief:
    """The offering side of one region: which peers it has an offer out to, and each offer's slots."""

    def __init__(self, config: StealConfig, region: str):
        self.config = config
        self.region = region
        #: peer -> [offer_id, expires_at, slots not yet taken, the peer's heartbeat time it was offered on]
        self.out: Dict[str, list] = {}
        #: peer -> the heartbeat time of its last offer that it answered with nothing: no new offer to it
        #: until a newer heartbeat (at most one unanswered offer per peer per heartbeat)
        self.declined: Dict[str, float] = {}
        self.counts = {"offers": 0, "offered_slots": 0, "taken": 0, "refused": 0, "sent_back": 0, "expired": 0,
                       "taken_for_a_sibling": 0}

    def expire(self, now: float) -> None:
        for peer in [p for p, o in self.out.items() if o[1] <= now]:
            del self.out[peer]
            self.counts["expired"] += 1

    def offers(self, router, now: float, free_slots: int, queue_len: int,
               wait_s: float, t_p_s: float) -> List[Tuple[str, StealOffer]]:
        """The offers to send now: none while this region's own requests wait (``queue_len``) or it has no
        free slot; else one per peer whose fresh heartbeat shows held requests and that has no offer of
        ours out, the free slots shared out by the peers' queues (longest first)."""
        if not self.config.enabled or queue_len > 0 or free_slots <= 0:
            return []
        self.expire(now)
        stale = router.config.peer_stale_s
        declined = self.declined
        busy = sorted(((p.reported_queue_len, r) for r, p in router.peers.items()
                       if r not in self.out and p.reported_queue_len > 0 and now - p.timestamp <= stale
                       and declined.get(r) != p.timestamp),
                      reverse=True)
        if not busy:
            return []
        out = []
        left = free_slots - sum(o[2] for o in self.out.values())
        summary = router.prefix_summary()
        for q, peer in busy:
            if left <= 0:
                break
            n = min(left, q, MAX_OFFER_SLOTS)
            left -= n
            offer = StealOffer(next(_ids), self.region, n, wait_s, t_p_s, summary)
            self.out[peer] = [offer.offer_id, now + self.config.offer_ttl_s, n, router.peers[peer].timestamp]
            self.counts["offers"] += 1
            self.counts["offered_slots"] += n
            out.append((peer, offer))
        return out

    def answered(self, peer: str, offer_id: int, handed: int, queue_left: int) -> None:
        """The victim's answer: it handed ``handed`` requests over and still holds ``queue_left``. An offer
        that handed nothing is closed at once (its slots free again), and that peer gets no new offer until
        a newer heartbeat (its queue held nothing worth moving here)."""
        o = self.out.get(peer)
        if o is not None and o[0] == offer_id:
            o[2] = min(o[2], handed)
            if handed <= 0:
                self.declined[peer] = o[3]
            if o[2] <= 0:
                del self.out[peer]

    def take(self, peer: str, offer_id: int, now: float, sibling_room: int = 0) -> bool:
        """A request stolen from ``peer`` under ``offer_id`` arrives: take it (True) while that offer lives
        and has a slot left, else refuse it (it goes back to the victim).

        An offer is the region's, not one router's: with several routers in this region (ingress replicas)
        a hand-over reaches any of them, so one that reaches a router that has no such offer out (a sibling
        made it) is taken while that router has ``sibling_room`` free slots (its driver passes them, with
        none of its own requests waiting; 0 with one router per region), counted ``taken_for_a_sibling``."""
        o = self.out.get(peer)
        if (o is None or o[0] != offer_id) and sibling_room > 0:
            self.counts["taken"] += 1
            self.counts["taken_for_a_sibling"] += 1
            return True
        if o is None or o[0] != offer_id or o[1] <= now or o[2] <= 0:
            self.counts["refused"] += 1
            return False
        o[2] -= 1
        if o[2] <= 0:
            del self.out[peer]
        self.counts["taken"] += 1
        return True

    def sent_back(self, peer: str) -> None:
        """A request taken from ``peer`` was answered 429 here before any work (no room after all): it is
        counted ``sent_back``, not ``taken``, as its victim counts it ``returned``."""
        self.counts["taken"] -= 1
        self.counts["sent_back"] += 1

    def forget(self, peer: str) -> None:
        self.out.pop(peer, None)
        self.declined.pop(peer, None)


class Victim:
    """The handing-over side of one region: what it handed to whom and not yet saw settled."""

    def __init__(self, config: StealConfig):
        self.config = config
        #: thief -> {request key: its place in the queue (an opaque, ordered sequence number)}
        self.in_flight: Dict[str, Dict[Hashable, Any]] = {}
        self.counts = {"offers_seen": 0, "handed": 0, "taken": 0, "returned": 0}

    def pick(self, offer: StealOffer, held: Iterable[Tuple[Hashable, Any]], rtt_s: float,
             stay_cost_s: Callable[[int, float, Any], Optional[float]], max_hops: int,
             chars_per_token: float = 4.0, min_match_chars: int = 1) -> List[Hashable]:
        """The keys of the held requests to hand to ``offer``'s thief, in hand-over order (module
        docstring, step 2). ``held``: (key, RouteRequest) head first; ``stay_cost_s(i, tokens, req)``: the
        request's expected TTFT here with ``i`` requests (``tokens`` prompt tokens) ahead of it (None: it
        may not stay here). A summary match shorter than ``min_match_chars`` counts as none (a Bloom
        filter's false positive on a first block must not jump the queue)."""
        self.counts["offers_seen"] += 1
        cfg = self.config
        room = min(offer.slots, cfg.max_in_flight - len(self.in_flight.get(offer.thief, ())))
        if room <= 0:
            return []
        cands = []
        ahead = 0.0
        for i, (key, req) in enumerate(itertools.islice(held, cfg.scan)):
            tokens, ahead = ahead, ahead + req.prompt_tokens
            if req.hops >= max_hops:
                continue
            allowed = req.allowed_regions
            if allowed is not None and offer.thief not in allowed:
                continue
            matched = offer.summary.match(req) if offer.summary is not None and req.text is not None else 0
            if matched < min_match_chars:
                matched = 0
            there = rtt_s + offer.wait_s + offer.t_p_s * max(0.0, req.prompt_tokens - matched / chars_per_token)
            here = stay_cost_s(i, tokens, req)
            if here is not None and here - there < cfg.min_gain_s:
                continue
            cands.append((0 if matched > 0 else 1, i, key))
        cands.sort()
        return [key for _, _, key in cands[:room]]

    def sent(self, thief: str, key: Hashable, place: Any) -> None:
        """``key`` left this queue (from ``place``) and is on its way to ``thief``."""
        self.in_flight.setdefault(thief, {})[key] = place
        self.counts["handed"] += 1

    def settle(self, thief: str, key: Hashable, taken: bool) -> Optional[Any]:
        """The thief took ``key`` (True) or refused it / could not be reached (False). Returns its old place
        in the queue when it must go back (refused), else None."""
        d = self.in_flight.get(thief)
        place = d.pop(key, None) if d is not None else None
        if d is not None and not d:
            del self.in_flight[thief]
        self.counts["taken" if taken else "returned"] += 1
        return None if taken else place

    def outstanding(self) -> int:
        return sum(len(d) for d in self.in_flight.values())
