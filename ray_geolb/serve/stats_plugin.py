"""Real vLLM replicas: make waiting/running/KV usage visible to GeoPrefixRouter.

Ray Serve LLM's stock ``LLMServer.record_routing_stats`` returns only KV-event endpoint metadata
(no load). vLLM 0.29 auto-loads *stat logger plugins* (entry-point group
``vllm.stat_logger_plugins``, which must name a ``StatLoggerBase`` subclass) into every ``AsyncLLM``
and turns stats on for them. :class:`GeoStatLogger` is such a plugin: each ``record()`` stores the
latest ``SchedulerStats`` (num_waiting_reqs, num_running_reqs, kv_cache_usage) plus the engine's
capacity (max_num_seqs, num_gpu_blocks, block_size) in a module global, and :class:`GeoVLLMServer`
(an ``LLMServer`` subclass, built lazily) returns them from ``record_routing_stats``, with
``ttft_samples`` = ``[[uncached_prompt_tokens, ttft_s], ...]`` of the requests that finished since the
previous report (from ``IterationStats.finished_requests``; see :func:`ttft_sample` for what vLLM
provides and what it does not), which GeoPrefixRouter feeds to the policy's online t_p model, and
``engine_work`` = the engines' cumulative step work (:func:`add_iteration_work`), which GeoPrefix's t_p
is fitted on (prefill time, not TTFT).

The entry point is declared in pyproject.toml::

    [project.entry-points."vllm.stat_logger_plugins"]
    ray_geolb = "ray_geolb.serve.stats_plugin:GeoStatLogger"

and becomes visible after ``pip install -e .``. Note that vLLM loads it into every AsyncLLM in the
environment (set ``VLLM_PLUGINS`` to restrict plugins).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional

from vllm.v1.metrics.loggers import StatLoggerBase

__all__ = ["GeoStatLogger", "add_iteration_work", "latest_stats", "reset_stats", "routing_stats", "take_ttft_samples",
           "ttft_sample", "TTFT_SAMPLES_KEPT", "IDLE_GRACE_S", "MAX_ITERATION_GAP_S"]

logger = logging.getLogger("ray.serve")

_LOCK = threading.Lock()
_LATEST: Dict[int, Dict[str, Any]] = {}  # engine index -> stats dict
_CAPACITY: Dict[int, Dict[str, Any]] = {}
#: TTFT samples kept between two reports (oldest dropped beyond)
TTFT_SAMPLES_KEPT = 256
_TTFT: Deque[List[float]] = deque(maxlen=TTFT_SAMPLES_KEPT)
#: the same samples, ``[uncached_prompt_tokens, ttft_s, e2e_s]``, kept for the operator's view
#: (``GeoVLLMServer.engine_report``) and not consumed by reports
_TTFT_SEEN: Deque[List[float]] = deque(maxlen=TTFT_SAMPLES_KEPT)
#: cumulative step work of this process's engines (``engine_work``; see :func:`add_iteration_work`)
_WORK: Dict[str, float] = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "busy_s": 0.0, "prefill_pairs": 0.0}
_LAST_ITER: Dict[int, tuple] = {}  # engine index -> (iteration timestamp, it had requests running)
#: engine index -> when its first iteration ended: the cold step (see :func:`add_iteration_work`)
_FIRST_ITER: Dict[int, float] = {}
#: cumulative prefix-cache lookups of this process's engines, in tokens (vLLM's ``PrefixCacheStats``)
_CACHE: Dict[str, int] = {"prefix_cache_queries": 0, "prefix_cache_hits": 0}
#: a gap between two iterations longer than this is not counted as busy time (the engine idled)
MAX_ITERATION_GAP_S = 1.0


def latest_stats() -> Dict[str, Any]:
    """Stats summed over this process's engines (data-parallel ranks), ``{}`` before the first record."""
    with _LOCK:
        if not _LATEST:
            return {}
        out: Dict[str, Any] = {"num_waiting": 0, "num_running": 0}
        kv = []
        ts = 0.0
        for idx, s in _LATEST.items():
            out["num_waiting"] += s["num_waiting"]
            out["num_running"] += s["num_running"]
            if s.get("kv_cache_usage") is not None:
                kv.append(s["kv_cache_usage"])
            ts = max(ts, s["timestamp"])
            for k, v in _CAPACITY.get(idx, {}).items():
                if v is not None:
                    out[k] = out.get(k, 0) + v if k != "block_tokens" else v
        if kv:
            out["kv_cache_usage"] = sum(kv) / len(kv)
        out["timestamp"] = ts
        if _WORK["steps"]:
            out["engine_work"] = dict(_WORK)
        if _CACHE["prefix_cache_queries"]:
            out.update(_CACHE)
        return out


