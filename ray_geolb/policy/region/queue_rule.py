"""The region LB's queue rule, written once: :class:`QueueRule` says *go*, *wait* or *refuse*.

A request the region layer cannot send anywhere now waits in its LB's FCFS queue
(:class:`~ray_geolb.policy.hold_queue.HoldQueue`). The rule, for both drivers -- the Serve ingress's
``AdmissionQueue`` (``serve/ingress/admission.py``, wall-clock, HTTP 429 / 503) and the simulator's LB
(``sim/region_lb.py``, virtual time, the client retries):

* FCFS for *local* capacity only: a newcomer behind waiting requests, and a waiting request that is not
  the head, may go to a peer (or be rejected) but may not take a local slot; only the head goes local.
  With ``forward_past_queue`` off the queue is strictly FCFS: a newcomer behind waiting requests joins
  without a decision, and only the head is decided again.
* a request that must wait while ``max_queue`` already wait is refused (``queue_full``);
* a request that waited its wait limit is refused (``wait_timeout``);
* a request with a deadline whose expected finish -- the expected wait for the queue ahead of it plus
  its expected service time -- falls after the time it has left is refused at once
  (``deadline_unreachable``, :meth:`QueueRule.deadline`): it would only expire in the queue. Only the
  Serve ingress measures those expectations; the simulator's LB does not call it (its clients have no
  deadlines).

The region layer's decision (``RegionRouter.decide``, with the requests ahead of this one) is the input;
what the driver does with a verdict -- send, queue, answer 429 / 503 -- is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from .router import RegionDecision

__all__ = ["DEADLINE_UNREACHABLE", "GO", "QUEUED_BEHIND", "QUEUE_FULL", "REFUSE", "WAIT", "WAIT_TIMEOUT", "QueueRule",
           "Verdict"]

GO, WAIT, REFUSE = "go", "wait", "refuse"
#: why a request waits when the region layer would have served it locally but others wait before it
QUEUED_BEHIND = "queued behind earlier requests"
#: why a request is refused: the queue is full (Serve: 429), it waited too long (Serve: 503)
QUEUE_FULL, WAIT_TIMEOUT = "queue_full", "wait_timeout"
#: why a request with a deadline is refused before it waits it out (Serve: 429 with Retry-After)
DEADLINE_UNREACHABLE = "deadline_unreachable"


class Verdict(NamedTuple):
    """``action``: ``go`` (carry out the decision: local, forward or reject), ``wait`` or ``refuse``.
    ``reason``: go -- the decision's; wait -- why it waits (None from :meth:`QueueRule.again` when the
    decision was not *hold*: the request keeps its last reason); refuse -- ``queue_full`` / ``wait_timeout``."""

    action: str
    reason: Optional[str]


@dataclass(frozen=True)
class QueueRule:
    """The queue rule of one LB (see the module docstring). ``max_queue`` / ``max_wait_s`` None: unbounded
    (the simulator's central LBs, which are not the ingress)."""

    max_queue: Optional[int] = None
    max_wait_s: Optional[float] = None
    forward_past_queue: bool = True

    def decides_newcomer(self, waiting: int) -> bool:
        """Is a newcomer decided on arrival, with ``waiting`` requests already in the queue? (Else it joins
        without a decision: :meth:`admit` with ``None``.)"""
        return not waiting or self.forward_past_queue

    def admit(self, d: Optional[RegionDecision], waiting: int) -> Verdict:
        """A newcomer, behind ``waiting`` requests, whose decision is ``d`` (None: not decided)."""
        if d is not None and d.kind != "hold" and (not waiting or d.kind != "local"):
            return Verdict(GO, d.reason)  # behind waiting requests only a forward (or a reject) goes on
        if self.max_queue is not None and waiting >= self.max_queue:
            return Verdict(REFUSE, QUEUE_FULL)
        return Verdict(WAIT, d.reason if d is not None and d.kind == "hold" else QUEUED_BEHIND)

    def again(self, d: RegionDecision, is_head: bool) -> Verdict:
        """A waiting request decided again: ``d``; only the head may take a local slot."""
        if d.kind != "hold" and (is_head or d.kind != "local"):
            return Verdict(GO, d.reason)
        return Verdict(WAIT, d.reason if d.kind == "hold" else None)

    def wait_limit(self, client_max_wait_s: Optional[float] = None) -> Optional[float]:
        """How long a request may wait here: ``max_wait_s``, or the client's own limit if shorter (None:
        no limit)."""
        if self.max_wait_s is None or client_max_wait_s is None:
            return self.max_wait_s if self.max_wait_s is not None else client_max_wait_s
        return min(self.max_wait_s, client_max_wait_s)

    @staticmethod
    def deadline(remaining_s: float, expected_wait_s: Optional[float], expected_service_s: Optional[float]) -> Verdict:
        """A request with ``remaining_s`` left before its deadline, expected to wait ``expected_wait_s``
        for the queue ahead and then take ``expected_service_s`` (None: not known, counted as 0): refuse
        (``deadline_unreachable``) when it is expected to finish after its deadline, else wait. With
        neither known nothing is refused here (``timed_out`` still ends a wait that runs out)."""
        if expected_wait_s is None and expected_service_s is None:
            return Verdict(WAIT, None)
        need = (expected_wait_s or 0.0) + (expected_service_s or 0.0)
        return Verdict(REFUSE, DEADLINE_UNREACHABLE) if need > remaining_s else Verdict(WAIT, None)

    @staticmethod
    def timed_out(remaining_s: float) -> Verdict:
        """``remaining_s`` of the wait limit left: refuse (``wait_timeout``) when nothing is left, else wait."""
        return Verdict(REFUSE, WAIT_TIMEOUT) if remaining_s <= 0 else Verdict(WAIT, None)
