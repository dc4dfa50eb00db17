"""Deadlines the client can hold the ingress to: :class:`DeadlineEstimates` (when a request can be
expected to finish) and :func:`deadline_from_arrival` (the deadline a request is given).

**Where the clock starts.** A request's deadline should run from its arrival at Ray's HTTP proxy, but
Ray Serve 2.60 hands the ingress replica no arrival time, so it runs from the moment the ingress's
HTTP handler is entered (before the body is read). Checked in the installed Ray (paths under
``ray/serve/``):

* ``_private/common.py`` ``RequestMetadata`` -- what travels with every call -- holds ids, route,
  app, multiplexed model, session, streaming flag, HTTP method, client address, protocol, gRPC and
  tracing context, serialization options and a slot token: no timestamp;
* ``context.py`` ``_RequestContext`` (``serve.context._get_serve_request_context()``, what the replica
  can read) holds route, request ids, app, multiplexed model, session, client address and the trace
  context: no timestamp;
* ``_private/proxy.py`` ``proxy_request`` takes ``start_time = time.time()`` but keeps it in a local
  variable for its access log and latency metric only;
* the ASGI scope the replica gets (``_private/proxy_request_response.py``
  ``serialized_replica_arg``: ``StreamingHTTPRequest(asgi_scope=self.scope)``) is uvicorn's scope
  with ``path`` / ``root_path`` rewritten: no time in it either;
* the router's ``PendingRequest.created_at`` is taken in the *proxy's* process and never sent on;
  a trace span (``tracing_context``) carries ids, not times.

So the time a request spends in the proxy before the handler (uvicorn, the proxy's router, the
replica's task queue; on a loaded 2-core machine over a second for the last of a 300-request burst)
and the way back out are invisible here. The ingress keeps :data:`DEADLINE_RESERVE_S` of every
deadline for them (at most :data:`RESERVE_SHARE_MAX` of it): its own deadline is that much earlier
than the client's, so the client gets a typed answer -- the response, a 504 ``deadline_exceeded`` or
an early 429 -- by its deadline (``benchmarks/bench_deadlines.py`` measures it).

**Refusing early.** A request waiting for a local slot is expected to wait ``(ahead + 1 - free) /
drain rate`` -- ``ahead`` requests wait before it at this LB (the admission queue and the router's
queue), ``free`` local slots are free now, the drain rate is how fast local slots free up -- and then
to be served in the measured service time (non-streamed: the whole response; streamed: the first
token). When that is after its deadline, the region layer's queue rule
(:meth:`~ray_geolb.policy.region.queue_rule.QueueRule.deadline`) refuses it at once: 429
``deadline_unreachable`` with ``Retry-After`` (when it could be expected to fit), checked on arrival
and each time a waiting request is decided again -- a request never waits out its deadline in the
queue when the queue ahead already says it cannot make it.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

from ray_geolb.policy.region.estimators import DrainRate

__all__ = ["DEADLINE_RESERVE_S", "DeadlineEstimates", "RESERVE_SHARE_MAX", "deadline_from_arrival"]

#: what the ingress keeps of every deadline for the time it cannot see (module docstring): on a loaded
#: 2-core machine the last of a 300-request burst entered the handler over a second after it was sent
DEADLINE_RESERVE_S = 1.0
#: the most of a deadline the ingress reserves for the time it cannot see (the rest is its own)
RESERVE_SHARE_MAX = 0.25
#: the longest ``Retry-After`` an early refusal names
RETRY_AFTER_MAX_S = 60.0


def reserve_for(budget_s: float, reserve_s: float = DEADLINE_RESERVE_S) -> float:
    """What the ingress keeps of a ``budget_s`` deadline for the time it cannot see."""
    if math.isinf(budget_s):
        return 0.0
    return max(0.0, min(reserve_s, budget_s * RESERVE_SHARE_MAX))


def deadline_from_arrival(arrived: float, budget_s: float, reserve_s: float = DEADLINE_RESERVE_S) -> float:
    """The ingress's deadline of a request whose handler was entered at ``arrived`` (monotonic) with the
    client's ``budget_s``: ``arrived + budget_s - reserve`` (see the module docstring)."""
    return arrived + budget_s - reserve_for(budget_s, reserve_s)


class DeadlineEstimates:
    """What one ingress measures of its local capacity to price a deadline: how fast local slots free
    up (:class:`DrainRate` over ``window_s``) and how long a local call takes once it has its slot
    (an EWMA, one per kind: ``"complete"`` -- the whole non-streamed response; ``"stream"`` -- the first
    token). Calls held now (:attr:`inflight`) over the service time bound the drain rate from below
    while the window still holds a quieter past (a burst right after an idle spell)."""

    def __init__(self, alpha: float = 0.2, window_s: float = 10.0, min_samples: int = 4):
        self.alpha = alpha
        self.drain = DrainRate(window_s=window_s, min_samples=min_samples)
        self.service: Dict[str, float] = {}
        self.inflight = 0

    # ------------------------------------------------------------ feeds
    def started(self) -> None:
        """A local call took its slot."""
        self.inflight += 1

    def finished(self, now: float) -> None:
        """A local call gave its slot back (done, failed or cancelled)."""
        self.inflight = max(0, self.inflight - 1)
        self.drain.observe(now)

    def served(self, kind: str, seconds: float) -> None:
        """A local call of ``kind`` (``"complete"`` / ``"stream"``) answered ``seconds`` after it took its slot."""
        if not (seconds >= 0.0 and math.isfinite(seconds)):
            return
        old = self.service.get(kind)
        self.service[kind] = seconds if old is None else old + self.alpha * (seconds - old)

    # ------------------------------------------------------------ reads
    def service_s(self, stream: bool) -> Optional[float]:
        """Expected service time of a request (None: none measured yet)."""
        return self.service.get("stream" if stream else "complete")

    def rate(self, now: float) -> Optional[float]:
        """Local slots freeing per second (None: unknown)."""
        r = self.drain.rate(now)
        svc = self.service.get("complete") or self.service.get("stream")
        busy = self.inflight / svc if svc and self.inflight else None
        known = [x for x in (r, busy) if x]
        return max(known) if known else None

    def wait_s(self, ahead: int, free: int, now: float) -> Optional[float]:
        """Expected wait for a local slot with ``ahead`` requests before it and ``free`` slots free now
        (0 when a free slot is left for it; None: the drain rate is unknown)."""
        need = max(0, ahead) + 1 - max(0, free)
        if need <= 0:
            return 0.0
        rate = self.rate(now)
        return None if not rate else need / rate

    @staticmethod
    def retry_after_s(expected_s: float, remaining_s: float, floor_s: float) -> float:
        """The ``Retry-After`` of a request refused because it needs ``expected_s`` with ``remaining_s``
        left: about when the queue ahead should have drained that much (at least ``floor_s``)."""
        return round(min(RETRY_AFTER_MAX_S, max(floor_s, expected_s - max(0.0, remaining_s))), 2)