#: a server with no request in flight for this long reports an idle engine (see :func:`routing_stats`)
IDLE_GRACE_S = 0.25


def routing_stats(latest: Dict[str, Any], active: int, idle_since: float, now: float,
                  grace_s: float = IDLE_GRACE_S) -> Dict[str, Any]:
    """The load report of a vLLM-backed server: the engine's last ``SchedulerStats`` (``latest``, from
    :func:`latest_stats`) unless the server has had no request in flight (``active == 0``) for
    ``grace_s`` -- then the engine is idle whatever it last recorded, and the report says so with a
    fresh timestamp. vLLM records stats only when the engine steps: after an aborted request left it
    idle, its last record would claim ``num_waiting=1`` for good and selective pushing would shun an
    idle replica (the router also distrusts such frozen reports; this fixes them at the source)."""
    out = dict(latest)
    if active <= 0 and now - idle_since >= grace_s and (out.get("num_waiting") or out.get("num_running")):
        out["num_waiting"] = 0
        out["num_running"] = 0
        out["timestamp"] = now
    return out


def reset_stats() -> None:
    with _LOCK:
        _LATEST.clear()
        _CAPACITY.clear()
        _TTFT.clear()
        _TTFT_SEEN.clear()
        _LAST_ITER.clear()
        _FIRST_ITER.clear()
        _WORK.update(steps=0, prefill_tokens=0, decode_tokens=0, busy_s=0.0, prefill_pairs=0.0)
        _CACHE.update(prefix_cache_queries=0, prefix_cache_hits=0)


