"""The hand-overs a peer sent this ingress replica, by id: :class:`HandOverLedger`; and the crash points
a chaos drill arms on it: :class:`CrashPoints`.

Every forward and every steal carries a fresh ``handover_id`` (``forward.py`` mints it). The peer records
the id *before any work* (:meth:`HandOverLedger.accept`), ties the request's model call to it (the call's
``CallTicket`` is named after the request, so the engine's own count of the ids it ran names it too) and
keeps the record's state -- ``running``, then ``answered`` or ``failed`` -- until it ages out of a bounded
window. A hand-over whose id it has seen is refused (409 ``duplicate_handover``) before any work, so a
request re-sent under the same id (a retry on some layer below) is never run twice here.

What an origin does when a hand-over fails after the call was made is in ``forward.py``: it never runs
the request again. The guarantee, and why the origin does not ask the peer instead (a dead replica's
record dies with it), is in ``docs/design.md`` section 3.

:class:`CrashPoints` (chaos drills, armed through the ingress's ``arm_crash`` handle method only, never
HTTP): the process exits at a named point on the hand-over path, so a test kills a peer *while* a
hand-over is in flight by placing the kill, not by timing it:

* ``handover_accepted`` -- the peer recorded the hand-over, before its model call;
* ``served_for_peer`` -- the peer's model call answered (non-streamed: the whole response; streamed: the
  first token), before the answer goes back to the origin.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
from typing import Dict, Iterator, Optional

from .errors import GeoHTTPError

logger = logging.getLogger("ray.serve")

__all__ = ["CRASH_POINTS", "CrashPoints", "HANDOVER_ID_MAX_CHARS", "HandOverLedger"]

#: the longest hand-over id taken (ids are 32 hex characters; anything longer is malformed)
HANDOVER_ID_MAX_CHARS = 64
#: where a drill can place a crash (see the module docstring)
CRASH_POINTS = ("handover_accepted", "served_for_peer")


class HandOverLedger:
    """The hand-overs this ingress replica accepted, most recent ``keep`` of them (see the module
    docstring). ``counts``: ``accepted``, ``duplicates`` (refused, seen before), ``without_id`` (an
    origin that sent none: served, not recorded)."""

    def __init__(self, region: str, keep: int = 10_000):
        self.region = region
        self.keep = int(keep)
        self._state: "collections.OrderedDict[str, str]" = collections.OrderedDict()
        self.counts: Dict[str, int] = {"accepted": 0, "duplicates": 0, "without_id": 0}

    def status(self, handover_id: str) -> Optional[str]:
        """``running`` / ``answered`` / ``failed``, or None: not seen here (or aged out)."""
        return self._state.get(handover_id)

    def running(self) -> int:
        """Hand-overs accepted here and not answered yet (0 when idle)."""
        return sum(1 for s in self._state.values() if s == "running")

    @contextlib.contextmanager
    def accept(self, handover_id, origin: str) -> Iterator[None]:
        """Record ``handover_id`` for the block's work; refuse it (409 ``duplicate_handover``) if seen."""
        if handover_id is None:
            self.counts["without_id"] += 1
            yield
            return
        if not isinstance(handover_id, str) or not 0 < len(handover_id) <= HANDOVER_ID_MAX_CHARS:
            raise GeoHTTPError(400, f"handover_id must be a string of 1..{HANDOVER_ID_MAX_CHARS} characters",
                               param="handover_id", region=self.region)
        if handover_id in self._state:
            self.counts["duplicates"] += 1
            raise GeoHTTPError(409, f"region {self.region} already took hand-over {handover_id} from region "
                                    f"{origin}; it is not run twice", type_="duplicate_handover", region=self.region)
        self._state[handover_id] = "running"
        self.counts["accepted"] += 1
        while len(self._state) > self.keep:
            self._state.popitem(last=False)
        state = "failed"
        try:
            yield
            state = "answered"
        finally:
            if handover_id in self._state:
                self._state[handover_id] = state


class CrashPoints:
    """Crash points armed by a chaos drill (see the module docstring). Disarmed unless :meth:`arm`."""

    def __init__(self):
        self._armed: Dict[str, int] = {}

    def arm(self, point: Optional[str], after: int = 1) -> Dict[str, int]:
        """Exit the process the ``after``-th time ``point`` is reached from now (None: disarm all)."""
        if point is None:
            self._armed.clear()
            return {}
        if point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {point!r}; points: {list(CRASH_POINTS)}")
        if isinstance(after, bool) or not isinstance(after, int) or after < 1:
            raise ValueError(f"after must be an integer >= 1, got {after!r}")
        self._armed[point] = after
        return dict(self._armed)

    def reached(self, point: str) -> None:
        left = self._armed.get(point)
        if left is None:
            return
        if left > 1:
            self._armed[point] = left - 1
            return
        logger.warning("chaos drill: crash point %s reached; this process exits now", point)
        os._exit(1)
