"""The FastAPI deployment: :class:`RegionIngress`, one region's ingress as a Ray Serve app.

HTTP endpoints: ``/v1/chat/completions`` and ``/v1/completions`` (OpenAI, SSE when ``stream: true``),
``/v1/models``, ``/healthz`` (status and region for everyone; the registry link and the peers for
the operator) and ``/v1/geolb/state`` (operator only). Peer-facing handle methods: ``forwarded``,
``forwarded_stream``, ``ping``, ``state``, ``accounting``, work stealing's ``steal_offer``, ``stolen`` and
``stolen_stream`` (``steal.py``), and for chaos drills ``inject_faults``, ``arm_crash`` and
``served_request_ids``.

Ray Serve 2.60: the ``@serve.ingress`` class must stay defined at module level of an importable
module, and FastAPI >= 0.137 breaks such classes (HTTP 400 ``Field required ('query','self')``;
pinned ``fastapi<0.137``).
"""

from __future__ import annotations

import os
import time

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve

from .config import INGRESS_DEPLOYMENT
from .context import new_request_id
from .errors import HEADER_PREFIX, GeoHTTPError
from .model_client import ModelClient
from .openai import client_headers, forbidden, is_admin, parse_request, read_body
from .request_path import RequestPath
from .responses import completion_response

__all__ = ["RegionIngress", "app"]

app = FastAPI(title="ray_geolb region ingress", description="OpenAI-compatible, multi-region prefix-aware LB")


@serve.deployment(name=INGRESS_DEPLOYMENT, max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class RegionIngress:
    """One region's ingress deployment (see the package docstring). Bind with the model deployment:
    ``RegionIngress.options(...).bind(model_app, config_dict)``. The request path is :attr:`path`
    (:class:`RequestPath`); this class adds HTTP and the handle methods peers call."""

    async def __init__(self, model, config: dict):
        ModelClient.preload()
        self.path = RequestPath(config, model)
        self.path.start()
        cfg = self.path.cfg
        self.cfg = cfg
        self.region = cfg.region
        self._admin_token = cfg.admin_token or os.environ.get(cfg.admin_token_env) or None
        self._http_inflight = 0  # HTTP requests being answered here (max_concurrent)

    def _admin(self, request: Request) -> bool:
        """True if the request may see debug figures: ``debug`` is on, or it carries the admin token."""
        return is_admin(request.headers, self.cfg.debug, self._admin_token)

    async def _http(self, request: Request, kind: str) -> Response:
        # the deadline runs from here, before the body is read or parsed: Ray Serve 2.60 hands the replica
        # no earlier arrival time (deadlines.py), so the ingress keeps a reserve of it for the proxy's part
        arrived = time.monotonic()
        if self._http_inflight >= self.cfg.max_concurrent:
            err = GeoHTTPError(429, f"region {self.region}: {self._http_inflight} requests in progress at this "
                                    f"ingress (max_concurrent {self.cfg.max_concurrent}); retry later",
                               type_="too_many_requests", retry_after_s=self.cfg.retry_after_s, region=self.region)
            self.path.note_rejection(err)
            return err.response({HEADER_PREFIX + "origin": self.region})
        self._http_inflight += 1
        try:
            return await self._serve_http(request, kind, arrived)
        finally:
            self._http_inflight -= 1  # streams hold their own slot (LocalSlot) until they end

    async def _serve_http(self, request: Request, kind: str, arrived: float) -> Response:
        debug = self._admin(request)
        try:
            raw = await read_body(request, self.cfg.max_body_bytes)
            ctx = parse_request(raw, client_headers(request.headers), kind, self.cfg,
                                origin=self.region, request_id=new_request_id(), arrived=arrived)
            meta, out = await self.path.process(ctx)
        except GeoHTTPError as e:
            if e.status == 400:
                self.path.note_bad_request()
            self.path.note_rejection(e)
            return e.response({HEADER_PREFIX + "origin": self.region})
        except Exception as e:  # noqa: BLE001 - an OpenAI-style JSON 500, never a bare one
            err = self.path.server_error(e)
            self.path.note_rejection(err)
            return err.response({HEADER_PREFIX + "origin": self.region})
        try:
            return completion_response(meta, out, ctx.stream, debug, region=self.region,
                                       on_error=lambda: self.path.note_error("stream_failed"))
        except BaseException:
            if ctx.stream:
                await out.aclose()
            raise

    # ------------------------------------------------------------ HTTP
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
            out["registry"] = self.path.peers.status()
            out["available_peers"] = self.path.available_peers()
        return out

    @app.get("/v1/geolb/state")
    async def geolb_state(self, request: Request):
        if not self._admin(request):
            return forbidden("/v1/geolb/state")
        return self.path.state()

    # ------------------------------------------------------------ peer-facing (handle calls)
    async def forwarded(self, body: dict, fmeta: dict):
        """A request forwarded by a peer region (hops >= 1: it is never forwarded again)."""
        return await self.path.forwarded(body, fmeta, stream=False)

    async def forwarded_stream(self, body: dict, fmeta: dict):
        """Streaming variant: yields the metadata dict first, then the tokens."""
        meta, toks = await self.path.forwarded(body, fmeta, stream=True)
        try:  # Ray throws CancelledError in here when the origin goes away: the stream is closed
            yield meta
            async for t in toks:
                yield t
        finally:
            await toks.aclose()

    def steal_offer(self, offer: dict) -> dict:
        """A peer's steal offer (``StealOffer.to_wire``): the held requests handed over, or a typed error."""
        return self.path.steal_offer(offer)

    async def stolen(self, body: dict, fmeta: dict, victim: str, offer_id: int):
        """A held request ``victim`` handed over under our offer ``offer_id`` (409 ``steal_refused``: closed)."""
        return await self.path.stolen(body, fmeta, victim, offer_id, stream=False)

    async def stolen_stream(self, body: dict, fmeta: dict, victim: str, offer_id: int):
        """Streaming variant: yields the metadata dict first, then the tokens."""
        meta, toks = await self.path.stolen(body, fmeta, victim, offer_id, stream=True)
        try:
            yield meta
            async for t in toks:
                yield t
        finally:
            await toks.aclose()

    def __del__(self):
        path = getattr(self, "path", None)
        if path is not None:
            try:
                path.stop_stealing()
            except RuntimeError:  # the event loop is already closed: nothing left to cancel
                pass

    async def ping(self) -> str:
        return self.region

    def inject_faults(self, faults=None) -> dict:
        """Chaos drills (handle call only, never HTTP): ``{peer: {"drop": 0..1, "extra_ms": ms}}`` on this
        ingress's crossings to its peers (``latency.py``); None or {} heals. Returns the faults now set."""
        self.path.peers.latency.set_faults(faults)
        return self.path.peers.latency.faults

    def arm_crash(self, point=None, after: int = 1) -> dict:
        """Chaos drills (handle call only, never HTTP): this ingress replica's process exits the
        ``after``-th time a hand-over reaches ``point`` (``handovers.CRASH_POINTS``); None disarms.
        Returns the points armed."""
        return self.path.crashes.arm(point, after)

    def served_request_ids(self) -> list:
        """Ids of the last requests this ingress replica served locally (chaos checks; handle call only)."""
        return list(self.path.served_ids)

    def state(self) -> dict:
        return self.path.state()

    def accounting(self) -> dict:
        """What requests hold at this LB right now (see :meth:`RequestPath.accounting`)."""
        return self.path.accounting()

    async def check_health(self):
        return None
