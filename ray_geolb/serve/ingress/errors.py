"""The ingress's errors: :class:`GeoHTTPError` (an error with an HTTP status, raised anywhere on the
request path and answered as an OpenAI-style JSON error) and the mapping of a peer's or router's
error to it."""

from __future__ import annotations

import math
from typing import Optional

from fastapi.responses import JSONResponse

from ray_geolb.serve.errors import RouterError

__all__ = ["HEADER_PREFIX", "GeoHTTPError", "ForwardFailed", "as_http_error", "error_cause", "safe_text"]

#: the prefix of the ingress's own HTTP headers (``x-geolb-region``, ``x-geolb-route``, ...)
HEADER_PREFIX = "x-geolb-"


#: the longest error message a client is sent (a message may quote what the client sent)
MAX_MESSAGE_CHARS = 2000


def safe_text(text, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as an error body can carry it whatever the client sent: lone surrogates (JSON
    ``"\\ud800"``), which UTF-8 cannot encode, become ``\\udXXX`` escapes, and it is cut to ``limit``
    characters."""
    text = str(text)
    if len(text) > limit:
        text = text[:limit] + "..."
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class GeoHTTPError(Exception):
    """An error with an HTTP status; picklable, so a peer ingress can raise it to the origin."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, retry_after_s: Optional[float] = None, region: Optional[str] = None):
        message = safe_text(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.type = type_
        self.param = None if param is None else safe_text(param, 200)
        self.retry_after_s = retry_after_s
        self.region = region

    def __reduce__(self):
        return (type(self), (self.status, self.message, self.type, self.param, self.retry_after_s, self.region))

    def response(self, extra_headers: Optional[dict] = None) -> JSONResponse:
        """The JSON error response (``{"error": {...}}``), with ``Retry-After`` and ``x-geolb-region``
        when known."""
        headers = dict(extra_headers or {})
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        if self.region:
            headers[HEADER_PREFIX + "region"] = self.region
        err = {"message": self.message, "type": self.type, "param": self.param, "code": self.status}
        return JSONResponse({"error": err}, status_code=self.status, headers=headers)


class ForwardFailed(Exception):
    """Nothing of the request reached the peer ingress (the origin marks it unreachable and decides
    again). A call that failed after it may have reached the peer is never this (``forward.py``)."""


def error_cause(e: BaseException) -> BaseException:
    """The user exception inside a Ray wrapper (RayTaskError.cause), else ``e``."""
    seen = 0
    while seen < 5 and getattr(e, "cause", None) is not None and isinstance(e.cause, BaseException):
        e = e.cause
        seen += 1
    return e


def as_http_error(e: BaseException, region: str) -> Optional[GeoHTTPError]:
    """``e`` as the HTTP error to answer (a peer's GeoHTTPError, or the model router's queue-full /
    wait-timeout error), or None for any other error."""
    c = error_cause(e)
    if isinstance(c, GeoHTTPError):
        return c
    if isinstance(c, RouterError):
        kind = "queue_full" if type(c).__name__ == "RouterQueueFull" else "wait_timeout"
        return GeoHTTPError(getattr(c, "http_status", 503), f"region {c.region or region}: {c.message}",
                            type_=f"router_{kind}", retry_after_s=c.retry_after_s, region=c.region or region)
    return None
