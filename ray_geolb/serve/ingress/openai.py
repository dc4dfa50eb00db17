"""The OpenAI surface of the ingress: request parsing and response payloads.

* Requests (``/v1/chat/completions``, ``/v1/completions``): :func:`read_body` bounds the body before
  reading it (413 on ``Content-Length``, or a running cap when there is none); :func:`validate_body`
  checks the JSON body (bad JSON or past a parse limit, a missing/empty ``messages`` or ``prompt``, a
  bad or disagreeing ``max_tokens`` / ``max_completion_tokens``, ``n`` other than 1, a bad ``stream``,
  a lone surrogate in any string, an unknown ``allowed_regions`` entry -> HTTP 400 naming the problem;
  an unknown ``model`` -> 404; every message surrogate-safe and bounded, :func:`client_value`), and
  :func:`parse_request` adds what the headers say (``x-allowed-regions``, ``x-geolb-max-wait-s``,
  ``x-geolb-timeout-s``, ``x-session-id``) to build the :class:`~.context.RequestContext`. ``allowed_regions`` (header
  ``x-allowed-regions: us,eu`` or body field; both: their intersection) is enforced on both layers:
  a request may wait or be refused (403), never be sent outside its set.
* Headers: internal ``x-geolb-*`` request headers are dropped (:func:`client_headers`). Every response
  carries ``x-geolb-region`` (where it was served), ``x-geolb-route`` (``local`` | ``forwarded``) and
  ``x-geolb-origin`` (the region that received it). Per-request routing and cache figures --
  ``x-geolb-replica``, ``x-geolb-reason``, ``x-geolb-matched-prefix`` (bytes of canonical text),
  ``x-geolb-queue-wait-ms`` and ``usage.prompt_tokens_details.cached_tokens`` -- are for the operator
  only (``IngressConfig.debug`` or the admin token in ``x-geolb-admin-token``, :func:`is_admin`): a
  matched length tells a client what *other* clients sent.
* Responses (``responses.py``, re-exported here): what the region's ``LLMServer`` produced -- its
  completion JSON, or its SSE events (``stream: true``) sent by an :class:`OwnedStreamingResponse`,
  which closes its source however the response ends -- with the operator-only figures removed
  (:func:`private_payload`).
"""

from __future__ import annotations

import hmac
import json
import math
import re
import time
from typing import Any, Dict, FrozenSet, Mapping, Optional

from fastapi.responses import Response

from ray_geolb.policy.canonical import PromptFormatError, canonical_text

from .context import RequestContext
from .deadlines import deadline_from_arrival
from .errors import HEADER_PREFIX, GeoHTTPError
from .responses import (  # the response half, re-exported
    OwnedStreamingResponse,
    completion_response,
    private_payload,
    private_sse,
    response_headers,
    sse_events,
)

__all__ = [
    "ADMIN_TOKEN_HEADER", "CLIENT_GEOLB_HEADERS", "HEADER_PREFIX", "PUBLIC_RESPONSE_HEADERS", "OwnedStreamingResponse",
    "PromptBody", "client_headers", "completion_response", "forbidden", "is_admin", "parse_allowed",
    "parse_request", "private_payload", "private_sse", "response_headers", "sse_events", "validate_body",
    "TOKEN_FIELDS", "client_value", "output_tokens", "parse_json", "read_body",
]

ADMIN_TOKEN_HEADER = "x-geolb-admin-token"
#: the only ``x-geolb-*`` request headers a client may send; every other one (hop count, origin, ...)
#: is internal and dropped by :func:`client_headers` before anything reads or passes headers on
CLIENT_GEOLB_HEADERS = frozenset({"x-geolb-max-wait-s", "x-geolb-timeout-s"})
#: response headers every client gets; the rest only with ``debug`` or the admin token
PUBLIC_RESPONSE_HEADERS = ("region", "route", "origin")


# ---------------------------------------------------------------------------------------------- requests
class PromptBody(dict):
    """The OpenAI body as sent to the model deployment: a dict that also answers ``.messages`` /
    ``.prompt`` (Ray's PrefixCacheAffinityRouter looks for those attributes; canonical_text and
    GeoPrefixRouter read it as a dict)."""

    def __getattr__(self, name):
        if name in ("messages", "prompt") and name in self:
            return self[name]
        raise AttributeError(name)

    def __reduce__(self):
        return (PromptBody, (dict(self),))


