"""The ingress's admission queue: :class:`AdmissionQueue`, an FCFS hold queue at the region's door.

A request that cannot go anywhere now (the region layer says *hold*) waits here, bounded
(``max_queue`` -> 429) and time-limited (``max_wait_s``, or the client's shorter
``x-geolb-max-wait-s`` -> 503), both with ``Retry-After`` and a JSON error body. Strict FCFS for local
capacity: behind waiting requests a newcomer may not take a local replica -- but it may be forwarded
(a peer's capacity is not what the queue waits for). Only the head is re-decided every ``poll_s`` and
when a local request completes (:meth:`AdmissionQueue.kick`); the others when the peer table changes
(:meth:`AdmissionQueue.kick_all`) or every 0.25 s. Go, wait or refuse is the region layer's one queue
rule (``policy/region/queue_rule.py``: :class:`~ray_geolb.policy.region.queue_rule.QueueRule`), which the
simulator's LB runs too; this class only waits, wakes and answers.

The waiting requests and their prompt-token sum are one :class:`~ray_geolb.policy.hold_queue.HoldQueue`
-- the same FCFS queue the simulator's LB and the GeoPrefixRouter hold requests in -- so "queued
tokens ahead" of a request is counted one way everywhere. Each entry is a :class:`Waiter` (its
``RouteRequest`` and wake-up event), so a work-stealing victim (``steal.py``) can pick held requests
(:meth:`AdmissionQueue.held`), take one out and wake it with a hand-over decision
(:meth:`AdmissionQueue.hand_over`), and put one its thief refused back at its old place
(``admit(..., place=)``).

A request with a deadline (``admit(..., deadline_s=, expect=)``) is refused at once -- 429
``deadline_unreachable`` with ``Retry-After`` -- when the queue rule's deadline check says the queue ahead
of it cannot be served in time (``deadlines.py``): on arrival, before it would take a local slot, and
each time it is decided again while it waits. It does not wait out its deadline here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Optional, Tuple

from ray_geolb.aio import wait_or_timeout
from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.hold_queue import HoldQueue
from ray_geolb.policy.region import RegionDecision
from ray_geolb.policy.region.queue_rule import GO, REFUSE, QueueRule

from .config import IngressConfig
from .deadlines import DeadlineEstimates
from .errors import GeoHTTPError

__all__ = ["AdmissionQueue", "Expect", "HandOver", "Waiter"]

#: (expected wait for the queue ahead, expected service), seconds (None: unknown), of the request whose
#: key in the queue is the argument (None: a newcomer, behind every waiting request)
Expect = Callable[[Optional[Hashable]], Tuple[Optional[float], Optional[float]]]

#: re-decide period of a waiting request that is not the head (it cannot take a local replica)
BEHIND_HEAD_POLL_S = 0.25


@dataclass(eq=False)
class Waiter:
    """One request waiting in the admission queue (its key there, hashed by identity): its route request,
    its wake-up event, and -- once a steal victim handed it over -- the decision it leaves with."""

    rreq: RouteRequest
    ev: asyncio.Event = field(default_factory=asyncio.Event)
    handed: Optional["HandOver"] = None


@dataclass
class HandOver(RegionDecision):
    """A held request handed to a stealing peer (``target``) under its offer ``offer_id``: a forward to
    that peer's ``stolen`` handle method, which may refuse it (then it comes back at ``place``). ``key``:
    its :class:`Waiter` (what the victim's ``Victim.sent`` / ``settle`` know it by)."""

    offer_id: int = 0
    place: int = 0
    key: Any = field(default=None, repr=False, compare=False)


class AdmissionQueue:
    """The FCFS hold queue of one ingress (see the module docstring).

    ``decide(rreq, waiting)`` is the region layer's decision for ``rreq``; ``waiting`` is its key in
    this queue (None: a newcomer, behind every waiting request), so the decision can see what waits
    ahead of it (:meth:`ahead`)."""

    def __init__(self, cfg: IngressConfig, decide: Callable[[RouteRequest, Optional[Hashable]], RegionDecision],
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.region = cfg.region
        self._decide = decide
        self._clock = clock
        #: go / wait / refuse (Serve always forwards past the queue: forward_past_queue is a code path here)
        self.rule = QueueRule(max_queue=cfg.max_queue, max_wait_s=cfg.max_wait_s)
        #: one entry per waiting request (its :class:`Waiter`, key and item), with its prompt tokens
        self.queue: HoldQueue[Waiter, Waiter] = HoldQueue(tokens_of=lambda w: int(w.rreq.prompt_tokens))
        self.counts = {"held": 0, "queue_full": 0, "wait_timeout": 0, "deadline_unreachable": 0}
        #: called with the :class:`HandOver` of a request handed to a thief that left before it could be
        #: sent (its client went away just then), so the hand-over is settled (``steal.py``)
        self.on_abandoned: Optional[Callable[["HandOver"], None]] = None

    # ------------------------------------------------------------ reads
    def __len__(self) -> int:
        return len(self.queue)

    @property
    def tokens(self) -> int:
        """Prompt tokens of every waiting request."""
        return self.queue.tokens

    def ahead(self, waiting: Optional[Hashable]) -> Tuple[int, int]:
        """(requests, prompt tokens) waiting before ``waiting`` (None: before a newcomer, i.e. all)."""
        return self.queue.ahead(waiting)

    def held(self) -> Iterator[Tuple[Waiter, RouteRequest]]:
        """(waiter, its RouteRequest) of every waiting request, head first (what a steal victim picks from)."""
        return ((w, w.rreq) for w in self.queue)

    # ------------------------------------------------------------ work stealing (steal.py)
    def hand_over(self, waiter: Waiter, thief: str, offer_id: int) -> int:
        """Take ``waiter`` out of the queue (before it is sent) and wake it with a :class:`HandOver` to
        ``thief``; returns its place (what ``admit(..., place=)`` puts it back at). KeyError if it is
        not waiting here."""
        place = self.queue.place(waiter)
        if place is None:
            raise KeyError("not waiting in this queue")
        was_head = self.queue.is_head(waiter)
        self.queue.remove(waiter)
        waiter.handed = HandOver("forward", thief, reason="stolen", offer_id=offer_id, place=place,
                                 key=waiter)
        waiter.ev.set()
        if was_head:
            self.kick()
        return place

    # ------------------------------------------------------------ wake-ups
    def kick(self) -> None:
        """Re-decide the head now (a local slot freed)."""
        head = self.queue.head()
        if head is not None:
            head[0].ev.set()

    def kick_all(self) -> None:
        """Re-decide every waiting request now (the peer table changed)."""
        for w in self.queue:
            w.ev.set()

    # ------------------------------------------------------------ admission
    async def admit(self, rreq: RouteRequest, max_wait_s: Optional[float] = None,
                    place: Optional[int] = None, deadline_s: Optional[float] = None,
                    expect: Optional[Expect] = None) -> RegionDecision:
        """A non-hold decision for ``rreq``, after waiting FCFS in this queue if needed -- or a
        :class:`HandOver` if a steal victim handed it to a peer while it waited. ``place``: a request a
        thief refused, put back at its old place (from :meth:`hand_over`) and decided from there.
        ``deadline_s``: the time the request has left; with ``expect`` (its expected wait and service,
        see :data:`Expect`) it is refused as soon as it cannot be expected to make it. Raises
        :class:`GeoHTTPError` 429 (queue full; deadline unreachable) or 503 (no capacity within the
        wait limit)."""
        max_wait = self.rule.wait_limit(max_wait_s)
        t0 = self._clock()
        due = None if deadline_s is None or expect is None else t0 + deadline_s
        reason = "returned"
        if place is None:
            d = self._decide(rreq, None)
            v = self.rule.admit(d, len(self.queue))
            if v.action == GO:
                if d.kind == "local":
                    self._check_deadline(due, expect, None, local_now=True)
                return d  # behind waiting requests only a forward (or a reject) goes straight on
            self._check_deadline(due, expect, None)
            reason = v.reason
            if v.action == REFUSE:
                self.counts["queue_full"] += 1
                raise GeoHTTPError(429, f"region {self.region}: {len(self.queue)} requests already waiting "
                                        f"(max_queue={self.cfg.max_queue}); retry later",
                                   type_="queue_full", retry_after_s=self.cfg.retry_after_s, region=self.region)
            self.counts["held"] += 1
        w = Waiter(rreq)
        if place is None:
            self.queue.append(w, w)
        else:  # back where it stood: never refused for a full queue (it was in it)
            self.queue.restore(w, w, place)
        decided = False
        try:
            d = await self._wait(w, t0 + max_wait, max_wait, reason, due, expect)
            decided = True
            return d
        finally:  # done, timed out, handed over or cancelled: leave the queue, and wake the next head
            was_head = self.queue.is_head(w)
            self.queue.remove(w)
            if was_head:
                self.kick()
            if not decided and w.handed is not None and self.on_abandoned is not None:
                self.on_abandoned(w.handed)  # handed over, then cancelled before it could be sent

    def _check_deadline(self, due: Optional[float], expect: Optional[Expect], key: Optional[Hashable],
                        local_now: bool = False) -> None:
        """Raise 429 ``deadline_unreachable`` (with ``Retry-After``) if the request keyed ``key`` cannot be
        expected to finish by ``due`` (None: no check). ``local_now``: it takes a local slot now (only
        its service time counts)."""
        if due is None or expect is None:
            return
        wait_s, service_s = expect(key)
        if local_now:
            wait_s = 0.0
        remaining = due - self._clock()
        v = self.rule.deadline(remaining, wait_s, service_s)
        if v.action != REFUSE:
            return
        self.counts["deadline_unreachable"] += 1
        need = (wait_s or 0.0) + (service_s or 0.0)
        raise GeoHTTPError(429, f"region {self.region}: the request cannot be served within its deadline "
                                f"({max(0.0, remaining):.2f} s left; expected wait {wait_s or 0.0:.2f} s for the "
                                f"requests ahead, then {service_s or 0.0:.2f} s of service); retry later",
                           type_="deadline_unreachable",
                           retry_after_s=DeadlineEstimates.retry_after_s(need, remaining, self.cfg.retry_after_s),
                           region=self.region)

    async def _wait(self, w: Waiter, deadline: float, max_wait: float, reason: str,
                    due: Optional[float] = None, expect: Optional[Expect] = None) -> RegionDecision:
        """Wait in the queue until a decision other than *hold* is allowed (local only at the head), or a
        steal victim hands the request over; refused early when it cannot make its deadline (``due``)."""
        cfg = self.cfg
        ev, rreq = w.ev, w.rreq
        while True:
            if w.handed is not None:
                return w.handed
            remaining = deadline - self._clock()
            if self.rule.timed_out(remaining).action == REFUSE:
                self.counts["wait_timeout"] += 1
                raise GeoHTTPError(503, f"region {self.region}: no replica became available within "
                                        f"{max_wait:g} s ({reason})",
                                   type_="wait_timeout", retry_after_s=cfg.retry_after_s, region=self.region)
            ev.clear()
            # the head re-decides every poll_s; the others when the peer table changes (kick_all)
            timeout = cfg.poll_s if self.queue.is_head(w) else max(cfg.poll_s, BEHIND_HEAD_POLL_S)
            await wait_or_timeout(ev, min(remaining, timeout))
            if w.handed is not None:
                return w.handed
            d = self._decide(rreq, w)
            v = self.rule.again(d, self.queue.is_head(w))
            if v.action == GO:
                if d.kind == "local":
                    self._check_deadline(due, expect, w, local_now=True)
                return d
            self._check_deadline(due, expect, w)
            if v.reason is not None:  # a hold's reason; a local decision not at the head keeps the last
                reason = v.reason
