"""Typed errors the GeoPrefixRouter delivers to the caller of ``handle.remote(...)``.

The router runs in the caller's process (the process holding the DeploymentHandle), so these
exceptions are raised out of ``DeploymentResponse.result()`` / ``await response`` unchanged.
They must stay picklable (a caller may be a Serve replica that re-raises them to its own caller).
"""

from __future__ import annotations

from typing import Optional

__all__ = ["RouterError", "RouterQueueFull", "RouterWaitTimeout"]


class RouterError(RuntimeError):
    """Base of the router's typed errors. ``retry_after_s``: a hint for the client (HTTP Retry-After)."""

    http_status = 503

    def __init__(self, message: str, retry_after_s: float = 1.0, region: Optional[str] = None,
                 queue_len: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.retry_after_s = float(retry_after_s)
        self.region = region
        self.queue_len = queue_len

    def __reduce__(self):
        return (type(self), (self.message, self.retry_after_s, self.region, self.queue_len))


class RouterQueueFull(RouterError):
    """The router's queue already holds ``queue_bound`` requests (or ``queue_bound_tokens`` prompt
    tokens): the request was refused on arrival -- 429, as a full ingress queue answers."""

    http_status = 429


class RouterWaitTimeout(RouterError):
    """The request waited ``wait_limit_s`` in the router without any replica becoming available."""

    http_status = 503
