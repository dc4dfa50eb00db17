"""Region ingress: one region's load balancer (SkyLB layer 1) as an OpenAI-compatible Ray Serve app.

One Serve application per region = this ingress + the model deployment(s), pinned to the region's
nodes (``label_selector`` on ``ray.io/availability-region``; see ``app.py``). For each request:

1. **Parse** the OpenAI body (``/v1/chat/completions``, ``/v1/completions``; SSE when
   ``stream: true``). Bad JSON, a missing/empty ``messages`` or ``prompt``, a bad ``max_tokens`` or an
   unknown ``allowed_regions`` entry -> HTTP 400 naming the problem; an unknown ``model`` -> 404.
2. **Decide** with :class:`ray_geolb.policy.region.router.RegionRouter` (the same policy core and the
   same :func:`canonical_text` as the simulator): *local* while this region has an available replica
   (read in process from the GeoPrefixRouter of the model deployment -- no actor call; "available"
   until that router exists), else *forward* to the best available peer region's ingress (regional
   snapshot: longest prefix already forwarded there, ties by measured RTT), else *hold*.
3. **Hold**: an FCFS queue at this ingress, bounded (``max_queue`` -> 429) and time-limited
   (``max_wait_s`` -> 503), both with ``Retry-After`` and a JSON error body. Only the head of the
   queue is re-decided (when a local request completes, the peer table changes, or every ``poll_s``).
4. **Forward** (at most one hop): a forwarded request arrives at the peer's :meth:`forwarded` /
   :meth:`forwarded_stream` with ``hops=1`` and is never forwarded again -- if the peer is full it
   waits in the peer's queue. The forward is recorded in this region's snapshot (mirrored to the
   registry in the background). Inter-region latency is injected around the hop (``latency.py``).

``allowed_regions`` (header ``x-allowed-regions: us,eu`` or body field) is enforced on both layers:
a request may wait or be refused (403), never be sent outside its set.

Every response carries ``x-geolb-region`` (where it was served), ``x-geolb-route`` (``local`` |
``forwarded``) and ``x-geolb-origin`` (the region that received it). Per-request routing and cache
figures -- ``x-geolb-replica``, ``x-geolb-reason``, ``x-geolb-matched-prefix`` (bytes of canonical
text), ``x-geolb-queue-wait-ms`` and ``usage.prompt_tokens_details.cached_tokens`` -- are for the
operator only (``IngressConfig.debug`` or the admin token in ``x-geolb-admin-token``): a matched
length tells a client what *other* clients sent. ``/v1/geolb/state`` likewise; ``/healthz`` answers
everyone with its status and region only. Internal ``x-geolb-*`` request headers are dropped
(:func:`client_headers`).

Capacity is owned, not caught: the local slot a request takes is a :class:`_LocalSlot` and a
streamed response is a :class:`TokenStream` closed in the ``finally`` of whatever consumes it (the
HTTP response, a peer's relay), so a client leaving at any point -- before its first token, while
streaming, while held here or in the router -- returns everything (``asyncio.CancelledError`` is not
an ``Exception``; no ``except Exception`` owns accounting). :meth:`RegionIngressImpl.accounting`
reads it all back.

Background tasks (never on the request path): the :class:`RegistryClient` heartbeat/peer-table loop,
and RTT probes of every peer ingress (``RegionRouter.observe_rtt``: the region layer's one RTT estimate,
reported to the registry, read back as ``PeerState.rtt_s``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import time
import uuid
from collections import deque
from typing import Any, AsyncIterator, Dict, FrozenSet, List, Literal, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

import ray_geolb.serve as _serve_pkg
from ray_geolb.policy.base import Decision, RouteRequest
from ray_geolb.policy.canonical import PromptFormatError, canonical_text
from ray_geolb.policy.region import CostSelector, PeerState, RegionDecision, RegionRouter, TwoLayerConfig
from ray_geolb.serve.errors import RouterError
from ray_geolb.serve.latency import LatencyInjector
from ray_geolb.serve.registry import DEFAULT_NAME, DEFAULT_NAMESPACE, RegistryClient, peer_states_from_table

logger = logging.getLogger("ray.serve")

__all__ = ["INGRESS_DEPLOYMENT", "IngressConfig", "GeoHTTPError", "PromptBody", "RegionIngress", "app"]

INGRESS_DEPLOYMENT = "RegionIngress"
HEADER_PREFIX = "x-geolb-"
ADMIN_TOKEN_HEADER = "x-geolb-admin-token"
#: the only ``x-geolb-*`` request headers a client may send; every other one (hop count, origin, ...)
#: is internal and dropped by :func:`client_headers` before anything reads or passes headers on
CLIENT_GEOLB_HEADERS = frozenset({"x-geolb-max-wait-s"})
#: response headers every client gets; the rest only with ``debug`` or the admin token
PUBLIC_RESPONSE_HEADERS = ("region", "route", "origin")


# ---------------------------------------------------------------------------------------------- config
class RegistryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    period_s: float = Field(0.25, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    config: Optional[dict] = None  # RegistryState kwargs if this ingress creates the actor


class IngressConfig(BaseModel):
    """Configuration of one region's ingress (JSON-able; built by ``app.build_region_apps``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(..., min_length=1)
    model_name: str = "geolb-emulated"
    #: peer region -> its Serve application name (its ingress is ``INGRESS_DEPLOYMENT`` there)
    peers: Dict[str, str] = Field(default_factory=dict)
    #: TwoLayerConfig fields except ``region`` (tau, remote, max_hops, peer_stale_s, snapshot, ...)
    two_layer: dict = Field(default_factory=lambda: {"peer_stale_s": 2.0})
    #: "router": read the GeoPrefixRouter's availability; "always": every request is local-available
    #: (baselines with Ray's own routers, which have no availability notion)
    local_availability: Literal["router", "always"] = "router"
    max_queue: int = Field(256, ge=0, description="requests that may wait at this ingress (more -> 429)")
    max_wait_s: float = Field(30.0, gt=0, description="longest wait at this ingress (then 503)")
    retry_after_s: float = Field(1.0, ge=0)
    poll_s: float = Field(0.02, gt=0, description="re-decide period of the head of the queue")
    registry: Optional[RegistryOptions] = RegistryOptions()
    latency: Optional[dict] = None  # LatencyInjector.from_spec; None = default table, scale 1
    rtt_probe_period_s: float = Field(1.0, gt=0)
    #: EWMA weight of the RTT probes; set, it becomes ``two_layer.cost.rtt_alpha`` (the weight of
    #: RegionRouter's one RTT estimate) unless ``two_layer.cost`` sets that itself
    rtt_ewma: float = Field(0.3, gt=0, le=1)
    snapshot_period_s: float = Field(1.0, gt=0)
    default_max_tokens: int = Field(16, ge=1)
    max_tokens_limit: int = Field(8192, ge=1)
    forward_timeout_s: float = Field(300.0, gt=0)
    #: Privacy. By default a response tells the client only where it was served (``x-geolb-region``,
    #: ``-route``, ``-origin``): no per-request cache figure (matched prefix, cached tokens, replica,
    #: reason, queue wait), which would let a client learn what *others* sent (guessing a prompt byte
    #: by byte from the matched length). ``debug=True`` adds them to every response and opens
    #: ``/v1/geolb/state`` and the detailed ``/healthz`` to anyone (local development only); a request
    #: carrying the admin token (header ``x-geolb-admin-token``) gets them without ``debug``.
    debug: bool = False
    #: the admin token; None: the environment variable ``admin_token_env`` of the ingress process
    #: (unset: no token, so the state endpoint needs ``debug``). Never shown by the state endpoint.
    admin_token: Optional[str] = Field(None, min_length=16)
    admin_token_env: str = "GEOLB_ADMIN_TOKEN"
    #: 'cost' region layer: the measured wait for a local engine slot in the cost of staying -- the
    #: policy core's ``CostSelectorConfig.stay_slot_wait`` / ``drain_window_s`` / ``drain_min_samples``
    #: (see ``policy/region/cost_selector.py``; the simulator runs the same term). None: ``two_layer.cost``'s value
    #: (``GEOPREFIX_COST`` turns it on, ``GORGO_COST`` leaves it off); a value here overrides it
    #: (``stay_slot_wait=False``: the stay cost without the slot wait).
    stay_slot_wait: Optional[bool] = None
    drain_window_s: Optional[float] = Field(None, gt=0, allow_inf_nan=False,
                                            description="window of the local drain-rate estimate")
    drain_min_samples: Optional[int] = Field(None, ge=2, description="completions the drain-rate estimate needs")

    def two_layer_config(self) -> TwoLayerConfig:
        tl = dict(self.two_layer)
        if "region" in tl and tl["region"] != self.region:
            raise ValueError(f"two_layer.region {tl['region']!r} differs from region {self.region!r}")
        tl["region"] = self.region
        over = {k: getattr(self, k) for k in _SLOT_WAIT_FIELDS if getattr(self, k) is not None}
        if over or "rtt_ewma" in self.model_fields_set:
            cost = tl.get("cost") or {}
            cost = cost.model_dump() if isinstance(cost, BaseModel) else dict(cost)
            if "rtt_ewma" in self.model_fields_set:  # the probes' EWMA is now RegionRouter's (observe_rtt)
                cost.setdefault("rtt_alpha", self.rtt_ewma)
            cost.update(over)
            tl["cost"] = cost
        return TwoLayerConfig.model_validate(tl)


