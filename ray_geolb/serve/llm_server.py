"""Emulated model servers for Ray Serve: the GPU engine is the calibrated engine model
(``ray_geolb.engine.engine.EngineModel`` driven in scaled wall-clock time by
``ray_geolb.engine.driver.AsyncEngineDriver``); everything else (Serve, the router, the OpenAI ingress,
HTTP) is real.

Two servers:

* :class:`EmulatedEngineServer` -- a plain Serve deployment class (light: no ``ray.serve.llm``).
  ``__call__(prompt_or_body, max_tokens=None)`` returns a dict; ``generate(...)`` streams tokens
  (call it with ``handle.options(stream=True).generate.remote(...)``).
* ``EmulatedLLMServer`` -- a subclass of Ray Serve LLM's ``LLMServer`` whose engine is the emulated
  one; use it with ``LLMConfig(server_cls=EmulatedLLMServer, ...)`` and ``build_openai_app`` (stock
  ``OpenAiIngress``). Built lazily on first attribute access (PEP 562), so importing this module
  does not import ``ray.serve.llm`` / vLLM. Engine options go in
  ``LLMConfig.experimental_configs["geolb_engine"]`` (a dict with the :class:`EmulatedEngine`
  keyword arguments: profile, time_scale, output_tokens, engine_overrides, region, regions), chosen
  over ``engine_kwargs`` because LLMConfig validates ``engine_kwargs`` against vLLM's engine args.
  :func:`emulated_llm_config` builds such a config.

Both report ``record_routing_stats()`` = the engine's stats (num_waiting, num_running,
kv_cache_usage, max_num_seqs, num_gpu_blocks, block_tokens, ...) + ``timestamp = time.time()`` +
``ttft_samples`` (``[[uncached_prompt_tokens, ttft_s], ...]`` since the previous report, TTFT in
wall-clock seconds: see :class:`EmulatedEngine`), and
``record_replica_metadata()`` = ``{"region": ...}``: the ``region`` option, else ``regions[rank %
len(regions)]`` (several "regions" on one node, for tests), else the node label
``ray.io/availability-region``.

Environment trap (this venv): torch is ``2.13.0+cpu`` but torchvision 0.28.0 is a CUDA build and
torchaudio is 2.11, so importing vLLM's protocol models (``import ray.serve.llm``) crashes inside
transformers (``operator torchvision::nms does not exist`` / ``Could not load _torchaudio``).
:func:`guard_broken_torch_extras` blocks whichever of the two fails to import. Install it as the
JOB-level hook: ``ray.init(..., runtime_env={"worker_process_setup_hook": GUARD_HOOK})`` -- measured:
the per-replica ``ray_actor_options.runtime_env`` hook that the helpers below also set did NOT run
before the OpenAiIngress replica unpickled its class (which imports vLLM), so that replica failed.
"""

from __future__ import annotations

import copy
import importlib
import itertools
import json
import logging
import sys
import time
import uuid
from collections import deque
from typing import Any, AsyncIterator, Deque, Dict, List, Optional

from ray import serve

from ray_geolb.engine.driver import AsyncEngineDriver
from ray_geolb.engine.engine import EngineConfig, EngineModel, EngineRequest
from ray_geolb.engine.profiles import get_profile
from ray_geolb.engine.tokens import prompt_blocks
from ray_geolb.policy import canonical_text

__all__ = [
    "REGION_LABEL", "EmulatedEngine", "EmulatedEngineServer", "emulated_deployment", "guard_broken_torch_extras",
    "emulated_llm_config", "build_emulated_openai_app", "replica_region",
]

logger = logging.getLogger("ray.serve")

REGION_LABEL = "ray.io/availability-region"
GUARD_HOOK = "ray_geolb.serve.llm_server.guard_broken_torch_extras"


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


def replica_region(region: Optional[str] = None, regions: Optional[List[str]] = None) -> Optional[str]:
    """This replica's region: explicit > by replica rank over ``regions`` > node label."""
    if region:
        return region
    if regions:
        try:
            rank = serve.get_replica_context().rank
            rank = getattr(rank, "rank", rank)
            return regions[int(rank) % len(regions)]
        except Exception:
            pass
    try:
        import ray

        return ray.get_runtime_context().get_node_labels().get(REGION_LABEL)
    except Exception:
        return None


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return "local"


#: TTFT samples an emulated replica keeps between two reports (oldest dropped beyond)
TTFT_SAMPLES_PER_REPORT = 256