def parse_allowed(value: Any, where: str) -> Optional[FrozenSet[str]]:
    """``allowed_regions`` (a list, or a comma-separated string) as a set; None when absent."""
    if value is None:
        return None
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise GeoHTTPError(400, f"{where} must be a list of region names or a comma-separated string",
                           param="allowed_regions")
    regions = []
    for v in items:
        if not isinstance(v, str) or not v.strip():
            raise GeoHTTPError(400, f"{where} contains an empty or non-string region name: {v!r}",
                               param="allowed_regions")
        regions.append(v.strip())
    if not regions:
        raise GeoHTTPError(400, f"{where} is empty (omit it to allow every region)", param="allowed_regions")
    return frozenset(regions)


def json_depth(obj, limit: int) -> int:
    """Nesting depth of a parsed JSON value, counted without recursion and without looking deeper than
    ``limit + 1`` (so a hostile body costs no more than its size)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


#: the output-length fields of an OpenAI body: both are checked, and must agree when both are sent
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


def client_value(v: Any, limit: int = 60) -> str:
    """A value a client sent, as an error message may quote it: ``repr`` (lone surrogates and control
    characters escaped), at most ``limit`` characters; never raises (an int too long for ``repr`` is
    named by its size)."""
    try:
        r = repr(v)
    except ValueError:  # an int past Python's digit limit
        return f"<an integer of about {int(v.bit_length() * 0.30103)} digits>"
    return r if len(r) <= limit else r[:limit] + f"...<{len(r)} characters>"


def output_tokens(body: dict, kind: str, max_tokens_limit: int, default_max_tokens: int) -> int:
    """The one rule for output length (see :func:`validate_body`): returns the effective limit and
    writes it into ``body`` -- ``max_tokens`` and, for chat, ``max_completion_tokens`` (vLLM's chat
    request prefers that field); ``/v1/completions`` has only ``max_tokens``, so the other is dropped."""
    given = {}
    for f in TOKEN_FIELDS:
        v = body.get(f)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise GeoHTTPError(400, f"'{f}' must be a positive integer, got {client_value(v)}", param=f)
        if v > max_tokens_limit:
            raise GeoHTTPError(400, f"'{f}' {v} exceeds the limit {max_tokens_limit}", param=f)
        given[f] = v
    if len(set(given.values())) > 1:
        raise GeoHTTPError(400, f"'max_tokens' ({given['max_tokens']}) and 'max_completion_tokens' "
                                f"({given['max_completion_tokens']}) disagree; send one of them, or the same value "
                                f"in both", param="max_completion_tokens")
    mt = next(iter(given.values())) if given else default_max_tokens
    body["max_tokens"] = mt
    if kind == "chat":
        body["max_completion_tokens"] = mt
    else:
        body.pop("max_completion_tokens", None)
    for f in ("n", "best_of"):  # sequences decoded per request: one (priced as one)
        v = body.get(f)
        if v is None or (type(v) is int and v == 1):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise GeoHTTPError(400, f"'{f}' must be 1, got {client_value(v)}", param=f)
        raise GeoHTTPError(400, f"'{f}' {v} is not supported: this endpoint decodes one sequence per request "
                                f"(send {v} requests instead)", param=f)
    return mt


def field_without_unicode(body: dict) -> Optional[str]:
    """The first top-level field of ``body`` holding a string (key or value, at any depth) that UTF-8
    cannot encode -- a lone surrogate, which JSON's ``\\uD800`` escape lets a client send -- or None.
    One pass over the body, without recursion."""
    for key, value in body.items():
        stack = [key, value]
        while stack:
            o = stack.pop()
            if isinstance(o, str):
                try:
                    o.encode("utf-8")
                except UnicodeEncodeError:
                    return key
            elif isinstance(o, dict):
                stack.extend(o.keys())
                stack.extend(o.values())
            elif isinstance(o, list):
                stack.extend(o)
    return None


def parse_json(raw: bytes):
    """``json.loads`` with every parse failure -- bad syntax or encoding, Python's 4,300-digit limit on
    integers, nesting past the recursion limit -- as a 400 (never a 500, never a logged traceback)."""
    try:
        return json.loads(raw or b"")
    except json.JSONDecodeError as e:
        raise GeoHTTPError(400, f"request body is not valid JSON: {e}") from None
    except UnicodeDecodeError:
        raise GeoHTTPError(400, "request body is not valid UTF-8 JSON") from None
    except RecursionError:
        raise GeoHTTPError(400, "request body nests JSON too deeply") from None
    except ValueError as e:  # int('9' * 5000): "Exceeds the limit (4300 digits) for integer string conversion"
        what = "an integer with more than 4300 digits" if "digits" in str(e) else "a value it cannot parse"
        raise GeoHTTPError(400, f"request body holds {what}") from None


def validate_body(raw: bytes, kind: str, model_name: str, max_tokens_limit: int, default_max_tokens: int,
                  limits=None):
    """Parse and check an OpenAI body. Returns ``(PromptBody, text, stream, max_tokens, allowed)``.
    ``limits`` (an ``IngressConfig``; None: no size, depth or context bounds) gives
    ``max_body_bytes`` (413), ``max_json_depth`` and ``max_model_len`` (400 context_length_exceeded).

    Output length, one rule: ``max_tokens`` and ``max_completion_tokens`` are each checked (a positive
    integer, at most ``max_tokens_limit``); a body that sends both with *different* values is refused
    (400, ``param: max_completion_tokens``); the effective value -- the one sent, else
    ``default_max_tokens`` -- is written back to both fields (chat; ``/v1/completions``: ``max_tokens``),
    so the context check, the router's price (``RouteRequest.output_tokens_hint``) and the engine all
    see the same number. ``n`` (and ``best_of``) must be 1 or absent: one sequence per request, priced
    as one. Every failure is a :class:`GeoHTTPError` (400/404/413) whatever bytes were sent."""
    if limits is not None and len(raw or b"") > limits.max_body_bytes:
        raise GeoHTTPError(413, f"request body is {len(raw)} bytes; the limit is {limits.max_body_bytes}",
                           type_="request_too_large")
    body = parse_json(raw)
    if limits is not None and json_depth(body, limits.max_json_depth) > limits.max_json_depth:
        raise GeoHTTPError(400, f"request body nests JSON deeper than {limits.max_json_depth} levels")
    if not isinstance(body, dict):
        raise GeoHTTPError(400, f"request body must be a JSON object, got {type(body).__name__}")
    field = "messages" if kind == "chat" else "prompt"
    if field not in body or body[field] is None:
        raise GeoHTTPError(400, f"missing required field '{field}'", param=field)
    if kind == "chat":
        if not isinstance(body["messages"], list) or not body["messages"]:
            raise GeoHTTPError(400, "'messages' must be a non-empty list of chat messages", param="messages")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise GeoHTTPError(400, f"'model' must be a string, got {type(model).__name__}", param="model")
    if model is not None and model != model_name:
        raise GeoHTTPError(404, f"The model {client_value(model)} does not exist; this endpoint serves "
                                f"'{model_name}'", type_="model_not_found", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GeoHTTPError(400, f"'stream' must be a boolean, got {client_value(stream)}", param="stream")
    mt = output_tokens(body, kind, max_tokens_limit, default_max_tokens)
    allowed = parse_allowed(body.pop("allowed_regions", None), "body field 'allowed_regions'")
    bad = field_without_unicode(body)
    if bad is not None:  # a lone surrogate (JSON "\ud800") anywhere: no engine can tokenize or echo it
        raise GeoHTTPError(400, f"invalid {client_value(bad)}: not valid Unicode text (a lone surrogate)",
                           param=bad)
    try:
        text = canonical_text(body)
    except PromptFormatError as e:
        raise GeoHTTPError(400, f"invalid '{field}': {e}", param=field) from None
    except RecursionError:
        raise GeoHTTPError(400, f"invalid '{field}': nested too deeply", param=field) from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate (JSON "\ud800"): no engine can tokenize it
        raise GeoHTTPError(400, f"invalid '{field}': not valid Unicode text ({e.reason} at character "
                                f"{e.start})", param=field) from None
    if limits is not None and limits.max_model_len is not None:
        floor = len(text) / limits.max_chars_per_token  # no tokenizer packs more chars into a token
        if floor + mt > limits.max_model_len:
            raise GeoHTTPError(400, f"this request needs at least {math.ceil(floor)} prompt tokens + {mt} output "
                                    f"tokens, more than the model's context length {limits.max_model_len}",
                               type_="context_length_exceeded", param=field)
    return PromptBody(body), text, stream, mt, allowed


_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def client_headers(headers) -> Dict[str, str]:
    """The request headers a client may set, lower-cased: internal ``x-geolb-*`` headers (all but
    :data:`CLIENT_GEOLB_HEADERS`) and the admin token are dropped, so nothing a client forges is read
    as routing state or passed on to a replica or peer."""
    out = {}
    for k, v in headers.items():
        k = k.lower()
        if k.startswith(HEADER_PREFIX) and k not in CLIENT_GEOLB_HEADERS:
            continue
        out[k] = v
    return out


def parse_request(raw: bytes, headers_in: Mapping[str, str], kind: str, cfg, *, origin: str,
                  request_id: str, arrived: Optional[float] = None) -> RequestContext:
    """The context of a client's request: its body (:func:`validate_body`) and its headers
    (``headers_in`` = :func:`client_headers`); ``cfg`` is the ``IngressConfig``. Raises
    :class:`GeoHTTPError` (400/404) naming the problem. The deadline runs from ``arrived`` (the
    ``time.monotonic()`` at which the ingress's HTTP handler was entered, before the body was read;
    None: now), less ``deadlines.DEADLINE_RESERVE_S`` for the time the ingress cannot see (``deadlines.py``)."""
    body, text, stream, max_tokens, allowed = validate_body(
        raw, kind, cfg.model_name, cfg.max_tokens_limit, cfg.default_max_tokens, limits=cfg)
    hdr = headers_in.get("x-allowed-regions")
    if hdr is not None:
        h_allowed = parse_allowed(hdr, "header x-allowed-regions")
        allowed = h_allowed if allowed is None else (allowed & h_allowed)
        if not allowed:
            raise GeoHTTPError(400, "header x-allowed-regions and body allowed_regions have no region "
                                    "in common", param="allowed_regions")
    max_wait_s = _header_seconds(headers_in, "x-geolb-max-wait-s", minimum_excluded=False)
    timeout_s = _header_seconds(headers_in, "x-geolb-timeout-s", minimum_excluded=True)
    budget = cfg.request_timeout_s if timeout_s is None else min(cfg.request_timeout_s, timeout_s)
    session = headers_in.get("x-session-id") or (body.get("user") if isinstance(body.get("user"), str) else None)
    tenant = None
    if cfg.tenant_header:
        tenant = headers_in.get(cfg.tenant_header.lower())
        if tenant is not None and not _TENANT.match(tenant):
            raise GeoHTTPError(400, f"header {cfg.tenant_header} must be 1-64 characters of letters, digits, "
                                    f"'.', '_' or '-'", param=cfg.tenant_header)
    return RequestContext(body=body, text=text, stream=stream, max_tokens=max_tokens, allowed=allowed, hops=0,
                          origin=origin, session=session, request_id=request_id, max_wait_s=max_wait_s,
                          kind=kind, tenant=tenant,
                          deadline=deadline_from_arrival(time.monotonic() if arrived is None else arrived, budget))


async def read_body(request, limit: int) -> bytes:
    """The request body, bounded *before* it is read: a ``Content-Length`` above ``limit`` is refused
    at once (413, nothing read), a malformed one is a 400, and a body without one (chunked) is read
    with a running count and refused (413) as soon as it passes ``limit`` -- at most ``limit`` bytes
    plus one chunk are ever held. (Ray Serve 2.60's proxy and replica still move the body's messages
    in the background; the hard transfer bound is a front proxy's body limit.)"""
    cl = request.headers.get("content-length")
    if cl is not None:
        cl = cl.strip()
        if not cl.isdigit() or len(cl) > 19:
            raise GeoHTTPError(400, f"header Content-Length must be a byte count, got {client_value(cl, 40)}",
                               param="content-length")
        if int(cl) > limit:
            raise GeoHTTPError(413, f"request body is {int(cl)} bytes (Content-Length); the limit is {limit}",
                               type_="request_too_large")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise GeoHTTPError(413, f"request body is over {limit} bytes (read {n} of it before refusing; "
                                    f"no Content-Length); the limit is {limit}", type_="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _header_seconds(headers_in: Mapping[str, str], name: str, *, minimum_excluded: bool) -> Optional[float]:
    """A header holding seconds (a finite number >= 0, or > 0), or None when absent; else 400."""
    raw = headers_in.get(name)
    if raw is None:
        return None
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and (v > 0 if minimum_excluded else v >= 0)):
        bound = "> 0" if minimum_excluded else ">= 0"
        raise GeoHTTPError(400, f"header {name} must be a number {bound}, got {raw[:40]!r}", param=name)
    return v


# ---------------------------------------------------------------------------------------------- the operator rule
def is_admin(headers: Mapping[str, str], debug: bool, token: Optional[str]) -> bool:
    """True if the request may see debug figures: ``debug`` is on, or it carries the admin token."""
    if debug:
        return True
    got = headers.get(ADMIN_TOKEN_HEADER)
    return bool(token) and got is not None and hmac.compare_digest(got.encode(), token.encode())


def forbidden(what: str) -> Response:
    return GeoHTTPError(403, f"{what} needs the admin token (header {ADMIN_TOKEN_HEADER}) or the "
                             "ingress option debug=True", type_="forbidden").response()