_SLOT_WAIT_FIELDS = ("stay_slot_wait", "drain_window_s", "drain_min_samples")


# ---------------------------------------------------------------------------------------------- errors
class GeoHTTPError(Exception):
    """An error with an HTTP status; picklable, so a peer ingress can raise it to the origin."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, retry_after_s: Optional[float] = None, region: Optional[str] = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.type = type_
        self.param = param
        self.retry_after_s = retry_after_s
        self.region = region

    def __reduce__(self):
        return (type(self), (self.status, self.message, self.type, self.param, self.retry_after_s, self.region))

    def response(self, extra_headers: Optional[dict] = None) -> JSONResponse:
        headers = dict(extra_headers or {})
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        if self.region:
            headers[HEADER_PREFIX + "region"] = self.region
        err = {"message": self.message, "type": self.type, "param": self.param, "code": self.status}
        return JSONResponse({"error": err}, status_code=self.status, headers=headers)


def _cause(e: BaseException) -> BaseException:
    """The user exception inside a Ray wrapper (RayTaskError.cause), else ``e``."""
    seen = 0
    while seen < 5 and getattr(e, "cause", None) is not None and isinstance(e.cause, BaseException):
        e = e.cause
        seen += 1
    return e


def _as_http_error(e: BaseException, region: str) -> Optional[GeoHTTPError]:
    c = _cause(e)
    if isinstance(c, GeoHTTPError):
        return c
    if isinstance(c, RouterError):
        kind = "queue_full" if type(c).__name__ == "RouterQueueFull" else "wait_timeout"
        return GeoHTTPError(getattr(c, "http_status", 503), f"region {c.region or region}: {c.message}",
                            type_=f"router_{kind}", retry_after_s=c.retry_after_s, region=c.region or region)
    return None


# ---------------------------------------------------------------------------------------------- request body
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


def _parse_allowed(value: Any, where: str) -> Optional[FrozenSet[str]]:
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


def validate_body(raw: bytes, kind: str, model_name: str, max_tokens_limit: int, default_max_tokens: int):
    """Parse and check an OpenAI body. Returns ``(PromptBody, text, stream, max_tokens, allowed)``."""
    try:
        body = json.loads(raw or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GeoHTTPError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise GeoHTTPError(400, f"request body must be a JSON object, got {type(body).__name__}")
    field = "messages" if kind == "chat" else "prompt"
    if field not in body or body[field] is None:
        raise GeoHTTPError(400, f"missing required field '{field}'", param=field)
    if kind == "chat":
        if not isinstance(body["messages"], list) or not body["messages"]:
            raise GeoHTTPError(400, "'messages' must be a non-empty list of chat messages", param="messages")
    model = body.get("model")
    if model is not None and model != model_name:
        raise GeoHTTPError(404, f"The model '{model}' does not exist; this endpoint serves '{model_name}'",
                           type_="model_not_found", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GeoHTTPError(400, f"'stream' must be a boolean, got {stream!r}", param="stream")
    mt = body.get("max_tokens", body.get("max_completion_tokens"))
    if mt is None:
        mt = default_max_tokens
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise GeoHTTPError(400, f"'max_tokens' must be a positive integer, got {mt!r}", param="max_tokens")
    if mt > max_tokens_limit:
        raise GeoHTTPError(400, f"'max_tokens' {mt} exceeds the limit {max_tokens_limit}", param="max_tokens")
    allowed = _parse_allowed(body.pop("allowed_regions", None), "body field 'allowed_regions'")
    try:
        text = canonical_text(body)
    except PromptFormatError as e:
        raise GeoHTTPError(400, f"invalid '{field}': {e}", param=field) from None
    return PromptBody(body), text, stream, mt, allowed


# ---------------------------------------------------------------------------------------------- local view
class _LocalView:
    """The local layer a :class:`RegionRouter` sees (it implements
    :class:`~ray_geolb.policy.region.LocalLayer` explicitly): the in-process GeoPrefixRouter's policy.

    * ``choose`` -- "is a replica of this region available now?": :meth:`RegionIngressImpl.local_available`
      (the router's SP-P availability, minus requests sent locally that it has not placed yet). The
      replica itself is picked by the GeoPrefixRouter when the request reaches the model handle, so
      the view only says *whether* the policy would place it -- which is what ``policy.choose``
      returning a decision or None means in the simulator's RegionRouter.
    * Everything else the region layer reads -- the ``cost`` selector's stay cost and this region's
      heartbeat extras: ``targets``, ``tracker.stats/unseen/outstanding``, ``index``,
      ``mean_prompt_tokens``, ``region_t_p()``, ``queued_tokens(t)`` -- delegates to the live policy
      object of the model deployment's GeoPrefixRouter (no copy, no actor call), so the selector
      prices staying exactly as the simulator's RegionRouter does over its real local policy (a policy
      without a TTFT model answers None, and the selector takes its documented fallback). Until the
      router exists (it is created with the first local request) there are no targets: staying is
      not priced, and every request is local anyway.

    The policy lives on the router's event-loop thread; reads here run on the ingress's. They are
    plain attribute/dict reads; a read that races a mutation (a dict resized mid-iteration) raises,
    and :meth:`RegionIngressImpl._decide` retries the decision.
    """

    def __init__(self, ingress: "RegionIngressImpl"):
        self._ing = ingress
        self.tracker = _TrackerView(ingress)

    def policy(self):
        """The GeoPrefixRouter's policy in this process, or None."""
        if self._ing.cfg.local_availability != "router":
            return None
        r = self._ing._geo_router()
        return r.policy if r is not None else None

    # ------------------------------------------------------------ LocalLayer
    @property
    def targets(self):
        p = self.policy()
        return p.targets if p is not None else []

    @property
    def index(self):
        p = self.policy()
        return p.index if p is not None else None

    @property
    def mean_prompt_tokens(self):
        p = self.policy()
        return p.mean_prompt_tokens if p is not None else None

    def region_t_p(self):
        p = self.policy()
        return p.region_t_p() if p is not None else None

    def queued_tokens(self, target):
        p = self.policy()
        return p.queued_tokens(target) if p is not None else None

    def choose(self, req, now, candidates=None):
        n = self._ing.local_available()
        return Decision("local", 0, "local_available") if n > 0 else None

    def on_dispatch(self, req, target, now):
        pass

    # ------------------------------------------------------------ inspection only (not LocalLayer)
    # The live policy's TTFT model and pooled fit, where it has them (AttributeError otherwise, as on
    # the policy itself); the region layer reads region_t_p() instead.
    @property
    def ttft(self):
        return self._live().ttft

    @property
    def pooled_t_p(self):
        return self._live().pooled_t_p

    def _live(self):
        p = self.policy()
        if p is None:
            raise AttributeError("no local policy yet (the GeoPrefixRouter is created with the first request)")
        return p