class EmulatedEngine:
    """One emulated vLLM engine: EngineModel + AsyncEngineDriver + prompt hashing.

    ``stats()`` also carries ``ttft_samples``: ``[[uncached_prompt_tokens, ttft_s], ...]`` for the
    requests whose first token was produced since the previous ``stats()`` call (at most
    :data:`TTFT_SAMPLES_PER_REPORT`; the key is absent when there are none). ``ttft_s`` is in
    **wall-clock seconds** as this replica observed it (arrival at the replica to the first token),
    i.e. engine seconds x ``time_scale`` -- the clock of the report's ``timestamp``, of the router's
    waits and of the region layer's RTTs, so a learned t_p is comparable with them (and with what a
    real vLLM replica reports). ``uncached_prompt_tokens`` is the prompt minus the prefix the
    engine's cache held when the request arrived (capped like the engine: the last prompt block is
    always computed); under load the cache may change before the request is scheduled, so this is
    the engine's view at arrival, not at admission.
    """

    def __init__(self, profile: str = "llama3.1-8b-h100", time_scale: float = 0.01, output_tokens: int = 16,
                 engine_overrides: Optional[Dict[str, Any]] = None, chars_per_token: float = 4.0):
        prof = get_profile(profile)
        cfg = EngineConfig.from_profile(prof, **(engine_overrides or {}))
        self.model = EngineModel(prof, cfg)
        self.driver = AsyncEngineDriver(self.model, time_scale)
        self.time_scale = float(time_scale)
        self.output_tokens = int(output_tokens)
        self.chars_per_token = chars_per_token
        self.served = 0
        self._ids = itertools.count()
        self._ttft: Deque[List[float]] = deque(maxlen=TTFT_SAMPLES_PER_REPORT)

    def make_request(self, text: str, max_tokens: Optional[int] = None,
                     request_id: Optional[str] = None) -> EngineRequest:
        c = self.model.config
        n, hashes = prompt_blocks(text, self.chars_per_token, c.block_tokens)
        out = int(max_tokens) if max_tokens else self.output_tokens
        if out < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens!r}")
        if n + out > c.max_model_len:
            raise ValueError(f"prompt of {n} tokens + {out} output tokens exceeds max_model_len {c.max_model_len}")
        rid = f"{request_id or 'req'}#{next(self._ids)}"
        return EngineRequest(rid, n, out, hashes)

    async def generate(self, req: EngineRequest) -> AsyncIterator[int]:
        t0 = time.time()
        uncached = req.prompt_tokens - self.cached_prefix_tokens(req)
        first = True
        async for i in self.driver.generate(req):
            if first:
                first = False
                self._ttft.append([uncached, time.time() - t0])
            yield i
        self.served += 1

    def take_ttft_samples(self) -> List[List[float]]:
        """The TTFT samples since the previous call (and forget them)."""
        out = list(self._ttft)
        self._ttft.clear()
        return out

    def stats(self) -> dict:
        st = self.driver.stats()  # includes timestamp = time.time()
        st["served"] = self.served
        samples = self.take_ttft_samples()
        if samples:
            st["ttft_samples"] = samples
        return st

    def cached_prefix_tokens(self, req: EngineRequest) -> int:
        """Leading prompt tokens cached now, capped as the engine caps a hit (the block holding the
        last prompt token is always recomputed)."""
        B = self.model.config.block_tokens
        cap = ((req.prompt_tokens - 1) // B) * B
        return min(self.model.cached_prefix_tokens(req.block_hashes), cap)


def _prompt_and_max_tokens(prompt_or_body: Any, max_tokens: Optional[int]):
    text = canonical_text(prompt_or_body)
    if max_tokens is None and isinstance(prompt_or_body, dict):
        max_tokens = prompt_or_body.get("max_completion_tokens") or prompt_or_body.get("max_tokens")
    return text, max_tokens


class EmulatedEngineServer:
    """Plain Serve deployment class over one :class:`EmulatedEngine` (see the module docstring)."""

    def __init__(self, profile: str = "llama3.1-8b-h100", time_scale: float = 0.01, output_tokens: int = 16,
                 engine_overrides: Optional[Dict[str, Any]] = None, region: Optional[str] = None,
                 regions: Optional[List[str]] = None):
        self.engine = EmulatedEngine(profile, time_scale, output_tokens, engine_overrides)
        self.region = replica_region(region, regions)
        self.replica = _replica_id()

    def _arrival(self, req: EngineRequest) -> dict:
        m = self.engine.model
        return {"arrival": time.time(), "arrival_unfinished": m.num_unfinished,
                "arrival_waiting": m.stats()["num_waiting"], "cached_tokens": self.engine.cached_prefix_tokens(req)}

    async def __call__(self, prompt_or_body: Any, max_tokens: Optional[int] = None) -> dict:
        text, max_tokens = _prompt_and_max_tokens(prompt_or_body, max_tokens)
        req = self.engine.make_request(text, max_tokens, _request_id())
        info = self._arrival(req)
        n = 0
        first = None
        async for _ in self.engine.generate(req):
            if first is None:
                first = time.time()
            n += 1
        return {"replica": self.replica, "region": self.region, "text": " ".join(["tok"] * n),
                "prompt_tokens": req.prompt_tokens, "output_tokens": n,
                "ttft_s": (first or time.time()) - info["arrival"],
                "finish": time.time(), **info}

    async def generate(self, prompt_or_body: Any, max_tokens: Optional[int] = None):
        """Streaming: yields one string per output token (``handle.options(stream=True)``)."""
        text, max_tokens = _prompt_and_max_tokens(prompt_or_body, max_tokens)
        req = self.engine.make_request(text, max_tokens, _request_id())
        async for i in self.engine.generate(req):
            yield f"tok{i} "

    def record_routing_stats(self) -> dict:
        return self.engine.stats()

    def record_replica_metadata(self) -> dict:
        return {"region": self.region}

    def whoami(self) -> dict:
        return {"replica": self.replica, "region": self.region}


def _request_id() -> str:
    try:
        return serve.get_request_context().request_id or uuid.uuid4().hex
    except Exception:
        return uuid.uuid4().hex


def emulated_deployment(num_replicas: int = 2, router_kwargs: Optional[dict] = None, *, name: str = "Emulated",
                        router_class: Any = "ray_geolb.serve.router.GeoPrefixRouter", stats_period_s: float = 0.5,
                        max_ongoing_requests: int = 1000, deployment_options: Optional[dict] = None,
                        **server_kwargs):
    """A bound :class:`EmulatedEngineServer` app routed by ``router_class`` (GeoPrefixRouter by default)."""
    opts = dict(
        name=name,
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": 0},
        request_router_config={
            "request_router_class": router_class,
            "request_router_kwargs": dict(router_kwargs or {}),
            "request_routing_stats_period_s": stats_period_s,
            "request_routing_stats_timeout_s": 5.0,
        },
        health_check_period_s=1.0,
    )
    opts.update(deployment_options or {})
    return serve.deployment(EmulatedEngineServer, **opts).bind(**server_kwargs)


# --------------------------------------------------------------------------- Ray Serve LLM (lazy)
_LAZY: Dict[str, Any] = {}


def _build_llm_classes() -> Dict[str, Any]:
    if _LAZY:
        return _LAZY
    guard_broken_torch_extras()
    from ray.llm._internal.serve.core.configs.openai_api_models import (
        ChatCompletionResponse,
        CompletionResponse,
        ErrorResponse,
    )
    from ray.llm._internal.serve.core.engine.protocol import LLMEngine
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    class EmulatedLLMEngine(LLMEngine):
        """An ``LLMEngine`` whose work is done by :class:`EmulatedEngine`."""

        def __init__(self, llm_config):
            self.llm_config = llm_config
            opts = dict((llm_config.experimental_configs or {}).get("geolb_engine") or {})
            opts.pop("region", None)
            opts.pop("regions", None)
            self._opts = opts
            self.core: Optional[EmulatedEngine] = None
            self.model_id = llm_config.model_id

        async def start(self):
            self.core = EmulatedEngine(**self._opts)

        def routing_stats(self) -> dict:
            return self.core.stats() if self.core is not None else {}

        async def resolve_lora(self, lora_model):
            raise NotImplementedError("the emulated engine has no LoRA support")

        async def check_health(self) -> None:
            if self.core is None:
                raise RuntimeError("emulated engine not started")

        async def _run(self, request, kind: str):
            text = canonical_text(request)
            max_tokens = getattr(request, "max_completion_tokens", None) or getattr(request, "max_tokens", None)
            req = self.core.make_request(text, max_tokens, getattr(request, "request_id", None))
            created = int(time.time())
            rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
            fp = f"geolb-{_replica_id()}"
            model = self.model_id
            stream = bool(getattr(request, "stream", False))
            n = 0
            if stream:
                async for i in self.core.generate(req):
                    n += 1
                    if kind == "chat":
                        delta = {"content": f"tok{i} "}
                        if i == 0:
                            delta["role"] = "assistant"
                        ch = {"index": 0, "delta": delta, "finish_reason": None}
                        obj = "chat.completion.chunk"
                    else:
                        ch = {"index": 0, "text": f"tok{i} ", "finish_reason": None}
                        obj = "text_completion"
                    yield "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                                 "system_fingerprint": fp, "choices": [ch]}) + "\n\n"
                last = ({"index": 0, "delta": {}, "finish_reason": "length"} if kind == "chat"
                        else {"index": 0, "text": "", "finish_reason": "length"})
                yield "data: " + json.dumps({
                    "id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                    "created": created, "model": model, "system_fingerprint": fp, "choices": [last],
                    "usage": {"prompt_tokens": req.prompt_tokens, "completion_tokens": n,
                              "total_tokens": req.prompt_tokens + n}}) + "\n\n"
                return
            toks = []
            async for i in self.core.generate(req):
                toks.append(f"tok{i} ")
            n = len(toks)
            usage = {"prompt_tokens": req.prompt_tokens, "completion_tokens": n, "total_tokens": req.prompt_tokens + n}
            if kind == "chat":
                yield ChatCompletionResponse.model_validate({
                    "id": rid, "object": "chat.completion", "created": created, "model": model,
                    "system_fingerprint": fp,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(toks)},
                                 "finish_reason": "length"}],
                    "usage": usage})
            else:
                yield CompletionResponse.model_validate({
                    "id": rid, "object": "text_completion", "created": created, "model": model,
                    "system_fingerprint": fp,
                    "choices": [{"index": 0, "text": "".join(toks), "finish_reason": "length"}],
                    "usage": usage})

        async def chat(self, request, raw_request_info=None):
            async for x in self._run(request, "chat"):
                yield x

        async def completions(self, request, raw_request_info=None):
            async for x in self._run(request, "completions"):
                yield x

        async def embeddings(self, request, raw_request_info=None):
            yield ErrorResponse.model_validate({"error": {
                "message": "embeddings are not supported by the emulated engine",
                "type": "NotImplementedError", "code": 400}})

        async def transcriptions(self, request, raw_request_info=None):
            yield ErrorResponse.model_validate({"error": {
                "message": "transcriptions are not supported by the emulated engine",
                "type": "NotImplementedError", "code": 400}})

        async def reset_prefix_cache(self) -> None:
            return None

        async def shutdown(self) -> None:
            if self.core is not None:
                await self.core.driver.close()

    class EmulatedLLMServer(LLMServer):
        """``LLMServer`` over the emulated engine (no vLLM engine, no GPU)."""

        _default_engine_cls = EmulatedLLMEngine

        @classmethod
        def get_deployment_options(cls, llm_config):
            opts = copy.deepcopy(llm_config.deployment_config)
            rao = opts.setdefault("ray_actor_options", {})
            rao.setdefault("num_cpus", 0)
            env = rao.setdefault("runtime_env", {})
            env.setdefault("worker_process_setup_hook", GUARD_HOOK)
            return opts

        async def _start_engine(self):
            await self.engine.start()

        async def record_routing_stats(self) -> Dict[str, Any]:
            return self.engine.routing_stats() if self.engine is not None else {}

        def record_replica_metadata(self) -> dict:
            o = (self._llm_config.experimental_configs or {}).get("geolb_engine") or {}
            return {"region": replica_region(o.get("region"), o.get("regions"))}

    for c, n in ((EmulatedLLMEngine, "EmulatedLLMEngine"), (EmulatedLLMServer, "EmulatedLLMServer")):
        c.__module__ = __name__
        c.__qualname__ = n
    _LAZY["EmulatedLLMEngine"] = EmulatedLLMEngine
    _LAZY["EmulatedLLMServer"] = EmulatedLLMServer
    return _LAZY


