"""SGLang admission semantics of the engine model (ray_geolb.engine.sglang), hand-computed cases.

Numbers in the comments: A = (free + evictable blocks) x 16 tokens; reserved = running requests'
min(max_new - output, 4096) x new_token_ratio + this batch's extend + max_new (schedule_policy.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_geolb.engine.engine import EngineConfig, EngineModel, EngineRequest, request_fits
from ray_geolb.engine.factory import make_engine
from ray_geolb.engine.profiles import EngineProfile, get_profile
from ray_geolb.engine.sglang import SGLangEngineModel, sglang_reservation
from ray_geolb.engine.tokens import blocks_from_hash_ids

L4 = get_profile("llama3.1-8b-l4")
DECAY = (0.7 - 0.7 * 0.14) / 600


def make(**over) -> SGLangEngineModel:
    over.setdefault("admission", "sglang")
    over.setdefault("ttft_overhead_s", 0.0)
    eng = make_engine(L4, EngineConfig.from_profile(L4, **over))
    assert type(eng) is SGLangEngineModel
    return eng


def req(rid, p, o, max_new, hashes=()):
    return EngineRequest(rid, p, o, hashes, max_new)


def test_vllm_profiles_build_the_vllm_model_and_report_the_same_keys():
    eng = make_engine(L4)
    assert type(eng) is EngineModel and L4.admission == "vllm"
    sg = make()
    assert set(sg.stats()) == set(eng.stats()) | {"new_token_ratio"}
    assert sg.stats()["new_token_ratio"] == pytest.approx(0.7)


@pytest.mark.parametrize("max_new,admitted", [(418, True), (419, False)])
def test_admission_boundary_counts_the_running_reservation(max_new, admitted):
    eng = make(num_gpu_blocks=100)  # 1,600 tokens
    eng.add_request(req("a", 100, 50, 100), 0.0)
    out = eng.step(0.0)  # prefill a: 100 tokens in 7 blocks; a sampled its first token
    assert out.first_tokens == ["a"] and out.num_prefill_tokens == 100
    # A = 93 x 16 = 1,488; reserved = (100 - 1) x 0.7 = 69.3 -> b needs 1,000 + max_new < 1,418.7
    eng.add_request(req("b", 1000, 10, max_new), 1.0)
    out = eng.step(1.0)
    if admitted:
        assert out.num_prefill_tokens == 1000 and out.first_tokens == ["b"]
        assert eng.stats()["num_waiting"] == 0
    else:  # a decode step instead: prefill-only or decode-only steps
        assert out.num_prefill_tokens == 0 and out.num_decode_seqs == 1
        assert eng.stats()["num_waiting"] == 1 and eng._batch_full


def test_batch_full_clears_one_decode_step_after_a_finish():
    eng = make(num_gpu_blocks=100)
    eng.add_request(req("a", 320, 3, 200), 0.0)
    eng.add_request(req("c", 320, 50, 200), 0.0)
    out = eng.step(0.0)  # both admitted: 520 < 1,600 and 520 < 1,600 - 520
    assert sorted(out.first_tokens) == ["a", "c"]
    # A = 60 x 16 = 960; reserved = 2 x 199 x 0.7 = 278.6; b: 320 + 400 >= 681.4 -> no token
    eng.add_request(req("b", 320, 5, 400), 0.0)
    kinds = []
    now = 0.0
    for _ in range(5):
        out = eng.step(now)
        now += out.duration
        kinds.append(("prefill" if out.num_prefill_tokens else "decode", tuple(out.finished),
                      eng.stats()["num_waiting"]))
    assert kinds == [
        ("decode", (), 1),  # blocked, latched
        ("decode", ("a",), 1),  # a finishes; the latch holds (the ratio decaying does not clear it)
        ("decode", (), 1),  # this decode step sees the batch shrink and clears the latch
        ("prefill", (), 0),  # now b fits: A = 79 x 16, reserved = (200 - 4) x ratio
        ("decode", (), 0),
    ]


@pytest.mark.parametrize("a_max_new,b_admitted", [(300, True), (310, False)])
def test_chunked_prompt_reserves_its_output_with_the_last_chunk(a_max_new, b_admitted):
    eng = make(num_gpu_blocks=60, max_num_batched_tokens=256)  # 960 tokens, chunks of 256
    eng.add_request(req("a", 600, 5, a_max_new), 0.0)
    eng.add_request(req("b", 40, 5, 10), 0.0)
    sizes = []
    now = 0.0
    for _ in range(3):
        out = eng.step(now)
        now += out.duration
        sizes.append((out.num_prefill_tokens, sorted(out.first_tokens)))
    # chunks 256, 256 (b waits: the chunk budget is spent), then a's last 88 tokens. With them a reserves
    # its max_new: A = 28 x 16 = 448, reserved = 88 + a_max_new; b (40 + 10) fits iff 50 < 448 - reserved
    assert sizes[:2] == [(256, []), (256, [])]
    assert sizes[2] == ((128, ["a", "b"]) if b_admitted else (88, ["a"]))


def test_head_of_line_blocking_is_fcfs():
    eng = make(num_gpu_blocks=100)
    eng.add_request(req("run", 100, 40, 100), 0.0)
    eng.step(0.0)
    eng.add_request(req("big", 1000, 5, 500), 0.0)  # 1,500 >= 1,488 - 69.3: no token
    eng.add_request(req("small", 16, 5, 8), 0.0)  # would fit, but waits behind the head
    out = eng.step(0.0)
    assert out.num_prefill_tokens == 0 and eng.stats()["num_waiting"] == 2


def test_new_token_ratio_decays_on_decode_steps_only_and_resets_when_idle():
    eng = make()
    eng.add_request(req("a", 100, 700, 700), 0.0)
    eng.step(0.0)  # prefill: the ratio stays
    assert eng.stats()["new_token_ratio"] == pytest.approx(0.7)
    for k in range(1, 650):
        eng.step(float(k))
        assert eng.stats()["new_token_ratio"] == pytest.approx(max(0.7 - k * DECAY, 0.098), abs=1e-9)
    now = 650.0
    while eng.has_work():
        now += eng.step(now).duration
    assert eng.stats()["new_token_ratio"] == pytest.approx(0.7)


def test_retraction_takes_fewest_outputs_first_keeps_headroom_and_requeues_at_the_end():
    # a low, flat ratio under-reserves, so decoding runs out of blocks
    eng = make(num_gpu_blocks=30, sgl_init_new_token_ratio=0.1, sgl_min_new_token_ratio_factor=1.0)
    for i in range(3):
        eng.add_request(req(f"r{i}", 64, 200, 200), 0.0)
    eng.add_request(req("late", 16, 5, 5), 0.0)
    now, seen = 0.0, []
    while eng.has_work():
        before = {s.id: (s.num_output, s.max_new) for s in eng._running}
        out = eng.step(now)
        eng._check_invariants()
        now += out.duration
        if out.preempted:
            victims = out.preempted
            left = [rid for rid in before if rid not in victims]
            # the victims had the fewest outputs
            assert max(before[v][0] for v in victims) <= min(before[rid][0] for rid in left)
            # headroom: 20 tokens per remaining request were free after the retraction (the decode
            # step then took at most one block each), or only one request is left
            n = len(left)
            assert n == 1 or (eng._num_free + len(eng._lru)) * 16 + 16 * n >= 20 * n
            assert [s.id for s in list(eng._waiting)[-len(victims):]] == victims  # end of the queue
            outs = sum(before[rid][0] for rid in left)
            assert eng.stats()["new_token_ratio"] == pytest.approx(
                min(1.0, (outs + 20 * n) / sum(before[rid][1] for rid in left)))
            seen.append(victims)
    assert seen, "the scenario must retract"
    assert eng.stats()["num_preempted"] == sum(map(len, seen))


def test_requests_sglang_could_never_admit_are_rejected():
    c = EngineConfig.from_profile(L4, admission="sglang", num_gpu_blocks=100)
    assert request_fits(c, 1000, 10, 500) and not request_fits(c, 1000, 10, 600)  # 1,600 tokens
    # no max_tokens: max_new = max_req_len - p - 1 = 1,599 - 101, so the request just fits
    assert sglang_reservation(c, 100, None) == 1498 and request_fits(c, 100, 10, None)
    assert sglang_reservation(EngineConfig.from_profile(L4, admission="sglang"), 100, None) == 4096  # clipped
    eng = make(num_gpu_blocks=100)
    with pytest.raises(ValueError, match="can never be admitted"):
        eng.add_request(req("x", 1000, 10, 600), 0.0)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= output_tokens"):
        eng.add_request(req("y", 10, 20, 10), 0.0)
    vllm = EngineConfig.from_profile(L4, num_gpu_blocks=100)
    assert request_fits(vllm, 1000, 10, 600)  # vLLM reserves nothing


def test_admission_fields_are_validated():
    with pytest.raises(ValueError, match="admission must be one of"):
        dataclasses.replace(L4, admission="trt")
    with pytest.raises(ValueError, match="sgl_init_new_token_ratio must be in"):
        EngineConfig.from_profile(L4, sgl_init_new_token_ratio=1.5)
    with pytest.raises(ValueError, match="sgl_retract_decode_steps must be an int >= 1"):
        EngineProfile(**{**{f.name: getattr(L4, f.name) for f in dataclasses.fields(L4)},
                         "sgl_retract_decode_steps": 0})


req_strategy = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 120), st.integers(0, 3), st.floats(0.0, 2.0),
              st.integers(0, 150)),
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=req_strategy, blocks=st.integers(40, 80), budget=st.integers(16, 600), caching=st.booleans(),
       ratio=st.floats(0.05, 1.0))
def test_property_all_finish_and_block_accounting(reqs, blocks, budget, caching, ratio):
    eng = make(num_gpu_blocks=blocks, max_num_batched_tokens=budget, enable_prefix_caching=caching,
               sgl_init_new_token_ratio=ratio)
    arrivals = sorted((t, f"r{i}", p, o, fam, extra) for i, (p, o, fam, t, extra) in enumerate(reqs))
    fam_ids = {fam: list(range(fam * 1000, fam * 1000 + 30)) for fam in range(4)}
    expected, ntok, first, fin = {}, {}, set(), set()
    now, k = 0.0, 0
    for _ in range(200_000):
        while k < len(arrivals) and arrivals[k][0] <= now:
            t, rid, p, o, fam, extra = arrivals[k]
            k += 1
            r = EngineRequest(rid, p, o, blocks_from_hash_ids(fam_ids[fam])[: p // 16], o + extra)
            if not request_fits(eng.config, p, o, o + extra):
                with pytest.raises(ValueError):
                    eng.add_request(r, t)
                continue
            eng.add_request(r, t)
            expected[rid] = o
        nxt = eng.next_ready_time()
        if nxt is None:
            if k == len(arrivals):
                break
            now = arrivals[k][0]
            continue
        now = max(now, nxt)
        out = eng.step(now)
        eng._check_invariants()
        assert 0.0 < eng.stats()["new_token_ratio"] <= 1.0
        assert out.duration > 0.0, "an SGLang engine with work always runs a prefill or a decode step"
        now += out.duration
        assert not (out.num_prefill_tokens and out.num_decode_seqs)  # one kind of batch per step
        first.update(out.first_tokens)
        for r in out.tokens:
            ntok[r] = ntok.get(r, 0) + 1
        fin.update(out.finished)
    assert fin == first == set(expected)
    assert ntok == expected
    assert not eng.has_work() and eng.stats()["kv_cache_usage"] == 0.0
