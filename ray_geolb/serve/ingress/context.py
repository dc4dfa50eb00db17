"""One request on its way through the ingress: :class:`RequestContext`.

Built once -- from the HTTP body and headers at the origin (``openai.parse_request``), or from what
the origin sent along with a forwarded request (:meth:`RequestContext.from_wire`) -- and passed
whole down the request path (admission, local run, forward) instead of a long parameter list.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Optional

from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.canonical import reply_span

__all__ = ["RequestContext", "new_request_id", "serve_request_id"]


@dataclass(frozen=True)
class RequestContext:
    """What the ingress knows about one request (immutable; the decision and the time waited so far
    on this attempt travel beside it)."""

    #: the OpenAI body as sent to the model deployment (an ``openai.PromptBody``)
    body: Dict[str, Any]
    #: its canonical text (``policy.canonical.canonical_text``): what the prefix policies match
    text: str
    stream: bool
    max_tokens: int
    #: the regions it may be served in (None: any)
    allowed: Optional[FrozenSet[str]]
    #: 0 at the origin; a forwarded request arrives with 1 and is never forwarded again
    hops: int
    #: the region that received it from the client
    origin: str
    #: the session key (``x-session-id`` header, else the body's ``user``)
    session: Optional[str]
    request_id: str
    #: time already spent waiting in the origin's queue (forwarded requests)
    waited_ms: float = 0.0
    #: the client's cap on waiting (``x-geolb-max-wait-s``); None: ``IngressConfig.max_wait_s``
    max_wait_s: Optional[float] = None
    #: ``"chat"`` (``/v1/chat/completions``) or ``"completion"`` (``/v1/completions``)
    kind: str = "chat"
    #: the tenant, from the header the operator names (``IngressConfig.tenant_header``); its regions
    #: (``two_layer.tenant_regions``) narrow ``allowed`` at every hop
    tenant: Optional[str] = None
    #: when the response must have started, on this process's monotonic clock (None: no deadline). Set
    #: at the origin from ``IngressConfig.request_timeout_s`` (or the client's shorter
    #: ``x-geolb-timeout-s``) and carried to a peer as the time left (:meth:`wire`), so a retry or a
    #: forward never restarts it. Non-streamed: the whole response; streamed: its first token.
    deadline: Optional[float] = None

    def remaining_s(self) -> float:
        """Seconds left before the deadline (inf without one; <= 0: passed)."""
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def route_request(self) -> RouteRequest:
        """The policy core's view of this request; its price's output length (``output_tokens_hint``)
        is the effective ``max_tokens`` (one sequence: ``n`` is 1, ``openai.output_tokens``)."""
        return RouteRequest(request_id=self.request_id, text=self.text, session_key=self.session,
                            region=self.origin, allowed_regions=self.allowed, hops=self.hops, tenant=self.tenant,
                            output_tokens_hint=self.max_tokens, reply_span=reply_span(self.body, self.text))

    def wire(self, wait_ms: float, decision: Any) -> dict:
        """What the origin sends a peer with the body when it forwards this request (``fmeta``)."""
        return {"hops": self.hops + 1, "max_wait_s": self.max_wait_s, "origin": self.origin,
                "allowed_regions": sorted(self.allowed) if self.allowed is not None else None,
                "session": self.session, "stream": self.stream, "max_tokens": self.max_tokens,
                "request_id": self.request_id, "waited_ms": wait_ms, "kind": self.kind,
                "forward_reason": decision.reason, "forward_matched": decision.matched, "tenant": self.tenant,
                "deadline_in_s": None if self.deadline is None else max(0.0, self.remaining_s())}

    @classmethod
    def from_wire(cls, body: Dict[str, Any], text: str, fmeta: dict, *, stream: bool,
                  max_timeout_s: float = math.inf) -> "RequestContext":
        """The context of a request a peer forwarded here (``hops >= 1``: it is never forwarded again).
        Its deadline: the time the origin had left when it sent it, at most ``max_timeout_s``."""
        left = fmeta.get("deadline_in_s")
        if isinstance(left, bool) or not isinstance(left, (int, float)) or not left >= 0:
            left = math.inf  # an origin without deadlines
        budget = min(float(left), max_timeout_s)
        allowed = frozenset(fmeta["allowed_regions"]) if fmeta.get("allowed_regions") else None
        return cls(body=body, text=text, stream=stream, max_tokens=int(fmeta["max_tokens"]), allowed=allowed,
                   hops=max(1, int(fmeta.get("hops", 1))), origin=fmeta.get("origin", "?"),
                   session=fmeta.get("session"), request_id=fmeta.get("request_id") or new_request_id(),
                   waited_ms=float(fmeta.get("waited_ms", 0.0)), max_wait_s=fmeta.get("max_wait_s"),
                   kind=fmeta.get("kind") or ("chat" if "messages" in body else "completion"),
                   tenant=fmeta.get("tenant") if isinstance(fmeta.get("tenant"), str) else None,
                   deadline=None if math.isinf(budget) else time.monotonic() + budget)


def serve_request_id() -> Optional[str]:
    """Serve's request id of the call being handled now (what a handle call made from here carries
    as ``metadata.request_id``), or None outside a Serve request."""
    try:
        from ray.serve.context import _get_serve_request_context

        return _get_serve_request_context().request_id or None
    except Exception:  # noqa: BLE001 - not in Serve
        return None


def new_request_id() -> str:
    """Serve's request id of the call being handled (the client's ``x-request-id`` or Serve's own),
    else a fresh one."""
    try:
        from ray.serve.context import _get_serve_request_context

        rid = _get_serve_request_context().request_id
        if rid:
            return rid
    except Exception:  # pragma: no cover
        pass
    return uuid.uuid4().hex


def wait_bound(seconds: float) -> Optional[float]:
    """An ``asyncio.wait_for`` timeout for ``seconds`` left: None for no bound (inf), else at least 0."""
    return None if math.isinf(seconds) else max(0.0, seconds)