def __getattr__(name):  # PEP 562: lazy LLM classes (pickle by reference resolves through this)
    if name in ("EmulatedLLMServer", "EmulatedLLMEngine"):
        return _build_llm_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def emulated_llm_config(model_id: str = "emulated-llama", num_replicas: int = 2, router_kwargs: Optional[dict] = None,
                        *, router_class: Any = "ray_geolb.serve.router.GeoPrefixRouter", stats_period_s: float = 0.5,
                        profile: str = "llama3.1-8b-h100", time_scale: float = 0.01, output_tokens: int = 16,
                        engine_overrides: Optional[dict] = None, region: Optional[str] = None,
                        regions: Optional[List[str]] = None, deployment_config: Optional[dict] = None):
    """An ``LLMConfig`` for :class:`EmulatedLLMServer` routed by GeoPrefixRouter."""
    classes = _build_llm_classes()
    from ray.serve.llm import LLMConfig

    dc = {
        "num_replicas": num_replicas,
        "ray_actor_options": {"num_cpus": 0, "runtime_env": {"worker_process_setup_hook": GUARD_HOOK}},
        "health_check_period_s": 2.0,
        "request_router_config": {
            "request_router_class": router_class,
            "request_router_kwargs": dict(router_kwargs or {}),
            "request_routing_stats_period_s": stats_period_s,
            "request_routing_stats_timeout_s": 5.0,
        },
    }
    dc.update(deployment_config or {})
    geo = {"profile": profile, "time_scale": time_scale, "output_tokens": output_tokens,
           "engine_overrides": engine_overrides or {}, "region": region, "regions": regions}
    return LLMConfig(
        model_loading_config={"model_id": model_id},
        server_cls=classes["EmulatedLLMServer"],
        accelerator_type=None,
        log_engine_metrics=False,
        deployment_config=dc,
        experimental_configs={"geolb_engine": geo},
    )


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