class _TrackerView:
    """``_LocalView.tracker``: availability as the ingress counts it; per-replica load from the
    router policy's own LoadTracker."""

    def __init__(self, ingress: "RegionIngressImpl"):
        self._ing = ingress

    def _tracker(self):
        p = self._ing.router.local.policy() if hasattr(self._ing, "router") else None
        return p.tracker if p is not None else None

    @property
    def available(self):
        return range(self._ing.local_available())

    def stats(self, target):
        t = self._tracker()
        return t.stats(target) if t is not None else None

    def unseen(self, target):
        t = self._tracker()
        return t.unseen(target) if t is not None else 0

    def outstanding(self, target):
        t = self._tracker()
        return t.outstanding(target) if t is not None else 0


def _now() -> float:
    return time.monotonic()


def _request_id() -> str:
    try:
        from ray.serve.context import _get_serve_request_context

        rid = _get_serve_request_context().request_id
        if rid:
            return rid
    except Exception:  # pragma: no cover
        pass
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------------------------- core
class RegionIngressImpl:
    """Everything except HTTP (so it can be driven by the FastAPI class and by peer handle calls)."""

    async def _setup(self, model, config):
        cfg = config if isinstance(config, IngressConfig) else IngressConfig.model_validate(config or {})
        self.cfg = cfg
        self.region = cfg.region
        self._admin_token = cfg.admin_token or os.environ.get(cfg.admin_token_env) or None
        self.model = model
        self.model_app = getattr(model, "app_name", None)
        self.model_deployment = getattr(model, "deployment_name", None)
        self.latency = LatencyInjector.from_spec(cfg.latency)
        self.router = RegionRouter(cfg.two_layer_config(), _LocalView(self), clock=_now)
        for peer in cfg.peers:  # known but unheard: unavailable until a heartbeat says otherwise
            self.router.update_peer(PeerState(peer, 0, 0, float("-inf")))
        self._peer_handles: Dict[str, Any] = {}
        self._queue: deque = deque()
        self._queue_tokens: Dict[asyncio.Event, int] = {}  # prompt tokens of each waiting request
        self.decisions: Dict[str, int] = {}  # non-local region-layer decisions by kind:reason
        self._local_unrouted: set = set()
        self._snapshot_dirty = False
        self._snapshot_version = 0
        self._snapshot_sent_at = 0.0
        self._snapshot_loaded = False
        self.counters = {k: 0 for k in ("requests", "local", "forwarded_out", "forwarded_in", "held",
                                        "queue_full", "wait_timeout", "rejected", "errors", "forward_failures",
                                        "bad_requests", "decide_errors")}
        try:
            ctx = serve.get_replica_context()
            self.source = f"{self.region}/{ctx.replica_id.unique_id}"
        except Exception:
            self.source = f"{self.region}/{uuid.uuid4().hex[:8]}"
        self._tasks: List[asyncio.Task] = []
        self.registry: Optional[RegistryClient] = None
        if cfg.registry is not None:
            r = cfg.registry
            self.registry = RegistryClient(self.region, self.source, self._heartbeat, self._on_table,
                                           name=r.name, namespace=r.namespace, period_s=r.period_s,
                                           timeout_s=r.timeout_s, registry_config=r.config)
            self.registry.start()
            self._tasks.append(asyncio.get_running_loop().create_task(self._load_snapshot()))
        if cfg.peers:
            self._tasks.append(asyncio.get_running_loop().create_task(self._probe_loop()))

    # ------------------------------------------------------------ local availability
    def _geo_router(self):
        if self.model_app is None or self.model_deployment is None:
            return None
        return _serve_pkg.router_for(self.model_app, self.model_deployment)

    def local_available(self) -> int:
        """Available local replicas, minus requests sent locally that the router has not placed yet."""
        if self.cfg.local_availability == "always":
            return 1
        r = self._geo_router()
        if r is None:
            return 1  # the router is created lazily on the first request: assume available
        try:
            n = r.num_available()
            if self._local_unrouted:
                n -= sum(1 for rid in self._local_unrouted if r.decision(rid) is None)
            return max(0, n)
        except Exception:  # noqa: BLE001 - never fail a request on a view
            return 1

    def accounting(self) -> dict:
        """What requests hold at this LB right now, ingress and router (leak checks; a handle call,
        not HTTP). Idle: every count 0 (see :meth:`GeoPrefixRouter.accounting`)."""
        out = {"ingress_queue": len(self._queue), "ingress_queue_tokens": sum(self._queue_tokens.values()),
               "local_unrouted": len(self._local_unrouted), "local_available": self.local_available()}
        r = self._geo_router()
        if r is not None:
            out.update(r.accounting())
        return out

    def _lb_queue_len(self) -> int:
        q = len(self._queue)
        r = self._geo_router() if self.cfg.local_availability == "router" else None
        if r is not None:
            try:
                q += r.queue_len()
            except Exception:  # noqa: BLE001
                pass
        return q

    def _router_queued_tokens(self) -> float:
        r = self._geo_router() if self.cfg.local_availability == "router" else None
        if r is None:
            return 0.0
        try:
            return float(r.queued_tokens())
        except Exception:  # noqa: BLE001 - a view; never fail on it
            return 0.0

    def _lb_queued_tokens(self) -> float:
        """Prompt tokens waiting at this LB: this ingress's queue + the GeoPrefixRouter's queue."""
        return float(sum(self._queue_tokens.values())) + self._router_queued_tokens()

    def _set_queue_ahead(self, ev: Optional[asyncio.Event]) -> None:
        """Tell the region layer what waits at this LB *ahead of* the request being decided (its
        ``Q_lb``): the router's queue (already sent to the model handle) and the requests before it in
        this ingress's FCFS queue (``ev`` None: a newcomer, behind all of them). The simulator does the
        same with its single LB queue (nothing ahead of its head)."""
        n, tok = 0, 0.0
        for e in self._queue:
            if e is ev:
                break
            n += 1
            tok += self._queue_tokens.get(e, 0)
        r = self._geo_router() if self.cfg.local_availability == "router" else None
        if r is not None:
            try:
                n += r.queue_len()
            except Exception:  # noqa: BLE001
                pass
        self.router.set_queue(n, tok + self._router_queued_tokens())

    def _decide(self, rreq: RouteRequest, ev: Optional[asyncio.Event] = None):
        """``RegionRouter.decide`` with this LB's queue ahead set. The local policy is read live from
        the router's thread: a read racing a mutation raises (e.g. a dict resized during iteration),
        so retry; if it keeps failing, decide by local availability alone (never fail the request
        on the region layer's estimate)."""
        err = None
        for _ in range(3):
            try:
                if self.router.selector is not None:
                    self._set_queue_ahead(ev)
                d = self.router.decide(rreq, _now())
                if d.kind != "local":
                    k = f"{d.kind}:{d.reason}"
                    self.decisions[k] = self.decisions.get(k, 0) + 1
                return d
            except Exception as e:  # noqa: BLE001
                err = e
        self.counters["decide_errors"] += 1
        logger.warning("region %s: decide failed 3 times (%r); deciding by local availability", self.region, err)
        if self.local_available() > 0:
            return RegionDecision("local", None, 0, "local_available")
        return RegionDecision("hold", reason="decide_error")

    def heartbeat_extra(self) -> dict:
        """This region's cost-selector inputs for its peers, as the simulator's ``RegionRouter.heartbeat``
        computes them over the live local policy: ``replicas``, ``inflight`` (this router's requests in
        flight), ``t_p_s`` (the pooled t_p, floor applied) and ``queued_tokens`` (this LB's queue).
        Empty until the GeoPrefixRouter exists (nothing to report)."""
        if self.router.local.policy() is None:
            return {}
        sel = self.router.selector or CostSelector()
        for _ in range(3):
            try:
                return sel.heartbeat_extra(self.router, self._lb_queued_tokens())
            except Exception:  # noqa: BLE001 - a racing read: try again, else send none this time
                continue
        return {}

    # ------------------------------------------------------------ registry
    def _heartbeat(self) -> dict:
        hb = {"region": self.region, "source": self.source, "available_replicas": self.local_available(),
              "queue_len": self._lb_queue_len(), "rtts": self.router.measured_rtts()}
        extra = self.heartbeat_extra()
        if extra:
            hb["extra"] = extra
        now = _now()
        if self._snapshot_dirty and now - self._snapshot_sent_at >= self.cfg.snapshot_period_s:
            self._snapshot_version += 1
            hb["snapshot"] = self.router.snapshot.snapshot()
            hb["snapshot_version"] = self._snapshot_version
            self._snapshot_sent_at = now
            self._snapshot_dirty = False
        return hb

    def _on_table(self, table: dict, received_at: float) -> None:
        for ps in peer_states_from_table(table, received_at, self.region):
            if ps.region in self.cfg.peers:
                self.router.update_peer(ps)
        if self.region not in table.get("snapshot_versions", {}) and self.router.snapshot.num_nodes:
            self._snapshot_dirty = True  # the registry restarted: send our snapshot again
        self._kick_all()

    async def _load_snapshot(self) -> None:
        """A restarted ingress reloads its regional snapshot from the registry (once)."""
        for _ in range(40):
            snap = await self.registry.fetch_snapshot(self.region)
            if snap is not None:
                if self.router.snapshot.num_nodes == 0:
                    try:
                        self.router.snapshot.load_snapshot(snap)
                        self._snapshot_loaded = True
                    except (ValueError, KeyError, TypeError) as e:
                        logger.warning("ignoring registry snapshot for %s: %s", self.region, e)
                return
            if self.registry.connected:
                return  # reachable, nothing stored
            await asyncio.sleep(0.5)

    async def _probe_loop(self) -> None:
        while True:
            for peer in list(self.cfg.peers):
                try:
                    if peer not in self._peer_handles:  # warm-up call: the first one pays handle setup
                        await asyncio.wait_for(self._peer(peer).ping.remote(), 5.0)
                    t0 = _now()
                    await self.latency.hop(self.region, peer)
                    await asyncio.wait_for(self._peer(peer).ping.remote(), 5.0)
                    await self.latency.hop(peer, self.region)
                    # the region layer's one RTT estimate (was: an EWMA here, written into PeerState.rtt_s)
                    self.router.observe_rtt(peer, _now() - t0)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - a peer that does not answer simply has no RTT
                    pass
            await asyncio.sleep(self.cfg.rtt_probe_period_s)

    def _peer(self, region: str):
        h = self._peer_handles.get(region)
        if h is None:
            h = serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name=self.cfg.peers[region],
                                            _check_exists=False)
            self._peer_handles[region] = h
        return h

    # ------------------------------------------------------------ admission (FCFS hold queue)
    def _local_done(self) -> None:
        """A local request left its replica (done, failed or cancelled): a slot freed. Feeds the
        region layer's drain-rate estimate (``RegionRouter.on_local_complete``, as the simulator does)."""
        self.router.on_local_complete(_now())
        self._kick()

    def local_drain_rate(self, now: Optional[float] = None) -> Optional[float]:
        """Local requests finishing per second, as the 'cost' selector measures them
        (``CostSelectorConfig.drain_window_s`` / ``drain_min_samples``; None: unknown, or no 'cost'
        selector). While the region is saturated this is the rate at which its engine slots free up."""
        sel = self.router.selector
        return None if sel is None else sel.drain.rate(_now() if now is None else now)

    def slot_wait_s(self, ahead: int, now: Optional[float] = None) -> float:
        """Expected wait for a local engine slot of a request with ``ahead`` requests before it at
        this LB: ``(ahead + 1) / drain rate`` (0 if unknown) -- the term the selector adds (times q̂)
        to staying when ``stay_slot_wait`` is on and no local replica is available."""
        rate = self.local_drain_rate(now)
        return 0.0 if not rate else (max(0, ahead) + 1) / rate

    def _kick(self) -> None:
        if self._queue:
            self._queue[0].set()

    def _kick_all(self) -> None:
        for ev in self._queue:
            ev.set()

    async def _admit(self, rreq: RouteRequest, max_wait_s: Optional[float] = None):
        """A non-hold decision, after waiting FCFS in this ingress's queue if needed."""
        cfg = self.cfg
        max_wait = cfg.max_wait_s if max_wait_s is None else min(cfg.max_wait_s, max_wait_s)
        t0 = _now()
        reason = "queued behind earlier requests"
        d = self._decide(rreq)
        # Strict FCFS for local capacity: behind waiting requests a newcomer may not take a local
        # replica -- but it may be forwarded (a peer's capacity is not what the queue waits for).
        if d.kind != "hold" and (not self._queue or d.kind != "local"):
            return d
        if d.kind == "hold":
            reason = d.reason
        if len(self._queue) >= cfg.max_queue:
            self.counters["queue_full"] += 1
            raise GeoHTTPError(429, f"region {self.region}: {len(self._queue)} requests already waiting "
                                    f"(max_queue={cfg.max_queue}); retry later",
                               type_="queue_full", retry_after_s=cfg.retry_after_s, region=self.region)
        self.counters["held"] += 1
        ev = asyncio.Event()
        self._queue.append(ev)
        self._queue_tokens[ev] = rreq.prompt_tokens
        deadline = t0 + max_wait
        first = True
        try:
            while True:
                head = self._queue[0] is ev
                if not first:
                    d = self._decide(rreq, ev)
                    if d.kind != "hold" and (head or d.kind != "local"):
                        return d
                    if d.kind == "hold":
                        reason = d.reason
                first = False
                remaining = deadline - _now()
                if remaining <= 0:
                    self.counters["wait_timeout"] += 1
                    raise GeoHTTPError(503, f"region {self.region}: no replica became available within "
                                            f"{max_wait:g} s ({reason})",
                                       type_="wait_timeout", retry_after_s=cfg.retry_after_s, region=self.region)
                ev.clear()
                # the head re-decides every poll_s; the others when the peer table changes (kick_all)
                timeout = cfg.poll_s if self._queue[0] is ev else max(cfg.poll_s, 0.25)
                try:
                    await asyncio.wait_for(ev.wait(), min(remaining, timeout))
                except asyncio.TimeoutError:
                    pass
        finally:
            was_head = self._queue and self._queue[0] is ev
            self._queue_tokens.pop(ev, None)
            try:
                self._queue.remove(ev)
            except ValueError:
                pass
            if was_head:
                self._kick()

    # ------------------------------------------------------------ request processing
    async def process(self, body: PromptBody, text: str, *, stream: bool, max_tokens: int,
                      allowed: Optional[FrozenSet[str]], hops: int, origin: str, session: Optional[str],
                      request_id: str, waited_ms: float = 0.0, max_wait_s: Optional[float] = None):
        """Route and run one request. Returns ``(meta, result_dict)`` or ``(meta, async token iterator)``."""
        self.counters["requests"] += 1
        if allowed is not None:
            unknown = allowed - set(self.cfg.peers) - {self.region}
            if unknown:
                raise GeoHTTPError(400, f"allowed_regions names unknown region(s) {sorted(unknown)}; "
                                        f"regions: {sorted(set(self.cfg.peers) | {self.region})}",
                                   param="allowed_regions")
        rreq = RouteRequest(request_id=request_id, text=text, session_key=session, region=origin,
                            allowed_regions=allowed, hops=hops)
        excluded: set = set()
        for attempt in range(3):
            t0 = _now()
            d = await self._admit(rreq, max_wait_s)
            wait_ms = waited_ms + (_now() - t0) * 1000.0
            if d.kind == "reject":
                self.counters["rejected"] += 1
                raise GeoHTTPError(403, f"region {self.region} cannot serve this request: {d.reason}",
                                   type_="region_not_allowed", param="allowed_regions", region=self.region)
            if d.kind == "local":
                self.counters["local"] += 1
                return await self._run_local(body, stream, max_tokens, request_id, d, wait_ms, hops, origin)
            peer = d.target
            try:
                return await self._forward(peer, body, text, rreq, stream, max_tokens, d, wait_ms, origin, session,
                                           max_wait_s)
            except GeoHTTPError:
                raise
            except _ForwardFailed as e:
                # The peer ingress is unreachable: mark it unavailable and decide again (never lose it).
                self.counters["forward_failures"] += 1
                logger.warning("forward %s -> %s failed (%s); re-deciding", self.region, peer, e)
                self.router.mark_unreachable(peer)  # PeerState changes only through RegionRouter
                excluded.add(peer)
        raise GeoHTTPError(503, f"region {self.region}: forwarding failed to {sorted(excluded)}",
                           type_="forward_failed", retry_after_s=self.cfg.retry_after_s, region=self.region)

    def _local_meta(self, request_id: str, d, wait_ms: float, hops: int, origin: str, result=None) -> dict:
        info = None
        r = self._geo_router()
        if r is not None:
            try:
                info = r.decision(request_id)
            except Exception:  # noqa: BLE001
                info = None
        meta = {"region": self.region, "route": "local" if hops == 0 else "forwarded", "origin": origin,
                "replica": None, "reason": d.reason, "matched_prefix": 0, "queue_wait_ms": wait_ms, "hops": hops}
        if info:
            meta["replica"] = info.get("replica")
            meta["reason"] = info.get("reason") or d.reason
            meta["matched_prefix"] = int(info.get("matched") or 0)
            meta["queue_wait_ms"] = wait_ms + 1000.0 * float(info.get("queue_wait_s") or 0.0)
        if meta["replica"] is None and isinstance(result, dict):
            meta["replica"] = result.get("replica")
        return meta

    async def _run_local(self, body, stream, max_tokens, request_id, d, wait_ms, hops, origin):
        """Run a request on this region's model deployment. The local slot it takes (the request id in
        ``_local_unrouted`` until the router places it, then ``_local_done`` when it leaves) is owned
        by a :class:`_LocalSlot` and returned on every path, cancellation included."""
        slot = _LocalSlot(self, request_id)
        if not stream:
            try:
                res = await self.model.remote(body, max_tokens=max_tokens)
            except Exception as e:
                err = _as_http_error(e, self.region)
                if err is not None:
                    raise err from None
                self.counters["errors"] += 1
                raise
            finally:
                slot.release()
            return self._local_meta(request_id, d, wait_ms, hops, origin, res), res
        gen = None
        try:
            gen = self.model.options(stream=True).generate.remote(body, max_tokens=max_tokens)
            try:
                first = await gen.__anext__()
            except StopAsyncIteration:
                first = _NO_TOKEN
        except BaseException as e:  # CancelledError too: the client left before the first token
            _cancel_quietly(gen)
            slot.release()
            if isinstance(e, Exception):
                err = _as_http_error(e, self.region)
                if err is not None:
                    raise err from None
                self.counters["errors"] += 1
            raise
        slot.routed()
        try:
            meta = self._local_meta(request_id, d, wait_ms, hops, origin)
        except BaseException:
            _cancel_quietly(gen)
            slot.release()
            raise
        return meta, TokenStream(gen, first, on_close=slot.release)

    async def _forward(self, peer, body, text, rreq, stream, max_tokens, d, wait_ms, origin, session,
                       max_wait_s=None):
        now = _now()
        self.router.on_forward(rreq, peer, now)
        self._snapshot_dirty = True
        # optimistic: count the forward in the peer's LB queue until its next heartbeat, so a burst
        # stops going to a peer after ~tau forwards per heartbeat period instead of herding there
        self.router.note_forward(peer)
        self.counters["forwarded_out"] += 1
        fmeta = {"hops": rreq.hops + 1, "max_wait_s": max_wait_s, "origin": origin, "allowed_regions": sorted(rreq.allowed_regions)
                 if rreq.allowed_regions is not None else None, "session": session, "stream": stream,
                 "max_tokens": max_tokens, "request_id": rreq.request_id, "waited_ms": wait_ms,
                 "forward_reason": d.reason, "forward_matched": d.matched}
        try:
            h = self._peer(peer)
        except Exception as e:  # noqa: BLE001
            raise _ForwardFailed(str(e)) from None
        await self.latency.hop(self.region, peer)
        if not stream:
            try:
                meta, res = await asyncio.wait_for(h.forwarded.remote(dict(body), fmeta), self.cfg.forward_timeout_s)
            except Exception as e:
                await self.latency.hop(peer, self.region)
                err = _as_http_error(e, peer)
                if err is not None:
                    raise err from None
                raise _ForwardFailed(f"{type(e).__name__}: {e}") from None
            await self.latency.hop(peer, self.region)
            return self._forward_meta(meta, d), res
        gen = h.options(stream=True).forwarded_stream.remote(dict(body), fmeta)
        relay = self.latency.relay(gen, peer, self.region)
        try:
            meta = await relay.__anext__()
        except BaseException as e:  # CancelledError too: the peer must stop working on it
            await _aclose_quietly(relay)
            _cancel_quietly(gen)
            if not isinstance(e, Exception):
                raise
            err = _as_http_error(e, peer)
            if err is not None:
                raise err from None
            raise _ForwardFailed(f"{type(e).__name__}: {e}") from None

        async def close():
            _cancel_quietly(gen)
            await _aclose_quietly(relay)

        return self._forward_meta(meta, d), TokenStream(relay, _NO_TOKEN, on_close=close)

    def _forward_meta(self, meta: dict, d) -> dict:
        meta = dict(meta)
        meta["route"] = "forwarded"
        meta["forward_reason"] = d.reason
        return meta

    # ------------------------------------------------------------ peer-facing methods (handle calls)
    async def forwarded(self, body: dict, fmeta: dict):
        """A request forwarded by a peer region (hops >= 1: it is never forwarded again)."""
        self.counters["forwarded_in"] += 1
        body = PromptBody(body)
        text = canonical_text(body)
        allowed = frozenset(fmeta["allowed_regions"]) if fmeta.get("allowed_regions") else None
        return await self.process(body, text, stream=False, max_tokens=int(fmeta["max_tokens"]), allowed=allowed,
                                  hops=max(1, int(fmeta.get("hops", 1))), origin=fmeta.get("origin", "?"),
                                  session=fmeta.get("session"), request_id=fmeta.get("request_id") or _request_id(),
                                  waited_ms=float(fmeta.get("waited_ms", 0.0)), max_wait_s=fmeta.get("max_wait_s"))

    async def forwarded_stream(self, body: dict, fmeta: dict):
        """Streaming variant: yields the metadata dict first, then the tokens."""
        self.counters["forwarded_in"] += 1
        body = PromptBody(body)
        text = canonical_text(body)
        allowed = frozenset(fmeta["allowed_regions"]) if fmeta.get("allowed_regions") else None
        meta, toks = await self.process(body, text, stream=True, max_tokens=int(fmeta["max_tokens"]),
                                        allowed=allowed, hops=max(1, int(fmeta.get("hops", 1))),
                                        origin=fmeta.get("origin", "?"), session=fmeta.get("session"),
                                        request_id=fmeta.get("request_id") or _request_id(),
                                        waited_ms=float(fmeta.get("waited_ms", 0.0)), max_wait_s=fmeta.get("max_wait_s"))
        try:  # Ray throws CancelledError in here when the origin goes away: the stream is closed
            yield meta
            async for t in toks:
                yield t
        finally:
            await toks.aclose()

    async def ping(self) -> str:
        return self.region

    def state(self) -> dict:
        now = _now()
        peers = {}
        for r, ps in self.router.peers.items():
            age = now - ps.timestamp
            peers[r] = {"available_replicas": ps.available_replicas, "queue_len": ps.queue_len,
                        "age_s": None if math.isinf(age) else round(age, 3),
                        "rtt_ms": None if ps.rtt_s is None else round(ps.rtt_s * 1000, 2),
                        "extra": {k: v for k, v in (ps.extra or {}).items()
                                  if isinstance(v, (int, float)) and math.isfinite(v)}}
        sel = self.router.selector
        costs = None
        if sel is not None:
            costs = {("stay" if k is None else k): (v if math.isfinite(v) else None) for k, v in sel.last_costs.items()}
        used_rtt = getattr(sel, "last_rtts", None)
        return {
            "region": self.region,
            "source": self.source,
            "local_available": self.local_available(),
            "router_present": self._geo_router() is not None,
            "queue_len": len(self._queue),
            "lb_queue_len": self._lb_queue_len(),
            "available_peers": sorted(self.router.available_peers(now)),
            "peers": peers,
            "measured_rtt_ms": {p: round(v * 1000, 2) for p, v in self.router.measured_rtts().items()},
            "remote": self.router.config.remote,
            "lb_queued_tokens": self._lb_queued_tokens(),
            "heartbeat_extra": self.heartbeat_extra(),
            "last_costs_s": costs,  # the 'cost' selector's last comparison (stay = hold here)
            "last_cost_rtts_ms": None if used_rtt is None else {p: round(v * 1000, 2) for p, v in used_rtt.items()},
            "last_slot_wait_s": getattr(sel, "last_slot_wait_s", None),  # the stay cost's slot wait (before q̂)
            "snapshot_nodes": self.router.snapshot.num_nodes,
            "snapshot_loaded_from_registry": self._snapshot_loaded,
            "registry": None if self.registry is None else self.registry.status(),
            "counters": dict(self.counters),
            "decisions": dict(self.decisions),
            "config": self.cfg.model_dump(exclude={"admin_token"}),
        }