def add_iteration_work(iteration_stats: Any, running: Optional[int], engine_idx: int = 0) -> bool:
    """Add one vLLM iteration to the cumulative ``engine_work`` the router fits t_p on (prefill time, not
    TTFT: ``policy/ttft_model.py``, ``source='engine_steps'``). From ``IterationStats`` (vLLM 0.29,
    ``vllm/v1/metrics/stats.py``): ``prompt_token_stats.computed`` (prompt tokens prefilled locally,
    counted when a request's prefill completes, so a chunked prompt lands on its last chunk's iteration),
    ``num_generation_tokens`` minus the first tokens (``time_to_first_tokens_iter``, one per request
    that finished prefill) as decode tokens, and as busy time the gap since this engine's previous
    iteration when that one had requests running (``SchedulerStats.num_running_reqs``) and the gap is
    under :data:`MAX_ITERATION_GAP_S` -- or, for an iteration that woke an idle engine, its shortest time
    to first token (:func:`_after_idle_s`). Approximate per iteration; a router fits over many of them.

    The engine's very first iteration is never counted: on a cold engine it sets up its kernels, and a
    vLLM CPU engine's first step took 2.4 s for 186 tokens where the next took 8 ms (a GPU engine's
    first step is slow too). The TTFT samples of the requests that were waiting for it are dropped
    for the same reason (:meth:`GeoStatLogger.record`).
    False (nothing added) when the stats lack these fields.

    ``prefill_pairs`` (the prefill-attention work GeoPrefix prices the cached context with): a request
    whose prefill completes here, with ``R`` prompt tokens computed locally after ``c`` cached ones, adds
    ``R·(c + R/2)`` (its chunks' ``P·(c + P/2)`` summed). vLLM 0.29 gives no per-request breakdown at prefill
    completion: ``IterationStats.update_from_output`` folds each request's ``PrefillStats``
    (``num_computed_tokens``, ``num_cached_tokens``) into the iteration's totals ``prompt_token_stats``
    (``computed``, ``cached_tokens`` = local prefix-cache + external KV-transfer hits), and
    ``time_to_first_tokens_iter`` gets one entry per request that finished prefill (no ids, no sizes);
    ``FinishedRequestStats`` has ``num_prompt_tokens`` / ``num_cached_tokens`` per request but only when
    the request *finishes*, possibly many reports later, in another interval. So with ``n`` requests
    finishing prefill here, ``R_tot`` computed and ``C_tot`` cached tokens, we add
    ``R_tot·(C_tot + R_tot/2) / n``: each request taken as the average one. Exact for ``n = 1`` (the
    common case with long prompts: one prompt fills the token budget); for ``n > 1`` it underestimates
    ``Σ R_i²/2`` (convexity) and replaces ``Σ R_i·c_i`` by ``R_tot·C_tot/n``. Like ``prefill_tokens``, it
    counts a request's first prefill only: vLLM records ``PrefillStats`` at the first scheduling and emits
    them with the first token, so a re-prefill after a preemption is in neither ``computed`` nor ``n``."""
    try:
        ts = float(iteration_stats.iteration_timestamp)
        gen = int(iteration_stats.num_generation_tokens)
        firsts = len(getattr(iteration_stats, "time_to_first_tokens_iter", ()) or ())
        pts = getattr(iteration_stats, "prompt_token_stats", None)
        prefill = int(pts.computed) if pts is not None else 0
        cached = int(getattr(pts, "cached_tokens", 0) or 0) if pts is not None else 0
    except (AttributeError, TypeError, ValueError, OverflowError):
        return False
    if not math.isfinite(ts) or gen < 0 or prefill < 0:
        return False
    pairs = prefill * (max(0, cached) + 0.5 * prefill) / max(1, firsts) if prefill > 0 else 0.0
    with _LOCK:
        prev = _LAST_ITER.get(engine_idx)
        _LAST_ITER[engine_idx] = (ts, bool(running))
        if prev is None:  # the engine's first iteration: its cold step (see below), never counted
            _FIRST_ITER.setdefault(engine_idx, ts)
            return False
        if prev[1] and 0.0 < ts - prev[0] <= MAX_ITERATION_GAP_S:
            busy = ts - prev[0]
        else:  # one after an idle gap: see _after_idle_s
            busy = _after_idle_s(iteration_stats, prefill, firsts)
            if busy is None:
                return False
        _WORK["steps"] += 1
        _WORK["prefill_tokens"] += prefill
        _WORK["decode_tokens"] += max(0, gen - firsts)
        _WORK["busy_s"] += busy
        _WORK["prefill_pairs"] += pairs
    return True


def _after_idle_s(iteration_stats: Any, prefill: int, firsts: int) -> Optional[float]:
    """The duration of an iteration that started on an idle engine, or None when it is unknown.

    Every request that got its first token in such an iteration had arrived before the iteration began
    (an idle engine schedules what it has at once, and a request arriving during a step waits for the
    next one), so the iteration lasted at most its shortest time to first token, and about that long
    (the frontend's IPC is a few ms). An iteration with no first token (a decode, or a chunk of a longer
    prefill) is left out. Without this, every prefill on a lightly loaded engine -- the one that wakes
    it -- was dropped from ``engine_work``, and t_p was fitted on busy engines only (found by the
    real-engine test: a replica serving one request at a time reported almost no prefill)."""
    if prefill <= 0 or firsts <= 0:
        return None
    try:
        ttft = min(float(x) for x in iteration_stats.time_to_first_tokens_iter)
    except (AttributeError, TypeError, ValueError):
        return None
    return ttft if 0.0 < ttft <= MAX_ITERATION_GAP_S else None


def take_ttft_samples() -> List[List[float]]:
    """``[[uncached_prompt_tokens, ttft_s], ...]`` recorded since the previous call (then forgotten)."""
    with _LOCK:
        out = list(_TTFT)
        _TTFT.clear()
    return out


