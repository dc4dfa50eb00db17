"""Ray Serve LLM's ``LLMServer`` over the emulated engine: what the region apps deploy on CPU.

``EmulatedLLMServer`` is a subclass of Ray Serve LLM's real ``LLMServer`` whose engine
(``EmulatedLLMEngine``, an ``LLMEngine``) is :class:`~ray_geolb.serve.emulated.EmulatedEngine`: the
calibrated engine model in scaled wall-clock time. Everything else -- ``LLMConfig``, the
``LLMServer`` request path and its stream batching, ``build_llm_deployment``, Serve, the router, the
region ingress, HTTP -- is the code a GPU deployment runs; there ``server_cls`` is the vLLM-backed
``GeoVLLMServer`` (``stats_plugin.py``). The engine speaks vLLM's OpenAI protocol: a streamed request
yields SSE strings (``data: {...}``, ``data: [DONE]``), a non-streamed one a ``ChatCompletionResponse``
/ ``CompletionResponse``, and a request the engine cannot take (prompt + max_tokens over the model's
length) an ``ErrorResponse`` with code 400, as vLLM does.

Load reports: the engine's own ``routing_stats()`` is what vLLM's is (no load: KV-event endpoints
only, none here); the *server* adds the load, as ``GeoVLLMServer`` adds its stat-logger's, so
``record_routing_stats`` = ``EmulatedEngine.stats()``. ``StockStatsLLMServer`` keeps the stock
``record_routing_stats``: the emulated engine reporting what a stock ``LLMServer`` reports, i.e. no
load (what GeoPrefixRouter warns about).

Engine options go in ``LLMConfig.experimental_configs["geolb_engine"]`` (the
:class:`~ray_geolb.serve.emulated.EmulatedEngine` keyword arguments: profile, time_scale,
output_tokens, engine_overrides), not in ``engine_kwargs``, which LLMConfig validates against
vLLM's engine args; the replica's region, as for ``GeoVLLMServer``, in
``experimental_configs["geolb"]`` (``{"region": ..., "regions": [...]}``). :func:`emulated_llm_config`
builds such a config. The classes are
built lazily on first attribute access (PEP 562), so importing this module does not import
``ray.serve.llm`` / vLLM.

Environment trap (this venv): torch is ``2.13.0+cpu`` but torchvision 0.28.0 is a CUDA build and
torchaudio is 2.11, so importing vLLM's protocol models (``import ray.serve.llm``) crashes inside
transformers (``operator torchvision::nms does not exist`` / ``Could not load _torchaudio``).
:func:`guard_broken_torch_extras` blocks whichever of the two fails to import. Install it as the
JOB-level hook: ``ray.init(..., runtime_env={"worker_process_setup_hook": GUARD_HOOK})`` -- the
per-replica ``ray_actor_options.runtime_env`` hook that the helpers below also set did NOT run
before an ingress replica unpickled a class that imports vLLM, so that replica failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib
import json
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

from ray_geolb.policy import canonical_text
from ray_geolb.serve.direct_streaming import refuse_direct_streaming
from ray_geolb.serve.emulated import REGION_OPTIONS_KEY, EmulatedEngine, replica_id, replica_region

__all__ = ["GUARD_HOOK", "guard_broken_torch_extras", "emulated_llm_config", "build_emulated_openai_app",
           "llm_protocol"]

GUARD_HOOK = "ray_geolb.serve.llm_server.guard_broken_torch_extras"
ENGINE_OPTIONS_KEY = "geolb_engine"


def guard_broken_torch_extras() -> List[str]:
    """Block torchvision / torchaudio if they cannot be imported (see the module docstring)."""
    blocked = []
    for name in ("torchvision", "torchaudio"):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:
            for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[k]
            sys.modules[name] = None  # importlib.util.find_spec -> None; import -> ImportError
            blocked.append(name)
    return blocked


_PROTOCOL = None


def llm_protocol():
    """Ray Serve LLM's OpenAI protocol classes (``ChatCompletionRequest``, ``CompletionRequest``,
    ``ChatCompletionResponse``, ``CompletionResponse``, ``ErrorResponse``), imported on first use
    (the ingress asks for them on every request: after the first call this is one global read)."""
    global _PROTOCOL
    if _PROTOCOL is None:
        guard_broken_torch_extras()
        with logging_handlers_kept():
            from ray.llm._internal.serve.core.configs import openai_api_models as m
        _PROTOCOL = m
    return _PROTOCOL


@contextlib.contextmanager
def logging_handlers_kept():
    """Keep this process's buffering log handlers working across an import of vLLM.

    vLLM configures logging when it is first imported (``logging.config.dictConfig``), which closes
    every handler that exists; a closed ``MemoryHandler`` loses its target and from then on keeps
    every record it is given. Ray Serve's replica logger is one: in a region ingress (which imports
    vLLM's protocol classes after Serve set up its logging) every access-log line stayed in memory
    for good and none reached the log file (found by ``benchmarks/soak.py``: ~1 ``LogRecord`` per
    request). Each ``MemoryHandler``'s target is put back after the import (a closed file handler
    reopens on its next record)."""
    import logging
    import logging.handlers

    loggers = [logging.getLogger()] + [lg for lg in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(lg, logging.Logger)]
    kept = [(h, h.target) for lg in loggers for h in lg.handlers
            if isinstance(h, logging.handlers.MemoryHandler) and h.target is not None]
    try:
        yield
    finally:
        for h, target in kept:
            if h.target is None:
                h.setTarget(target)


# ---------------------------------------------------------------------------------------------- payloads
def _usage(prompt: int, completion: int, cached: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _stream_chunk(kind: str, head: dict, i: int) -> str:
    if kind == "chat":
        delta = {"content": f"tok{i} "}
        if i == 0:
            delta["role"] = "assistant"
        choice, obj = {"index": 0, "delta": delta, "finish_reason": None}, "chat.completion.chunk"
    else:
        choice, obj = {"index": 0, "text": f"tok{i} ", "finish_reason": None}, "text_completion"
    return "data: " + json.dumps({**head, "object": obj, "choices": [choice]}) + "\n\n"


def _last_chunk(kind: str, head: dict, usage: dict) -> str:
    if kind == "chat":
        choice, obj = {"index": 0, "delta": {}, "finish_reason": "length"}, "chat.completion.chunk"
    else:
        choice, obj = {"index": 0, "text": "", "finish_reason": "length"}, "text_completion"
    return "data: " + json.dumps({**head, "object": obj, "choices": [choice], "usage": usage}) + "\n\n"


def _response(kind: str, head: dict, text: str, usage: dict):
    m = llm_protocol()
    if kind == "chat":
        return m.ChatCompletionResponse.model_validate({
            **head, "object": "chat.completion", "usage": usage,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}]})
    return m.CompletionResponse.model_validate({
        **head, "object": "text_completion", "usage": usage,
        "choices": [{"index": 0, "text": text, "finish_reason": "length"}]})


def output_limit(request) -> Optional[int]:
    """The most output tokens a request may get from the emulated engine: the *smaller* of
    ``max_tokens`` and ``max_completion_tokens`` when both are set (the region ingress writes the same
    value to both; a direct caller never gets more than either field allows), else the one set, else
    None (the engine's default). ValueError for ``n`` other than 1: one sequence per request."""
    get = request.get if isinstance(request, dict) else (lambda k: getattr(request, k, None))
    n = get("n")
    if n is not None and n != 1:
        raise ValueError(f"n={n} is not supported: the emulated engine decodes one sequence per request")
    vals = [v for v in (get("max_completion_tokens"), get("max_tokens")) if v is not None]
    return min(vals) if vals else None


def _error(message: str, type_: str, code: int):
    return llm_protocol().ErrorResponse.model_validate({"error": {"message": message, "type": type_, "code": code}})


# ---------------------------------------------------------------------------------------------- classes (lazy)
_LAZY: Dict[str, Any] = {}


def _network_delay(net: Optional[dict], llm_config) -> float:
    """The RTT between a central router's region (``network.caller``) and this replica's region
    (``app.build_central_app``), from the engine options' ``network``; 0 without one."""
    if not net:
        return 0.0
    from ray_geolb.serve.latency import LatencyInjector

    o = (llm_config.experimental_configs or {}).get(REGION_OPTIONS_KEY) or {}
    own = replica_region(o.get("region"), o.get("regions"))
    return LatencyInjector.from_spec(net.get("latency")).rtt_s(net["caller"], own) if own else 0.0


def _engine_class():
    from ray.llm._internal.serve.core.engine.protocol import LLMEngine

    class EmulatedLLMEngine(LLMEngine):
        """An ``LLMEngine`` whose work is done by :class:`EmulatedEngine` (see the module docstring)."""

        def __init__(self, llm_config):
            self.llm_config = llm_config
            self._opts = dict((llm_config.experimental_configs or {}).get(ENGINE_OPTIONS_KEY) or {})
            self.core: Optional[EmulatedEngine] = None
            self.model_id = llm_config.model_id
            self.network_delay_s = 0.0

        async def start(self):
            opts = dict(self._opts)
            net = opts.pop("network", None)
            self.core = EmulatedEngine(**opts)
            self.network_delay_s = _network_delay(net, self.llm_config)

        def routing_stats(self) -> dict:
            return {}  # as vLLM's engine: KV-event endpoints only (none here), no load

        async def resolve_lora(self, lora_model):
            raise NotImplementedError("the emulated engine has no LoRA support")

        async def check_health(self) -> None:
            if self.core is None:
                raise RuntimeError("emulated engine not started")

        async def _run(self, request, kind: str):
            text = canonical_text(request)
            try:
                max_tokens = output_limit(request)
                req = self.core.make_request(text, max_tokens, getattr(request, "request_id", None))
            except ValueError as e:  # vLLM answers a request it cannot take with a 400 ErrorResponse
                yield _error(str(e), "BadRequestError", 400)
                return
            cached = self.core.cached_prefix_tokens(req)
            if self.network_delay_s:  # a central router in another region: the request's trip + the reply's
                await asyncio.sleep(self.network_delay_s)
            head = {"id": ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex,
                    "created": int(time.time()), "model": self.model_id, "system_fingerprint": f"geolb-{replica_id()}"}
            n = 0
            if getattr(request, "stream", False):
                async for i in self.core.generate(req):
                    n += 1
                    yield _stream_chunk(kind, head, i)
                yield _last_chunk(kind, head, _usage(req.prompt_tokens, n, cached))
                yield "data: [DONE]\n\n"
                return
            toks = [f"tok{i} " async for i in self.core.generate(req)]
            yield _response(kind, head, "".join(toks), _usage(req.prompt_tokens, len(toks), cached))

        async def chat(self, request, raw_request_info=None):
            async for x in self._run(request, "chat"):
                yield x

        async def completions(self, request, raw_request_info=None):
            async for x in self._run(request, "completions"):
                yield x

        async def embeddings(self, request, raw_request_info=None):
            yield _error("embeddings are not supported by the emulated engine", "NotImplementedError", 400)

        async def transcriptions(self, request, raw_request_info=None):
            yield _error("transcriptions are not supported by the emulated engine", "NotImplementedError", 400)

        async def reset_prefix_cache(self) -> None:
            return None

        async def shutdown(self) -> None:
            if self.core is not None:
                await self.core.driver.close()

    return EmulatedLLMEngine


def _server_classes(engine_cls):
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    class StockStatsLLMServer(LLMServer):
        """``LLMServer`` over the emulated engine with the stock ``record_routing_stats`` (no load)."""

        _default_engine_cls = engine_cls

        @classmethod
        def get_deployment_options(cls, llm_config):
            # the stock version builds vLLM's engine config (a model download); nothing else differs
            refuse_direct_streaming(f"{cls.__name__} for {llm_config.model_id!r}", llm_config)
            opts = copy.deepcopy(llm_config.deployment_config)
            rao = opts.setdefault("ray_actor_options", {})
            rao.setdefault("num_cpus", 0)
            rao.setdefault("runtime_env", {}).setdefault("worker_process_setup_hook", GUARD_HOOK)
            return opts

        async def _start_engine(self):
            await self.engine.start()

        def record_replica_metadata(self) -> dict:
            o = (self._llm_config.experimental_configs or {}).get(REGION_OPTIONS_KEY) or {}
            return {"region": replica_region(o.get("region"), o.get("regions"))}

    class EmulatedLLMServer(StockStatsLLMServer):
        """``LLMServer`` over the emulated engine, reporting the engine's load (see the module docstring)."""

        async def record_routing_stats(self) -> Dict[str, Any]:
            out = dict(await super().record_routing_stats() or {})
            core = getattr(self.engine, "core", None) if self.engine is not None else None
            if core is not None:
                out.update(core.stats())
            return out

        def ran_request_ids(self) -> Dict[str, int]:
            """Request id -> calls of it this replica's engine ran to their last token
            (``EmulatedEngine.ran_request_ids``; chaos checks: a handle call, never HTTP)."""
            core = getattr(self.engine, "core", None) if self.engine is not None else None
            return {} if core is None else core.ran_request_ids()

    return StockStatsLLMServer, EmulatedLLMServer


def _build_llm_classes() -> Dict[str, Any]:
    if _LAZY:
        return _LAZY
    guard_broken_torch_extras()
    engine_cls = _engine_class()
    stock, emulated = _server_classes(engine_cls)
    for c, n in ((engine_cls, "EmulatedLLMEngine"), (stock, "StockStatsLLMServer"), (emulated, "EmulatedLLMServer")):
        c.__module__ = __name__
        c.__qualname__ = n
        _LAZY[n] = c
    return _LAZY


def __getattr__(name):  # PEP 562: lazy LLM classes (pickle by reference resolves through this)
    if name in ("EmulatedLLMServer", "EmulatedLLMEngine", "StockStatsLLMServer"):
        return _build_llm_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------- configs
def emulated_llm_config(model_id: str = "emulated-llama", num_replicas: int = 2, router_kwargs: Optional[dict] = None,
                        *, router_class: Any = "ray_geolb.serve.router.GeoPrefixRouter", stats_period_s: float = 0.5,
                        profile: str = "llama3.1-8b-h100", time_scale: float = 0.01, output_tokens: int = 16,
                        engine_overrides: Optional[dict] = None, region: Optional[str] = None,
                        regions: Optional[List[str]] = None, deployment_config: Optional[dict] = None,
                        server_cls: str = "EmulatedLLMServer", network: Optional[dict] = None):
    """An ``LLMConfig`` for ``EmulatedLLMServer`` (or ``server_cls="StockStatsLLMServer"``) routed by
    ``router_class`` (GeoPrefixRouter by default; None: Ray's default power-of-two). ``network``:
    ``{"caller": region, "latency": LatencyInjector spec}`` -- the replica pays the RTT between the
    caller's region and its own on every request (a central router; ``app.build_central_app``)."""
    classes = _build_llm_classes()
    from ray.serve.llm import LLMConfig

    dc: Dict[str, Any] = {
        "num_replicas": num_replicas,
        "ray_actor_options": {"num_cpus": 0, "runtime_env": {"worker_process_setup_hook": GUARD_HOOK}},
        "health_check_period_s": 2.0,
    }
    if router_class is not None:
        dc["request_router_config"] = {
            "request_router_class": router_class,
            "request_router_kwargs": dict(router_kwargs or {}),
            "request_routing_stats_period_s": stats_period_s,
            "request_routing_stats_timeout_s": 5.0,
        }
    dc.update(deployment_config or {})
    engine = {"profile": profile, "time_scale": time_scale, "output_tokens": output_tokens,
              "engine_overrides": engine_overrides or {}}
    if network:
        engine["network"] = dict(network)
    return LLMConfig(model_loading_config={"model_id": model_id}, server_cls=classes[server_cls],
                     accelerator_type=None, log_engine_metrics=False, deployment_config=dc,
                     experimental_configs={ENGINE_OPTIONS_KEY: engine,
                                           REGION_OPTIONS_KEY: {"region": region, "regions": regions}})


def build_emulated_openai_app(llm_configs: list, ingress_cls: Any = None, ingress_extra_kwargs: Optional[dict] = None,
                              ingress_deployment_config: Optional[dict] = None):
    """``build_openai_app`` over emulated configs; the ingress replicas get the torch guard hook."""
    _build_llm_classes()
    from ray.serve.llm import build_openai_app

    idc = {"num_replicas": 1,
           "ray_actor_options": {"num_cpus": 0, "runtime_env": {"worker_process_setup_hook": GUARD_HOOK}}}
    idc.update(ingress_deployment_config or {})
    spec = {"llm_configs": llm_configs, "ingress_deployment_config": idc}
    if ingress_cls is not None:
        spec["ingress_cls_config"] = {"ingress_cls": ingress_cls, "ingress_extra_kwargs": ingress_extra_kwargs or {}}
    return build_openai_app(spec)
