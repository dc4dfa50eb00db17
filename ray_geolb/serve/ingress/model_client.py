"""The region's model deployment, spoken to as Ray Serve LLM's ``LLMServer``: :class:`ModelClient`.

The ingress sends a request to its region's ``LLMServer`` deployment (vLLM's ``GeoVLLMServer`` on
GPUs, ``EmulatedLLMServer`` on CPU: the same server code, only the engine differs) the way Ray's own
``OpenAiIngress`` does: ``handle.options(stream=True).chat.remote(ChatCompletionRequest, None)`` (or
``completions`` with a ``CompletionRequest``). ``LLMServer``'s methods are async generators, so the
call always streams:

* ``stream: true`` -- batches of SSE strings (``List[str]`` of ``data: {...}\\n\\n``, ending with
  ``data: [DONE]``), passed through to the client unchanged (apart from the privacy rule);
* ``stream: false`` -- one ``ChatCompletionResponse`` / ``CompletionResponse``, returned as its JSON;
* an error the engine reports (e.g. prompt + max_tokens over the model's length) -- an
  ``ErrorResponse`` (alone, or first in a batch), turned into :class:`GeoHTTPError` with its status.

The GeoPrefixRouter on that handle reads the prompt from the request object's ``messages`` /
``prompt``, as Ray's prefix-aware router does. No client headers are passed on (``raw_request_info``
is None): a forwarded request has none, and the internal ones must not reach a replica.
"""

from __future__ import annotations

from typing import Any, Optional

from .context import RequestContext
from .errors import GeoHTTPError

__all__ = ["ModelClient", "error_in"]


def _protocol():
    from ray_geolb.serve.llm_server import llm_protocol

    return llm_protocol()


def error_in(item: Any, region: str) -> Optional[GeoHTTPError]:
    """The :class:`GeoHTTPError` for an ``ErrorResponse`` the server sent (alone or first in a batch)."""
    first = item[0] if isinstance(item, list) and item else item
    err = getattr(first, "error", None)
    if err is None or not hasattr(first, "model_dump"):
        return None
    code = int(getattr(err, "code", None) or 500)
    kind = str(getattr(err, "type", None) or "server_error")
    return GeoHTTPError(code, str(getattr(err, "message", "") or kind), type_=kind, region=region)


class ModelClient:
    """Calls the region's ``LLMServer`` deployment (see the module docstring)."""

    def __init__(self, handle: Any, region: str):
        self.handle = handle
        self.region = region

    @staticmethod
    def preload() -> None:
        """Import Ray Serve LLM's protocol classes now (vLLM's import takes seconds): call it while the
        replica starts, not on its event loop while it serves (probes and heartbeats would stall)."""
        _protocol()

    def _request(self, ctx: RequestContext, call_id: Optional[str] = None):
        m = _protocol()
        cls = m.ChatCompletionRequest if ctx.kind == "chat" else m.CompletionRequest
        try:
            req = cls.model_validate(dict(ctx.body))
        except Exception as e:  # pydantic's ValidationError names the field
            raise GeoHTTPError(400, f"invalid {ctx.kind} request: {e}") from None
        if call_id is not None:  # the ingress's id for this call (LocalSlot.call_id), never the client's
            req.request_id = call_id
        return req

    def stream(self, ctx: RequestContext, call_id: Optional[str] = None):
        """The server's response stream (a Ray streaming response); the caller owns and closes it.
        ``call_id`` (the slot's ``CallTicket``) becomes the request object's ``request_id``: the router
        of this process reads the ingress's RouteRequest from it and writes its decision on it; the
        replica gets the plain id, and vLLM names its engine request after it."""
        method = "chat" if ctx.kind == "chat" else "completions"
        return getattr(self.handle.options(stream=True), method).remote(self._request(ctx, call_id), None)

    async def complete(self, ctx: RequestContext, call_id: Optional[str] = None) -> dict:
        """A non-streamed request's response JSON (raises the server's error as :class:`GeoHTTPError`)."""
        gen = self.stream(ctx, call_id)
        try:
            res = await gen.__anext__()
        finally:
            cancel = getattr(gen, "cancel", None)
            if cancel is not None:
                try:
                    cancel()  # one item only: let the replica stop at once
                except Exception:  # noqa: BLE001 - already finished
                    pass
        err = error_in(res, self.region)
        if err is not None:
            raise err
        return res.model_dump(mode="json", exclude_none=True) if hasattr(res, "model_dump") else dict(res)