def ttft_sample(fr: Any) -> Optional[List[float]]:
    """``[uncached_prompt_tokens, ttft_s]`` of one vLLM ``FinishedRequestStats``, or None.

    What vLLM 0.29 really gives per request (``vllm/v1/metrics/stats.py``): ``FinishedRequestStats``
    has ``num_prompt_tokens``, ``num_cached_tokens`` (local prefix-cache + external KV-transfer hits
    at its first scheduling) and ``queued_time`` (first QUEUED -> first SCHEDULED) and
    ``prefill_time`` (first SCHEDULED -> first token), both from engine-core monotonic timestamps.
    There is **no per-request TTFT field**: ``IterationStats.time_to_first_tokens_iter`` holds TTFTs
    from the frontend's arrival time, but without request ids or token counts, so they cannot be
    paired with a prompt length. We therefore use ``ttft_s = queued_time + prefill_time``: the
    engine core's TTFT (queued to first token, preemptions during prefill included), real seconds.
    It leaves out the API server's fixed overhead (tokenisation, IPC), which only shifts the fitted
    intercept, not t_p. Samples arrive when the request *finishes* (vLLM has no per-request stats
    at first token). Aborted requests that never produced a token, and ones without the QUEUED /
    SCHEDULED events (stats off: the interval would be measured from 0.0, longer than the request's
    ``e2e_latency``), are skipped.
    """
    try:
        prompt = int(fr.num_prompt_tokens)
        cached = int(getattr(fr, "num_cached_tokens", 0) or 0)
        q, p = float(fr.queued_time), float(fr.prefill_time)
        gen = int(getattr(fr, "num_generation_tokens", 1))
        e2e = float(getattr(fr, "e2e_latency", 0.0) or 0.0)
    except (AttributeError, TypeError, ValueError):
        return None
    ttft = q + p
    if prompt <= 0 or gen <= 0 or q < 0 or p <= 0 or not math.isfinite(ttft):
        return None
    if e2e > 0 and ttft > 1.05 * e2e + 0.05:  # a missing QUEUED/SCHEDULED timestamp (0.0) shows up here
        return None
    return [max(0, prompt - cached), ttft]


def _waited_for_the_cold_step(iteration_stats: Any, fr: Any, engine_idx: int) -> bool:
    """Whether a finished request had arrived by the end of its engine's first iteration (the cold step:
    its TTFT measures the engine's warm-up, not its prefill)."""
    with _LOCK:
        first = _FIRST_ITER.get(engine_idx)
    if first is None:
        return True  # finished before any iteration was recorded: it was served by the cold step
    try:
        arrival = float(iteration_stats.iteration_timestamp) - float(fr.e2e_latency)
    except (AttributeError, TypeError, ValueError):
        return False
    return arrival <= first


class GeoStatLogger(StatLoggerBase):
    """vLLM stat-logger plugin: keeps the latest scheduler stats for ``record_routing_stats``."""

    def __init__(self, vllm_config: Any = None, engine_index: int = 0):
        self.engine_index = engine_index
        cap: Dict[str, Any] = {}
        try:
            cap["max_num_seqs"] = vllm_config.scheduler_config.max_num_seqs
        except Exception:
            pass
        try:
            cap["block_tokens"] = vllm_config.cache_config.block_size
            cap["num_gpu_blocks"] = vllm_config.cache_config.num_gpu_blocks
        except Exception:
            pass
        self._cap = cap
        self.bad_records = 0
        with _LOCK:
            _CAPACITY[engine_index] = dict(cap)

    def record(self, scheduler_stats=None, iteration_stats=None, mm_cache_stats=None, engine_idx: int = 0):
        finished = getattr(iteration_stats, "finished_requests", None) if iteration_stats is not None else None
        if finished:
            pairs = [(x, fr) for x, fr in ((ttft_sample(fr), fr) for fr in finished)
                     if x is not None and not _waited_for_the_cold_step(iteration_stats, fr, engine_idx)]
            if pairs:
                with _LOCK:
                    _TTFT.extend(x for x, _ in pairs)
                    _TTFT_SEEN.extend([*x, float(getattr(fr, "e2e_latency", 0.0) or 0.0)] for x, fr in pairs)
        if iteration_stats is not None:
            add_iteration_work(iteration_stats, getattr(scheduler_stats, "num_running_reqs", None), engine_idx)
        if scheduler_stats is None:
            return
        pcs = getattr(scheduler_stats, "prefix_cache_stats", None)
        try:
            q, h = int(pcs.queries), int(pcs.hits)
        except (AttributeError, TypeError, ValueError):
            q = h = 0
        if 0 <= h <= q:
            with _LOCK:
                _CACHE["prefix_cache_queries"] += q
                _CACHE["prefix_cache_hits"] += h
        try:
            s = {
                "num_waiting": int(scheduler_stats.num_waiting_reqs),
                "num_running": int(scheduler_stats.num_running_reqs),
                "kv_cache_usage": float(scheduler_stats.kv_cache_usage),
                "timestamp": time.time(),
            }
        except (AttributeError, TypeError, ValueError, OverflowError):  # NaN counts: int() raises
            s = None
        if s is None or s["num_waiting"] < 0 or s["num_running"] < 0 or not 0.0 <= s["kv_cache_usage"] <= 1.0:
            self.bad_records += 1  # keep the previous report; the router would reject this one anyway
            if self.bad_records in (1, 10, 100, 1000):
                logger.warning("GeoStatLogger: ignored %d malformed SchedulerStats (last: %r)",
                               self.bad_records, scheduler_stats)
            return
        with _LOCK:
            _LATEST[engine_idx] = s

    def log_engine_initialized(self):
        # num_gpu_blocks is only known once the engine profiled memory
        with _LOCK:
            cap = _CAPACITY.setdefault(self.engine_index, {})
            cap.update({k: v for k, v in self._cap.items() if v is not None})

    def log(self):
        pass