class _ForwardFailed(Exception):
    pass


_NO_TOKEN = object()


def _cancel_quietly(gen) -> None:
    """Cancel a Ray streaming response (anything with ``cancel()``; other objects are left alone)."""
    cancel = getattr(gen, "cancel", None)
    if cancel is not None:
        try:
            cancel()
        except Exception:  # noqa: BLE001 - already finished or gone
            pass


async def _aclose_quietly(agen) -> None:
    try:
        await agen.aclose()
    except Exception:  # noqa: BLE001
        pass


class _LocalSlot:
    """The local capacity one request holds: its id in the ingress's ``_local_unrouted`` set until
    the router has placed it (:meth:`routed`), and the slot it frees when it leaves
    (:meth:`release`: ``_local_done``, exactly once, whatever path ends the request)."""

    __slots__ = ("_ing", "_rid", "_released")

    def __init__(self, ingress: "RegionIngressImpl", request_id: str):
        self._ing = ingress
        self._rid = request_id
        self._released = False
        ingress._local_unrouted.add(request_id)

    def routed(self) -> None:
        self._ing._local_unrouted.discard(self._rid)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._ing._local_unrouted.discard(self._rid)
            self._ing._local_done()


class TokenStream:
    """The tokens of a streamed request, as an async iterator that owns what the request holds.

    ``aclose()`` (idempotent) stops the source (a Ray streaming response or a relay) and calls
    ``on_close`` once -- the ingress calls it from the ``finally`` of whatever consumes the stream
    (the HTTP response, a peer's relay), so a client that leaves at any point returns the slot. It
    is a class rather than an async generator function because a generator that is never started
    never runs its ``finally``."""

    def __init__(self, source, first=_NO_TOKEN, on_close=None):
        self._source = source
        self._first = first
        self._on_close = on_close
        self._closed = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._closed:
            raise StopAsyncIteration
        if self._first is not _NO_TOKEN:
            tok, self._first = self._first, _NO_TOKEN
            return tok
        try:
            return await self._source.__anext__()
        except BaseException:  # StopAsyncIteration (done), errors, cancellation: release now
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        cb, self._on_close = self._on_close, None
        try:
            _cancel_quietly(self._source)  # a Ray streaming response: the replica stops working on it
        finally:
            if cb is not None:
                r = cb()
                if asyncio.iscoroutine(r):
                    await r


