"""Region ingress: one region's load balancer (SkyLB layer 1) as an OpenAI-compatible Ray Serve app.

One Serve application per region = this ingress + the model deployment(s), pinned to the region's
nodes (``label_selector`` on ``ray.io/availability-region``; see ``app.py``). For each request:

1. **Parse** the OpenAI body (``/v1/chat/completions``, ``/v1/completions``; SSE when
   ``stream: true``). Bad JSON, a missing/empty ``messages`` or ``prompt``, a bad ``max_tokens`` or an
   unknown ``allowed_regions`` entry -> HTTP 400 naming the problem; an unknown ``model`` -> 404.
2. **Decide** with :class:`ray_geolb.policy.region.router.RegionRouter` (the same policy core and the
   same :func:`canonical_text` as the simulator): *local* while this region has an available replica
   (read in process from the snapshot the GeoPrefixRouter of the model deployment publishes -- no
   actor call; "available" until that router exists), else *forward* to the best available peer
   region's ingress (regional snapshot: longest prefix already forwarded there, ties by measured
   RTT), else *hold*.
3. **Hold**: an FCFS queue at this ingress, bounded (``max_queue`` -> 429) and time-limited
   (``max_wait_s`` -> 503), both with ``Retry-After`` and a JSON error body. Only the head of the
   queue is re-decided (when a local request completes, the peer table changes, or every ``poll_s``).
4. **Forward** (at most one hop): a forwarded request arrives at the peer's ``forwarded`` /
   ``forwarded_stream`` with ``hops=1`` and is never forwarded again -- if the peer is full it
   waits in the peer's queue. The forward is recorded in this region's snapshot (mirrored to the
   registry in the background). Inter-region latency is injected around the hop (``latency.py``).

``allowed_regions`` (header ``x-allowed-regions: us,eu`` or body field) is enforced on both layers:
a request may wait or be refused (403), never be sent outside its set. Per-request routing and cache
figures (headers, cached tokens) and ``/v1/geolb/state`` are for the operator only (``debug`` or the
admin token): see ``openai.py``.

Each part is a class that owns its state (a module imports only the modules above it in this list):

* ``config.py`` -- :class:`IngressConfig`, :class:`RegistryOptions`, ``INGRESS_DEPLOYMENT``;
* ``errors.py`` -- :class:`GeoHTTPError` (an error with an HTTP status, picklable across regions);
* ``context.py`` -- :class:`RequestContext`: one request on its way (body, text, stream, max_tokens,
  allowed regions, hops, origin, session, request id, time waited, wait cap);
* ``openai.py`` -- OpenAI parsing (:func:`validate_body`, :func:`parse_request`) and the header rules
  (:func:`client_headers`, the debug/admin rule);
* ``responses.py`` -- the response payloads (JSON, SSE), as a client may see them;
* ``streams.py`` -- :class:`TokenStream`, a streamed response that owns what its request holds;
* ``local_view.py`` -- :class:`LocalView`: the region layer's local layer over the snapshot the
  in-process GeoPrefixRouter publishes (availability, the router's queue, its load), owner of the
  local slots (:class:`LocalSlot`);
* ``admission.py`` -- :class:`AdmissionQueue`: the FCFS hold queue (a ``policy.hold_queue.HoldQueue``);
* ``peers.py`` -- :class:`PeerMesh`: peer handles, RTT probes, heartbeats, the snapshot mirror;
* ``local_call.py`` -- the local call with its one retry before the first token;
  ``forward.py`` -- the one-hop forward, streamed or not; ``steal.py`` -- cross-region work stealing
  (offers, picks, hand-overs; off unless ``two_layer.steal.enabled``); ``telemetry.py`` -- counters,
  metrics, the typed errors they count, the state payload (four parts of :class:`RequestPath`);
* ``request_path.py`` -- :class:`RequestPath`: owns the RegionRouter and drives the parts above
  (decide, admit, run locally or forward);
* ``deployment.py`` -- :class:`RegionIngress`, the FastAPI ``@serve.ingress`` deployment: HTTP
  endpoints and the handle methods peers call.

Capacity is owned, not caught: the local slot a request takes is a :class:`LocalSlot` and a streamed
response is a :class:`TokenStream` closed in the ``finally`` of whatever consumes it (the HTTP
response, a peer's relay), so a client leaving at any point -- before its first token, while
streaming, while held here or in the router -- returns everything (``asyncio.CancelledError`` is not
an ``Exception``; no ``except Exception`` owns accounting). ``RegionIngress.accounting`` reads it all
back.

Background tasks (never on the request path, :class:`PeerMesh`): the ``RegistryClient``
heartbeat/peer-table loop, and RTT probes of every peer ingress (``RegionRouter.observe_rtt``: the
region layer's one RTT estimate, reported to the registry, read back as ``PeerState.rtt_s``).
"""

from .admission import AdmissionQueue
from .config import INGRESS_DEPLOYMENT, IngressConfig, RegistryOptions
from .context import RequestContext
from .deployment import RegionIngress, app
from .errors import HEADER_PREFIX, GeoHTTPError
from .local_view import LocalSlot, LocalView
from .openai import (
    ADMIN_TOKEN_HEADER,
    CLIENT_GEOLB_HEADERS,
    PUBLIC_RESPONSE_HEADERS,
    PromptBody,
    client_headers,
    parse_request,
    validate_body,
)
from .peers import PeerMesh
from .request_path import RequestPath
from .streams import TokenStream

__all__ = [
    "ADMIN_TOKEN_HEADER", "CLIENT_GEOLB_HEADERS", "HEADER_PREFIX", "INGRESS_DEPLOYMENT", "PUBLIC_RESPONSE_HEADERS",
    "AdmissionQueue", "GeoHTTPError", "IngressConfig", "LocalSlot", "LocalView", "PeerMesh", "PromptBody",
    "RegionIngress", "RegistryOptions", "RequestContext", "RequestPath", "TokenStream", "app", "client_headers",
    "parse_request", "validate_body",
]
