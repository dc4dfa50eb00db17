"""The vLLM stat-logger path reports ``engine_work.prefill_pairs`` (no Ray started).

Real vLLM 0.29 objects: an ``IterationStats`` filled by its own ``update_from_output`` from
``EngineCoreOutput``s that carry the scheduler's per-request ``PrefillStats`` (as the output processor does
when a request's prefill completes). vLLM keeps only the iteration's totals (``prompt_token_stats``) and
one TTFT per request that finished prefill, so ``add_iteration_work`` adds ``R·(C + R/2) / n`` for ``n``
requests with ``R`` computed and ``C`` cached tokens in all: exact for one request, the average request's
pairs times ``n`` for several.
"""

import time

import pytest

from ray_geolb.serve.llm_server import guard_broken_torch_extras

guard_broken_torch_extras()  # this venv: CUDA torchvision / torchaudio 2.11 over torch 2.13+cpu
pytest.importorskip("vllm")

from vllm.v1.engine import EngineCoreOutput  # noqa: E402
from vllm.v1.metrics.stats import IterationStats, LoRARequestStates, PrefillStats, RequestStateStats, SchedulerStats  # noqa: E402

from ray_geolb.policy import ReplicaStats  # noqa: E402
from ray_geolb.serve import stats_plugin as sp  # noqa: E402


def _iteration(ts, prefills=(), decodes=0):
    """An IterationStats at ``ts`` in which each ``(prompt, local_cached)`` of ``prefills`` finished its
    prefill (first token) and ``decodes`` running requests produced one token each, filled by vLLM."""
    it = IterationStats()
    it.iteration_timestamp = ts
    lora = LoRARequestStates()
    for i, (prompt, cached) in enumerate(prefills):
        ps = PrefillStats()
        ps.set(num_prompt_tokens=prompt, num_local_cached_tokens=cached, num_external_cached_tokens=0)
        out = EngineCoreOutput(request_id=f"p{i}", new_token_ids=[1], prefill_stats=ps)
        it.update_from_output(out, ts, True, RequestStateStats(arrival_time=ts - 0.1), lora, None)
    for i in range(decodes):
        out = EngineCoreOutput(request_id=f"d{i}", new_token_ids=[2])
        it.update_from_output(out, ts, False, RequestStateStats(arrival_time=ts - 1.0, last_token_ts=ts - 0.02),
                              lora, None)
    return it


def test_prefill_pairs_from_vllm_iteration_stats():
    sp.reset_stats()
    lg = sp.GeoStatLogger(vllm_config=None, engine_index=0)
    run = SchedulerStats(num_running_reqs=3, num_waiting_reqs=0, kv_cache_usage=0.2)
    t0 = time.time()
    lg.record(run, _iteration(t0, decodes=2))  # the first iteration: the cold step, never counted
    assert sp.latest_stats().get("engine_work") is None
    # one request: 2,048 computed after 24,576 cached -> exactly 2048 * (24576 + 1024) pairs
    it = _iteration(t0 + 0.05, prefills=[(26_624, 24_576)], decodes=2)
    assert (it.prompt_token_stats.computed, it.prompt_token_stats.cached_tokens) == (2048, 24_576)
    assert len(it.time_to_first_tokens_iter) == 1 and it.num_generation_tokens == 3
    lg.record(run, it)
    w = sp.latest_stats()["engine_work"]
    assert w["steps"] == 1 and w["prefill_tokens"] == 2048 and w["decode_tokens"] == 2
    assert w["prefill_pairs"] == pytest.approx(2048 * (24_576 + 1024))
    # two requests in one iteration: (1000 after 3000) and (500 from zero) -> totals R = 1500, C = 3000, n = 2
    lg.record(run, _iteration(t0 + 0.10, prefills=[(4000, 3000), (500, 0)]))
    w2 = sp.latest_stats()["engine_work"]
    exact = 1000 * (3000 + 500) + 500 * 250
    approx = 1500 * (3000 + 750) / 2
    assert w2["prefill_pairs"] - w["prefill_pairs"] == pytest.approx(approx)
    assert abs(approx - exact) / exact < 0.25  # the documented approximation, here 3.6 % low
    # a decode-only iteration adds no pairs; the report parses with the new field
    lg.record(run, _iteration(t0 + 0.15, decodes=3))
    w3 = sp.latest_stats()["engine_work"]
    assert w3["prefill_pairs"] == w2["prefill_pairs"] and w3["steps"] == 3
    rs = ReplicaStats.from_dict(sp.latest_stats())
    assert rs.engine_work == (3.0, 3548.0, 5.0, pytest.approx(0.15), pytest.approx(w3["prefill_pairs"]))
    sp.reset_stats()
    assert sp.latest_stats() == {}


def test_an_iteration_that_wakes_an_idle_engine_lasts_its_shortest_time_to_first_token():
    sp.reset_stats()
    t0 = time.time()
    # the engine's first iteration is its cold step: never counted
    assert not sp.add_iteration_work(_iteration(t0, prefills=[(1000, 0)]), running=1)
    assert sp.add_iteration_work(_iteration(t0 + 0.04, prefills=[(1000, 500)]), running=0)
    assert sp._WORK["busy_s"] == pytest.approx(0.04)
    # the previous iteration left nothing running: the gap is idle time; the prefill that wakes the engine
    # is counted with its own time to first token (its request arrived 0.1 s before it ended, ``_iteration``)
    assert sp.add_iteration_work(_iteration(t0 + 5.0, prefills=[(9000, 0)]), running=1)
    assert sp._WORK["busy_s"] == pytest.approx(0.14) and sp._WORK["prefill_tokens"] == 500 + 9000
    # a decode-only iteration after an idle gap has no first token to time it: not counted
    sp.add_iteration_work(_iteration(t0 + 5.1, decodes=1), running=0)
    assert not sp.add_iteration_work(_iteration(t0 + 9.0, decodes=1), running=1)
    assert sp._WORK["steps"] == 3
    sp.reset_stats()


def test_requests_that_waited_for_the_cold_first_step_give_no_ttft_sample():
    from vllm.v1.metrics.stats import FinishedRequestStats

    sp.reset_stats()
    lg = sp.GeoStatLogger(vllm_config=None, engine_index=0)
    run = SchedulerStats(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.1)
    t0 = time.time()
    lg.record(run, _iteration(t0, prefills=[(186, 0)]))  # the cold step, 2.4 s long on a vLLM CPU engine

    def finished(ts, e2e, ttft):
        it = _iteration(ts, decodes=1)
        it.finished_requests.append(FinishedRequestStats(
            finish_reason=None, e2e_latency=e2e, num_prompt_tokens=186, num_generation_tokens=8,
            queued_time=0.001, prefill_time=ttft - 0.001, num_cached_tokens=0))
        return it

    lg.record(run, finished(t0 + 0.1, e2e=2.6, ttft=2.38))  # arrived before the cold step ended
    lg.record(run, finished(t0 + 0.2, e2e=0.05, ttft=0.008))  # arrived after it
    assert sp.take_ttft_samples() == [[186, pytest.approx(0.008)]]
    sp.reset_stats()