# ---------------------------------------------------------------------------------------------- HTTP
app = FastAPI(title="ray_geolb region ingress", description="OpenAI-compatible, multi-region prefix-aware LB")


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


def _headers(meta: dict, debug: bool = False) -> dict:
    h = {
        HEADER_PREFIX + "region": str(meta.get("region")),
        HEADER_PREFIX + "route": str(meta.get("route")),
        HEADER_PREFIX + "origin": str(meta.get("origin") or ""),
    }
    if debug:  # per-request routing and cache figures: operators only (see IngressConfig.debug)
        h[HEADER_PREFIX + "replica"] = str(meta.get("replica") or "")
        h[HEADER_PREFIX + "reason"] = str(meta.get("reason") or "")
        h[HEADER_PREFIX + "matched-prefix"] = str(int(meta.get("matched_prefix") or 0))
        h[HEADER_PREFIX + "queue-wait-ms"] = f"{float(meta.get('queue_wait_ms') or 0.0):.1f}"
    return h


def _usage(res: dict, debug: bool = False) -> dict:
    pt = int(res.get("prompt_tokens") or 0)
    ct = int(res.get("output_tokens") or 0)
    u = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
    if debug and res.get("cached_tokens") is not None:
        u["prompt_tokens_details"] = {"cached_tokens": int(res["cached_tokens"])}
    return u


