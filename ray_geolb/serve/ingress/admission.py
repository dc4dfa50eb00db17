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
tokens ahead" of a request is counted one way everywhere.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Hashable, Optional, Tuple

from ray_geolb.aio import wait_or_timeout
from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.hold_queue import HoldQueue
from ray_geolb.policy.region import RegionDecision
from ray_geolb.policy.region.queue_rule import GO, REFUSE, QueueRule

from .config import IngressConfig
from .errors import GeoHTTPError

__all__ = ["AdmissionQueue"]

#: re-decide period of a waiting request that is not the head (it cannot take a local replica)
BEHIND_HEAD_POLL_S = 0.25


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
        #: one entry per waiting request: its wake-up event -> its prompt tokens
        self.queue: HoldQueue[asyncio.Event, int] = HoldQueue(tokens_of=int)
        self.counts = {"held": 0, "queue_full": 0, "wait_timeout": 0}

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

    # ------------------------------------------------------------ wake-ups
    def kick(self) -> None:
        """Re-decide the head now (a local slot freed)."""
        head = self.queue.head()
        if head is not None:
            head[0].set()

    def kick_all(self) -> None:
        """Re-decide every waiting request now (the peer table changed)."""
        for ev in self.queue:
            ev.set()

    # ------------------------------------------------------------ admission
    async def admit(self, rreq: RouteRequest, max_wait_s: Optional[float] = None) -> RegionDecision:
        """A non-hold decision for ``rreq``, after waiting FCFS in this queue if needed. Raises
        :class:`GeoHTTPError` 429 (queue full) or 503 (no capacity within the wait limit)."""
        cfg = self.cfg
        max_wait = self.rule.wait_limit(max_wait_s)
        t0 = self._clock()
        d = self._decide(rreq, None)
        v = self.rule.admit(d, len(self.queue))
        if v.action == GO:
            return d  # behind waiting requests only a forward (or a reject) goes straight on
        reason = v.reason
        if v.action == REFUSE:
            self.counts["queue_full"] += 1
            raise GeoHTTPError(429, f"region {self.region}: {len(self.queue)} requests already waiting "
                                    f"(max_queue={cfg.max_queue}); retry later",
                               type_="queue_full", retry_after_s=cfg.retry_after_s, region=self.region)
        self.counts["held"] += 1
        ev = asyncio.Event()
        self.queue.append(ev, rreq.prompt_tokens)
        try:
            return await self._wait(ev, rreq, t0 + max_wait, max_wait, reason)
        finally:  # done, timed out or cancelled: leave the queue, and wake the next head
            was_head = self.queue.is_head(ev)
            self.queue.remove(ev)
            if was_head:
                self.kick()

    async def _wait(self, ev: asyncio.Event, rreq: RouteRequest, deadline: float, max_wait: float,
                    reason: str) -> RegionDecision:
        """Wait in the queue until a decision other than *hold* is allowed (local only at the head)."""
        cfg = self.cfg
        while True:
            remaining = deadline - self._clock()
            if self.rule.timed_out(remaining).action == REFUSE:
                self.counts["wait_timeout"] += 1
                raise GeoHTTPError(503, f"region {self.region}: no replica became available within "
                                        f"{max_wait:g} s ({reason})",
                                   type_="wait_timeout", retry_after_s=cfg.retry_after_s, region=self.region)
            ev.clear()
            # the head re-decides every poll_s; the others when the peer table changes (kick_all)
            timeout = cfg.poll_s if self.queue.is_head(ev) else max(cfg.poll_s, BEHIND_HEAD_POLL_S)
            await wait_or_timeout(ev, min(remaining, timeout))
            d = self._decide(rreq, ev)
            v = self.rule.again(d, self.queue.is_head(ev))
            if v.action == GO:
                return d
            if v.reason is not None:  # a hold's reason; a local decision not at the head keeps the last
                reason = v.reason
