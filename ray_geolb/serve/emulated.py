"""The emulated GPU engine shared by the emulated servers, and a plain Serve deployment over it.

:class:`EmulatedEngine` is one emulated vLLM engine: the calibrated :class:`~ray_geolb.engine.engine.EngineModel`
driven in scaled wall-clock time by :class:`~ray_geolb.engine.driver.AsyncEngineDriver`, plus prompt
hashing. Its ``stats()`` is what a vLLM replica's scheduler reports (num_waiting, num_running,
kv_cache_usage, max_num_seqs, num_gpu_blocks, block_tokens, ...) + ``timestamp`` + ``ttft_samples``
+ ``over_capacity_arrivals`` (requests that arrived while every sequence slot was taken: SP-P
granted a slot the engine did not have).

Two servers run it:

* ``EmulatedLLMServer`` (``llm_server.py``): a subclass of Ray Serve LLM's ``LLMServer``. This is what
  the region apps deploy on CPU, so CI runs the code path a GPU deployment runs with only the engine
  replaced.
* :class:`EmulatedEngineServer` (here): a plain Serve deployment class with no ``ray.serve.llm``
  import (``__call__`` returns a dict, ``generate`` streams one string per token). It stays for what
  tests the router alone through a deployment handle, without the LLM stack: the router tests
  (``tests/serve/test_geoprefix_router_in_serve.py``, ``test_every_policy_through_the_router.py``)
  and ``benchmarks/bench_router.py``.

Both report ``record_replica_metadata()`` = ``{"region": ...}``: the ``region`` option, else
``regions[rank % len(regions)]`` (several "regions" on one node, for tests), else the node label
``ray.io/availability-region``.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import OrderedDict, deque
from typing import Any, AsyncIterator, Deque, Dict, List, Optional

from ray import serve

from ray_geolb.engine.driver import AsyncEngineDriver
from ray_geolb.engine.engine import EngineConfig, EngineRequest
from ray_geolb.engine.factory import make_engine
from ray_geolb.engine.profiles import get_profile
from ray_geolb.engine.tokens import prompt_blocks
from ray_geolb.policy import canonical_text
from ray_geolb.serve import request_of_call
from ray_geolb.serve.local import REGION_LABEL  # the node label a region's nodes carry (one definition)

__all__ = ["RAN_IDS_KEPT", "REGION_LABEL", "REGION_OPTIONS_KEY", "TTFT_SAMPLES_PER_REPORT", "EmulatedEngine",
           "EmulatedEngineServer", "emulated_deployment", "replica_id", "replica_region"]

#: ``LLMConfig.experimental_configs`` key of a server's region (``{"region": ..., "regions": [...]}``)
REGION_OPTIONS_KEY = "geolb"
#: how many request ids an engine keeps in its count of the calls it ran (``ran_request_ids``)
RAN_IDS_KEPT = 10_000


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



def replica_id() -> str:
    """This Serve replica's unique id ("local" outside a replica)."""
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
        self.model = make_engine(prof, cfg)
        self.driver = AsyncEngineDriver(self.model, time_scale)
        self.time_scale = float(time_scale)
        self.output_tokens = int(output_tokens)
        self.chars_per_token = chars_per_token
        self.served = 0
        self.over_capacity = 0  # arrivals that found every sequence slot taken (over-granted by SP-P)
        self._ids = itertools.count()
        self._ttft: Deque[List[float]] = deque(maxlen=TTFT_SAMPLES_PER_REPORT)
        #: request id -> calls of it this engine ran to completion (the most recent RAN_IDS_KEPT ids)
        self._ran: "OrderedDict[str, int]" = OrderedDict()

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
        if self.model.num_unfinished >= self.model.config.max_num_seqs:
            self.over_capacity += 1  # every sequence slot was taken when it arrived: it will wait
        uncached = req.prompt_tokens - self.cached_prefix_tokens(req)
        first = True
        async for i in self.driver.generate(req):
            if first:
                first = False
                self._ttft.append([uncached, time.time() - t0])
            yield i
        self.served += 1
        self._note_ran(req.request_id)

    def _note_ran(self, rid: str) -> None:
        key = request_of_call(rid.rsplit("#", 1)[0])  # make_request's "<call id>#<n>"
        self._ran[key] = self._ran.pop(key, 0) + 1
        while len(self._ran) > RAN_IDS_KEPT:
            self._ran.popitem(last=False)

    def ran_request_ids(self) -> Dict[str, int]:
        """Request id -> how many of its calls this engine ran to its last token (the most recent
        :data:`RAN_IDS_KEPT` ids; a call cancelled before its end is not counted). Each model call's id
        names its request (``serve.ticket_id``), so a request run twice shows a 2 here, or a 1 on two
        replicas."""
        return dict(self._ran)

    def take_ttft_samples(self) -> List[List[float]]:
        """The TTFT samples since the previous call (and forget them)."""
        out = list(self._ttft)
        self._ttft.clear()
        return out

    def stats(self) -> dict:
        st = self.driver.stats()  # includes timestamp = time.time()
        st["served"] = self.served
        st["over_capacity_arrivals"] = self.over_capacity
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
    if max_tokens is None and isinstance(prompt_or_body, dict):  # the smaller of the two fields
        vals = [v for v in (prompt_or_body.get("max_completion_tokens"), prompt_or_body.get("max_tokens"))
                if v is not None]
        max_tokens = min(vals) if vals else None
    return text, max_tokens


class EmulatedEngineServer:
    """Plain Serve deployment class over one :class:`EmulatedEngine` (see the module docstring)."""

    def __init__(self, profile: str = "llama3.1-8b-h100", time_scale: float = 0.01, output_tokens: int = 16,
                 engine_overrides: Optional[Dict[str, Any]] = None, region: Optional[str] = None,
                 regions: Optional[List[str]] = None):
        self.engine = EmulatedEngine(profile, time_scale, output_tokens, engine_overrides)
        self.region = replica_region(region, regions)
        self.replica = replica_id()

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