_LAZY: Dict[str, Any] = {}


def _build_server():
    if _LAZY:
        return _LAZY["GeoVLLMServer"]
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    from ray_geolb.serve.direct_streaming import refuse_direct_streaming
    from ray_geolb.serve.emulated import REGION_OPTIONS_KEY, replica_region

    class GeoVLLMServer(LLMServer):
        """Stock vLLM LLMServer whose routing stats carry the engine's load (from GeoStatLogger).

        It counts its own requests in flight (a ``finally`` owns the count, so a cancelled stream
        returns it) to report an idle engine as idle (:func:`routing_stats`)."""

        _geo_active = 0
        _geo_idle_since = float("-inf")

        async def _geo_counted(self, stream):
            self._geo_active += 1
            try:
                async for item in stream:
                    yield item
            finally:
                self._geo_active -= 1
                if self._geo_active == 0:
                    self._geo_idle_since = time.time()
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()

        async def chat(self, request, raw_request_info=None):
            return self._geo_counted(await super().chat(request, raw_request_info))

        async def completions(self, request, raw_request_info=None):
            return self._geo_counted(await super().completions(request, raw_request_info))

        async def record_routing_stats(self) -> Dict[str, Any]:
            base = await super().record_routing_stats()
            out = dict(base or {})
            out.update(routing_stats(latest_stats(), self._geo_active, self._geo_idle_since, time.time()))
            samples = take_ttft_samples()
            if samples:
                out["ttft_samples"] = samples
            return out

        async def engine_report(self) -> Dict[str, Any]:
            """What this replica's engine reported, for an operator or a test to hold against the router's
            view (outside the routing path; nothing is consumed): the latest stats and the last TTFT
            samples as ``[uncached_prompt_tokens, ttft_s, e2e_s]``."""
            import ray

            with _LOCK:
                seen = [list(x) for x in _TTFT_SEEN]
            return {"stats": latest_stats(), "active": self._geo_active, "ttft_samples_seen": seen,
                    "node_labels": dict(ray.get_runtime_context().get_node_labels())}

        def record_replica_metadata(self) -> dict:
            o = (self._llm_config.experimental_configs or {}).get(REGION_OPTIONS_KEY) or {}
            return {"region": replica_region(o.get("region"), o.get("regions"))}

        @classmethod
        def get_deployment_options(cls, llm_config):
            refuse_direct_streaming(f"GeoVLLMServer for {llm_config.model_id!r}", llm_config)
            return super().get_deployment_options(llm_config)

    GeoVLLMServer.__module__ = __name__
    GeoVLLMServer.__qualname__ = "GeoVLLMServer"
    _LAZY["GeoVLLMServer"] = GeoVLLMServer
    return GeoVLLMServer


def __getattr__(name):
    if name == "GeoVLLMServer":
        return _build_server()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