class _OwnedStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its token source (returning the request's slot) however the
    response ends: finished, failed, or cancelled because the client went away -- also when the
    body iterator was never started."""

    def __init__(self, content, source: "TokenStream", **kw):
        super().__init__(content, **kw)
        self._source = source

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._source.aclose()


def _result_text(res: Any) -> str:
    if isinstance(res, dict):
        return str(res.get("text", ""))
    return str(res)


@serve.deployment(name=INGRESS_DEPLOYMENT, max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class RegionIngress(RegionIngressImpl):
    """One region's ingress deployment (see the module docstring). Bind with the model deployment:
    ``RegionIngress.options(...).bind(model_app, config_dict)``."""

    async def __init__(self, model, config: dict):
        await self._setup(model, config)

    def _admin(self, request: Request) -> bool:
        """True if the request may see debug figures: ``debug`` is on, or it carries the admin token."""
        if self.cfg.debug:
            return True
        token = self._admin_token
        got = request.headers.get(ADMIN_TOKEN_HEADER)
        return bool(token) and got is not None and hmac.compare_digest(got.encode(), token.encode())

    def _forbidden(self, what: str) -> Response:
        return GeoHTTPError(403, f"{what} needs the admin token (header {ADMIN_TOKEN_HEADER}) or the "
                                 "ingress option debug=True", type_="forbidden").response()

    async def _http(self, request: Request, kind: str) -> Response:
        cfg = self.cfg
        debug = self._admin(request)
        headers_in = client_headers(request.headers)
        try:
            raw = await request.body()
            body, text, stream, max_tokens, allowed = validate_body(
                raw, kind, cfg.model_name, cfg.max_tokens_limit, cfg.default_max_tokens)
            hdr = headers_in.get("x-allowed-regions")
            if hdr is not None:
                h_allowed = _parse_allowed(hdr, "header x-allowed-regions")
                allowed = h_allowed if allowed is None else (allowed & h_allowed)
                if not allowed:
                    raise GeoHTTPError(400, "header x-allowed-regions and body allowed_regions have no region "
                                            "in common", param="allowed_regions")
            max_wait_s = None
            mw = headers_in.get("x-geolb-max-wait-s")
            if mw is not None:
                try:
                    max_wait_s = float(mw)
                except ValueError:
                    max_wait_s = float("nan")
                if not (math.isfinite(max_wait_s) and max_wait_s >= 0):
                    raise GeoHTTPError(400, f"header x-geolb-max-wait-s must be a number >= 0, got {mw!r}",
                                       param="x-geolb-max-wait-s")
            session = headers_in.get("x-session-id") or (body.get("user") if isinstance(body.get("user"), str) else None)
            meta, out = await self.process(body, text, stream=stream, max_tokens=max_tokens, allowed=allowed, hops=0,
                                           origin=self.region, session=session, request_id=_request_id(),
                                           max_wait_s=max_wait_s)
        except GeoHTTPError as e:
            if e.status == 400:
                self.counters["bad_requests"] += 1
            return e.response({HEADER_PREFIX + "origin": self.region})
        try:
            return self._response(kind, meta, out, stream, debug)
        except BaseException:
            if stream:
                await out.aclose()
            raise

    def _response(self, kind: str, meta: dict, out, stream: bool, debug: bool) -> Response:
        cfg = self.cfg
        rid = "chatcmpl-" + uuid.uuid4().hex[:24] if kind == "chat" else "cmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        headers = _headers(meta, debug)
        if not stream:
            text_out = _result_text(out)
            if kind == "chat":
                choice = {"index": 0, "message": {"role": "assistant", "content": text_out}, "finish_reason": "length"}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text_out, "logprobs": None, "finish_reason": "length"}
                obj = "text_completion"
            payload = {"id": rid, "object": obj, "created": created, "model": cfg.model_name, "choices": [choice],
                       "usage": _usage(out if isinstance(out, dict) else {}, debug)}
            return JSONResponse(payload, headers=headers)
        return _OwnedStreamingResponse(self._sse(out, kind, rid, created), out, media_type="text/event-stream",
                                       headers=headers)

    async def _sse(self, tokens: AsyncIterator, kind: str, rid: str, created: int):
        model = self.cfg.model_name
        n = 0
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        try:
            async for tok in tokens:
                if isinstance(tok, dict):  # a server may stream dict chunks
                    tok = tok.get("text", "")
                if kind == "chat":
                    delta = {"content": str(tok)}
                    if n == 0:
                        delta["role"] = "assistant"
                    choice = {"index": 0, "delta": delta, "finish_reason": None}
                else:
                    choice = {"index": 0, "text": str(tok), "logprobs": None, "finish_reason": None}
                n += 1
                yield "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                             "choices": [choice]}) + "\n\n"
            last = ({"index": 0, "delta": {}, "finish_reason": "length"} if kind == "chat"
                    else {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"})
            yield "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                         "choices": [last], "usage": {"completion_tokens": n}}) + "\n\n"
        except Exception as e:  # noqa: BLE001 - headers are sent: report the error in-band
            err = _as_http_error(e, self.region)
            msg = err.message if err is not None else f"{type(e).__name__}: {e}"
            yield "data: " + json.dumps({"error": {"message": msg, "type": "stream_error"}}) + "\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._http(request, "chat")

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._http(request, "completion")

    @app.get("/v1/models")
    async def models(self):
        return {"object": "list", "data": [{"id": self.cfg.model_name, "object": "model", "created": 0,
                                            "owned_by": "ray_geolb", "region": self.region}]}

    @app.get("/healthz")
    async def healthz(self, request: Request):
        """Liveness for load balancers; the registry link and the peers only for the operator."""
        out = {"status": "ok", "region": self.region}
        if self._admin(request):
            out["registry"] = None if self.registry is None else self.registry.status()
            out["available_peers"] = sorted(self.router.available_peers(_now()))
        return out

    @app.get("/v1/geolb/state")
    async def geolb_state(self, request: Request):
        if not self._admin(request):
            return self._forbidden("/v1/geolb/state")
        return self.state()

    async def check_health(self):
        return None
