"""The ingress's responses: what the region's ``LLMServer`` produced, as the client may see it.

* :func:`completion_response`: the completion JSON, or (``stream: true``) its SSE events sent by an
  :class:`OwnedStreamingResponse`, which closes its source (returning the request's slot) however the
  response ends;
* :func:`response_headers`: ``x-geolb-region/route/origin`` always, the per-request routing and cache
  figures only for the operator (``debug``);
* :func:`private_payload` / :func:`private_sse`: the per-request cache figure removed unless ``debug``;
* :func:`sse_events`: an error after the headers went out ends the stream as a client can parse it.
"""

from __future__ import annotations

import json
from typing import AsyncIterator, Callable, Optional

from fastapi.responses import JSONResponse, Response, StreamingResponse

from .errors import HEADER_PREFIX, as_http_error
from .model_client import error_in

__all__ = ["OwnedStreamingResponse", "completion_response", "private_payload", "private_sse", "response_headers",
           "sse_events"]


def response_headers(meta: dict, debug: bool = False) -> dict:
    h = {
        HEADER_PREFIX + "region": str(meta.get("region")),
        HEADER_PREFIX + "route": str(meta.get("route")),
        HEADER_PREFIX + "origin": str(meta.get("origin") or ""),
    }
    if debug:  # per-request routing and cache figures: operators only (see IngressConfig.debug)
        h[HEADER_PREFIX + "replica"] = str(meta.get("replica") or "")
        h[HEADER_PREFIX + "ingress"] = str(meta.get("ingress") or "")  # the ingress replica that placed it
        h[HEADER_PREFIX + "reason"] = str(meta.get("reason") or "")
        h[HEADER_PREFIX + "matched-prefix"] = str(int(meta.get("matched_prefix") or 0))
        h[HEADER_PREFIX + "queue-wait-ms"] = f"{float(meta.get('queue_wait_ms') or 0.0):.1f}"
    return h


def private_payload(payload: dict, debug: bool = False) -> dict:
    """A response JSON as a client may see it: without the per-request cache figure
    (``usage.prompt_tokens_details``, i.e. cached tokens) unless ``debug``."""
    u = payload.get("usage")
    if not debug and isinstance(u, dict) and "prompt_tokens_details" in u:
        payload = dict(payload, usage={k: v for k, v in u.items() if k != "prompt_tokens_details"})
    return payload


def private_sse(chunk: str, debug: bool = False) -> str:
    """An SSE event as a client may see it (:func:`private_payload` on its JSON; only the usage
    event carries the cache figure, so the others are passed on without parsing)."""
    if debug or '"prompt_tokens_details"' not in chunk or not chunk.startswith("data: {"):
        return chunk
    return "data: " + json.dumps(private_payload(json.loads(chunk[len("data: "):]), False)) + "\n\n"


class OwnedStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its token source (returning the request's slot) however the
    response ends: finished, failed, or cancelled because the client went away -- also when the
    body iterator was never started."""

    def __init__(self, content, source, **kw):
        super().__init__(content, **kw)
        self._source = source

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._source.aclose()


def completion_response(meta: dict, out, stream: bool, debug: bool, *, region: str,
                        on_error: Optional[Callable[[], None]] = None) -> Response:
    """The response to a served request: the server's completion JSON, or (``stream``) its SSE events
    from the stream ``out``, which the response closes however it ends. A stream that fails names
    the region that served it (``meta["region"]``: a peer for a forwarded request; else ``region``)
    and calls ``on_error``."""
    headers = response_headers(meta, debug)
    if not stream:
        return JSONResponse(private_payload(out, debug), headers=headers)
    served_by = str(meta.get("region") or region)
    return OwnedStreamingResponse(sse_events(out, debug, served_by, on_error), out, media_type="text/event-stream",
                                  headers=headers)


async def sse_events(stream: AsyncIterator, debug: bool, region: str, on_error: Optional[Callable[[], None]] = None):
    """The server's SSE events (each item a string or a batch of them). An error after the headers
    went out -- the replica failed or died mid-stream -- ends the stream the way a client can parse:
    an OpenAI-style ``{"error": ...}`` event (the error's type and message; an unexpected exception
    is named by its type only, its text may quote the prompt), then a chunk whose choice has
    ``finish_reason: "error"``, then ``[DONE]``. The stream always ends with ``[DONE]``. ``region`` is
    the region that served the stream (the one that failed); ``on_error`` is called once per failure."""
    done = False

    def failed():
        if on_error is not None:
            try:
                on_error()
            except Exception:  # noqa: BLE001 - counting never breaks the stream
                pass

    try:
        async for item in stream:
            for ev in (item if isinstance(item, list) else (item,)):
                if not isinstance(ev, str):  # an ErrorResponse mid-stream
                    err = error_in(ev, region)
                    failed()
                    yield _error_event(err.message if err is not None else "the server reported an error",
                                       "stream_error")
                    yield _FINISH_ERROR
                    continue
                done = ev.startswith("data: [DONE]")
                yield private_sse(ev, debug)
    except Exception as e:  # noqa: BLE001 - headers are sent: report the error in-band
        err = as_http_error(e, region)
        done = False
        failed()
        yield _error_event(err.message if err is not None else f"region {region}: the stream failed "
                                                               f"({type(e).__name__})", "stream_error")
        yield _FINISH_ERROR
    if not done:
        yield "data: [DONE]\n\n"


#: the last chunk of a stream that failed: its one choice finished with reason "error"
_FINISH_ERROR = "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [
    {"index": 0, "delta": {}, "finish_reason": "error"}]}) + "\n\n"


def _error_event(message: str, type_: str) -> str:
    return "data: " + json.dumps({"error": {"message": message, "type": type_}}) + "\n\n"
