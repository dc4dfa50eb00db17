"""The engine model reports vLLM v1's per-request intervals (``FinishedRequestStats.queued_time`` /
``prefill_time``, ``num_cached_tokens``): queued = reached the scheduler -> first scheduled, prefill = first
scheduled -> first token, uncached = prompt - prefix-cache hit at the first scheduling."""

import pytest

from ray_geolb.engine.engine import EngineConfig, EngineModel, EngineRequest
from ray_geolb.engine.profiles import get_profile

PROFILE = get_profile("mistral-7b-a100")


def _drive(eng, until=1e9, durations=None):
    now, timings = 0.0, {}
    while eng.has_work() and now < until:
        nxt = eng.next_ready_time()
        now = max(now, nxt)
        out = eng.step(now)
        if durations is not None:
            durations.append(out.duration)
        for t in out.timings:
            timings[t.request_id] = (t, now + out.duration)
        assert sorted(t.request_id for t in out.timings) == sorted(out.first_tokens)
        now += out.duration
    return timings


def test_batch_one_prefill_is_the_step_and_the_second_request_queues_for_the_first():
    eng = EngineModel(PROFILE, EngineConfig.from_profile(PROFILE, ttft_overhead_s=0.05, max_num_seqs=1))
    eng.add_request(EngineRequest("a", 1000, 3), 0.0)
    eng.add_request(EngineRequest("b", 500, 2), 0.0)
    tm = _drive(eng)
    a, a_first = tm["a"]
    b, b_first = tm["b"]
    step_a = PROFILE.step_time([(1000, 0)])
    assert a.queued_s == pytest.approx(0.0) and a.prefill_s == pytest.approx(step_a) and a.uncached_tokens == 1000
    assert a_first == pytest.approx(0.05 + step_a)  # TTFT = overhead + prefill
    # b reached the scheduler at 0.05 too, but its slot was a's until a finished (3 tokens)
    assert b.queued_s > step_a and b.prefill_s == pytest.approx(PROFILE.step_time([(500, 0)]))
    assert b_first == pytest.approx(0.05 + b.queued_s + b.prefill_s)


def test_uncached_tokens_leave_out_the_prefix_cache_hit_at_first_scheduling():
    eng = EngineModel(PROFILE, EngineConfig.from_profile(PROFILE, ttft_overhead_s=0.0))
    B = eng.config.block_tokens
    hashes = list(range(1, 64))
    eng.add_request(EngineRequest("a", 40 * B, 1, hashes[:40]), 0.0)
    _drive(eng)
    eng.add_request(EngineRequest("b", 40 * B + 8, 1, hashes[:40]), 1.0)
    b, _t = _drive(eng)["b"]
    assert b.uncached_tokens == 8 and b.queued_s == pytest.approx(0.0)


def test_chunked_prefill_spans_steps_and_counts_them_all():
    eng = EngineModel(PROFILE, EngineConfig.from_profile(PROFILE, ttft_overhead_s=0.0, max_num_batched_tokens=512))
    eng.add_request(EngineRequest("long", 1500, 1), 0.0)
    t, first = _drive(eng)["long"]
    steps = PROFILE.step_time([(512, 0)]) + PROFILE.step_time([(512, 512)]) + PROFILE.step_time([(476, 1024)])
    assert t.prefill_s == pytest.approx(steps) and first == pytest.approx(steps)


def test_sglang_admission_reports_its_prefill_steps_as_the_vllm_model_does():
    """SGLang's scheduler runs prefill-only steps (engine/sglang.py); they are engine work like any other
    step: the report's ``engine_work`` counts their prompt tokens and time (a cost policy fits t_p on it)
    and every first token carries its request's intervals."""
    from ray_geolb.engine.factory import make_engine

    sgl = get_profile("llama3.1-8b-l4-sglang")
    eng = make_engine(sgl.name)
    B = sgl.block_tokens
    hashes = list(range(1, 80))
    eng.add_request(EngineRequest("a", 40 * B, 2, hashes[:40]), 0.0)
    eng.add_request(EngineRequest("b", 3000, 2), 0.0)
    durations = []
    tm = _drive(eng, durations=durations)
    eng.add_request(EngineRequest("c", 40 * B + 8, 2, hashes[:40]), 100.0)
    tm.update(_drive(eng, durations=durations))
    assert set(tm) == {"a", "b", "c"}
    assert tm["a"][0].uncached_tokens == 40 * B and tm["b"][0].uncached_tokens == 3000
    assert tm["c"][0].uncached_tokens < 2 * B  # its prefix was cached (the last block is recomputed)
    # b (3,000 tokens) is prefilled in two chunks of at most max_num_batched_tokens, after a's tokens
    assert tm["b"][0].prefill_s > sgl.step_time([(2048, 0)])
    work = eng.stats()["engine_work"]
    prefilled = 40 * B + 3000 + tm["c"][0].uncached_tokens
    assert work["prefill_tokens"] == prefilled
    assert work["decode_tokens"] == 3  # each request's second token (its first comes with its prefill)
    assert work["busy_s"] == pytest.approx(sum(durations))
    assert work["busy_s"] > sgl.step.gemm_per_token_s * prefilled
