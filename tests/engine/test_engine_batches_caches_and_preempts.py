"""Tests of the vLLM-v1-style engine state machine (ray_geolb.engine.engine)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_geolb.engine.engine import EngineConfig, EngineModel, EngineRequest
from ray_geolb.engine.profiles import get_profile
from ray_geolb.engine.tokens import blocks_from_hash_ids, prompt_blocks

PROFILE = get_profile("mistral-7b-a100")


def make(**over) -> EngineModel:
    over.setdefault("ttft_overhead_s", 0.0)
    return EngineModel(PROFILE, EngineConfig.from_profile(PROFILE, **over))


def run(eng: EngineModel, now: float = 0.0, max_steps: int = 100_000, check=False):
    """Step until idle; returns (now, {rid: first_token_time}, {rid: finish_time}, counts)."""
    first, fin, ntok = {}, {}, {}
    for _ in range(max_steps):
        t = eng.next_ready_time()
        if t is None:
            return now, first, fin, ntok
        now = max(now, t)
        out = eng.step(now)
        if check:
            eng._check_invariants()
        now += out.duration
        for r in out.first_tokens:
            assert r not in first
            first[r] = now
        for r in out.tokens:
            ntok[r] = ntok.get(r, 0) + 1
        for r in out.finished:
            assert r not in fin
            fin[r] = now
    raise AssertionError("engine did not drain")


def test_single_request_token_count_and_finish():
    eng = make()
    eng.add_request(EngineRequest("a", 100, 7), 0.0)
    _, first, fin, ntok = run(eng)
    assert ntok == {"a": 7} and set(first) == {"a"} and set(fin) == {"a"}
    assert not eng.has_work()
    assert eng.stats()["kv_cache_usage"] == 0.0


def test_max_num_seqs_respected_and_waiting_signal():
    eng = make(max_num_seqs=4)
    for i in range(10):
        eng.add_request(EngineRequest(f"r{i}", 20, 50), 0.0)
    out = eng.step(0.0)
    st = eng.stats()
    assert st["num_running"] == 4 and st["num_waiting"] == 6
    assert len(out.first_tokens) == 4
    _, _, fin, ntok = run(eng, out.duration)
    for r in out.tokens:
        ntok[r] += 1
    assert len(fin) == 10 and all(v == 50 for v in ntok.values())


def test_token_budget_and_chunked_prefill():
    eng = make(max_num_batched_tokens=512)
    eng.add_request(EngineRequest("long", 2000, 3), 0.0)
    outs = []
    now = 0.0
    while True:
        out = eng.step(now)
        outs.append(out)
        now += out.duration
        if out.first_tokens:
            break
    # 2000 tokens in chunks of 512 -> 4 prefill steps, first token at the end of the 4th
    assert [o.num_prefill_tokens for o in outs] == [512, 512, 512, 464]
    assert all(not o.tokens for o in outs[:-1])
    # a short request arriving mid-way shares the budget
    eng2 = make(max_num_batched_tokens=512)
    eng2.add_request(EngineRequest("long", 2000, 3), 0.0)
    eng2.add_request(EngineRequest("short", 100, 3), 0.0)
    o1 = eng2.step(0.0)
    assert o1.num_prefill_tokens == 512  # long takes the whole budget (FCFS)
    assert eng2.stats()["num_waiting"] == 1


def test_chunked_prefill_disabled_blocks_long_prompt_behind_budget():
    eng = make(max_num_batched_tokens=512, enable_chunked_prefill=False)
    eng.add_request(EngineRequest("a", 100, 3), 0.0)
    eng.add_request(EngineRequest("b", 500, 3), 0.0)
    out = eng.step(0.0)
    assert out.first_tokens == ["a"] and eng.stats()["num_waiting"] == 1


def test_waiting_positive_exactly_when_batch_cannot_admit():
    eng = make(max_num_seqs=3)
    eng.add_request(EngineRequest("a", 10, 100), 0.0)
    eng.step(0.0)
    assert eng.stats()["num_waiting"] == 0  # room left
    for r in ("b", "c"):
        eng.add_request(EngineRequest(r, 10, 100), 0.0)
    eng.step(0.1)
    assert eng.stats()["num_waiting"] == 0 and eng.stats()["num_running"] == 3
    eng.add_request(EngineRequest("d", 10, 100), 0.0)
    eng.step(0.2)
    assert eng.stats()["num_waiting"] == 1  # full: cannot admit


def test_prefix_cache_hit_reduces_prefill_and_ttft():
    text = "You are a helpful assistant. " * 300  # ~8.7k chars
    n, hashes = prompt_blocks(text)
    eng = EngineModel(PROFILE)  # with the profile's real TTFT overhead
    eng.add_request(EngineRequest("a", n, 2, hashes), 0.0)
    _, first_a, _, _ = run(eng)
    ttft_a = first_a["a"]
    assert eng.cached_prefix_tokens(hashes) == len(hashes) * 16
    t1 = 10.0
    eng.add_request(EngineRequest("b", n, 2, hashes), t1)
    eng.step(eng.next_ready_time())
    st = eng.stats()
    assert st["prefix_cache_queries"] == 2 * n
    assert st["prefix_cache_hits"] == (n - 1) // 16 * 16
    # TTFT of b on a cold engine vs on an engine warmed by a
    eng2 = EngineModel(PROFILE)
    eng2.add_request(EngineRequest("b", n, 2, hashes), t1)
    _, first_b, _, _ = run(eng2, t1)
    eng3 = EngineModel(PROFILE)
    eng3.add_request(EngineRequest("a", n, 2, hashes), 0.0)
    run(eng3)
    eng3.add_request(EngineRequest("b", n, 2, hashes), t1)
    _, first_b_warm, _, _ = run(eng3, t1)
    ttft_cold = first_b["b"] - t1
    ttft_warm = first_b_warm["b"] - t1
    assert abs(ttft_cold - ttft_a) < 1e-9
    assert ttft_warm < ttft_cold - 0.05  # most of the ~200 ms prefill is skipped
    assert ttft_warm >= PROFILE.ttft_overhead_s  # overhead is never skipped


def test_prefix_cache_disabled():
    n, hashes = prompt_blocks("x" * 4000)
    eng = make(enable_prefix_caching=False)
    for rid in ("a", "b"):
        eng.add_request(EngineRequest(rid, n, 2, hashes), 0.0)
        run(eng)
    assert eng.stats()["prefix_cache_hits"] == 0
    assert eng.cached_prefix_tokens(hashes) == 0


def test_shared_prefix_blocks_are_shared_while_running():
    n, hashes = prompt_blocks("y" * 6400)  # 100 blocks
    eng = make()
    eng.add_request(EngineRequest("a", n, 100, hashes), 0.0)
    eng.step(0.0)
    used_one = eng.stats()["kv_cache_usage"]
    eng.add_request(EngineRequest("b", n, 100, hashes), 0.0)
    eng.step(1.0)
    eng._check_invariants()
    used_two = eng.stats()["kv_cache_usage"]
    # b reuses 99 of a's blocks, allocates only its last prompt block + decode block
    assert (used_two - used_one) * eng.config.num_gpu_blocks <= 2 + 1e-9


def test_lru_eviction_of_unreferenced_blocks():
    eng = make(num_gpu_blocks=40)
    pa = prompt_blocks("a" * 64 * 16)  # 16 blocks
    pb = prompt_blocks("b" * 64 * 16)
    pc = prompt_blocks("c" * 64 * 16)
    for rid, (n, h) in (("a", pa), ("b", pb)):
        eng.add_request(EngineRequest(rid, n, 1, h), 0.0)
        run(eng)
    assert eng.cached_prefix_tokens(pa[1]) == 256 and eng.cached_prefix_tokens(pb[1]) == 256
    assert eng.stats()["kv_cache_usage"] == 0.0  # cached but unreferenced
    # touch a again (hit -> becomes most recently used)
    eng.add_request(EngineRequest("a2", pa[0], 1, pa[1]), 0.0)
    run(eng)
    # c needs 16 blocks: 8 empty + 8 evicted from the LRU end, which is b (tail first)
    eng.add_request(EngineRequest("c", pc[0], 1, pc[1]), 0.0)
    run(eng, check=True)
    assert eng.cached_prefix_tokens(pa[1]) == 256  # a was recently used: kept
    assert eng.cached_prefix_tokens(pb[1]) == 8 * 16  # b's head kept, its tail evicted
    assert eng.cached_prefix_tokens(pc[1]) == 256


def test_preemption_under_kv_pressure_recompute_no_lost_request():
    # 24 blocks of 16 tokens = 384 tokens; 4 requests each growing to 16 + 100 tokens
    eng = make(num_gpu_blocks=24)
    for i in range(4):
        eng.add_request(EngineRequest(f"r{i}", 16, 100), 0.0)
    now, fin, ntok = 0.0, {}, {}
    preempted = []
    while eng.has_work():
        out = eng.step(now)
        eng._check_invariants()
        now += out.duration
        preempted += out.preempted
        for r in out.tokens:
            ntok[r] = ntok.get(r, 0) + 1
        for r in out.finished:
            assert r not in fin
            fin[r] = now
    assert preempted, "expected preemption under KV pressure"
    assert preempted[0] == "r3"  # most recently admitted goes first
    assert eng.stats()["num_preempted"] == len(preempted)
    assert sorted(fin) == [f"r{i}" for i in range(4)]
    assert all(ntok[r] == 100 for r in fin)  # no token lost or duplicated


def test_preempted_goes_to_front_of_waiting():
    eng = make(num_gpu_blocks=10, max_num_seqs=2)
    eng.add_request(EngineRequest("a", 16, 80), 0.0)
    eng.add_request(EngineRequest("b", 16, 80), 0.0)
    eng.add_request(EngineRequest("c", 16, 5), 0.0)
    now = 0.0
    while True:
        out = eng.step(now)
        now += out.duration
        if out.preempted:
            break
    assert out.preempted == ["b"]
    assert list(s.id for s in eng._waiting) == ["b", "c"]


def test_bad_input():
    eng = make(num_gpu_blocks=10)
    with pytest.raises(ValueError, match="prompt_tokens"):
        eng.add_request(EngineRequest("x", 0, 5), 0.0)
    with pytest.raises(ValueError, match="output_tokens"):
        eng.add_request(EngineRequest("x", 5, 0), 0.0)
    with pytest.raises(ValueError, match="never fit"):
        eng.add_request(EngineRequest("x", 160, 2), 0.0)  # 161 tokens > 160 slots
    eng.add_request(EngineRequest("ok", 150, 11), 0.0)  # 160 KV tokens: fits exactly
    with pytest.raises(ValueError, match="duplicate"):
        eng.add_request(EngineRequest("ok", 5, 5), 0.0)
    with pytest.raises(ValueError, match="max_model_len"):
        make().add_request(EngineRequest("y", 40000, 5), 0.0)
    with pytest.raises(ValueError, match="unknown engine profile 'nope'"):
        EngineModel("nope")
    with pytest.raises(ValueError):
        EngineConfig.from_profile(PROFILE, max_num_seqs=0)
    _, _, fin, _ = run(eng)
    assert fin.keys() == {"ok"}


def test_abort_frees_blocks_everywhere():
    eng = EngineModel(PROFILE, EngineConfig.from_profile(PROFILE, max_num_seqs=1))
    eng.add_request(EngineRequest("run", 1000, 100), 0.0)
    eng.add_request(EngineRequest("wait", 100, 100), 0.0)
    eng.add_request(EngineRequest("pend", 100, 100), 10.0)
    eng.step(eng.next_ready_time())
    assert eng.stats()["num_running"] == 1 and eng.stats()["num_waiting"] == 1
    assert eng.abort("run", 1.0) and eng.abort("wait", 1.0) and eng.abort("pend", 1.0)
    assert not eng.abort("run", 1.0)
    eng._check_invariants()
    assert eng.stats()["kv_cache_usage"] == 0.0
    assert not eng.has_work() and eng.next_ready_time() is None
    assert eng.step(2.0).duration == 0.0


def test_ttft_overhead_delays_scheduling():
    eng = EngineModel(PROFILE)
    eng.add_request(EngineRequest("a", 10, 2), 1.0)
    assert eng.step(1.0).duration == 0.0  # still inside the overhead
    assert eng.stats()["num_waiting"] == 0
    t = eng.next_ready_time()
    assert t == pytest.approx(1.0 + PROFILE.ttft_overhead_s)
    out = eng.step(t)
    assert out.first_tokens == ["a"]


def test_blocks_from_hash_ids_chained():
    a = blocks_from_hash_ids([1, 2, 3])
    b = blocks_from_hash_ids([1, 2, 4])
    c = blocks_from_hash_ids([2, 2, 3])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert all(x != y for x, y in zip(a, c))
    assert blocks_from_hash_ids([1, 2, 3]) == a


def test_prompt_blocks_chained_and_stable():
    n, h = prompt_blocks("a" * 130)
    assert n == 33 and len(h) == 2
    n2, h2 = prompt_blocks("a" * 64 + "b" * 64)
    assert h2[0] == h[0] and h2[1] != h[1]
    _, h3 = prompt_blocks("b" * 64 + "a" * 64)
    assert h3[1] != h[1]
    assert prompt_blocks("")[0] == 1 and prompt_blocks("")[1] == []
    # fixed value: must not change across processes/runs (no Python hash())
    assert prompt_blocks("a" * 64)[1] == [(__import__("zlib").crc32(b"a" * 64) << 32) | 0]
    # non-ASCII text uses character offsets
    n4, h4 = prompt_blocks("é" * 64 + "x" * 10)
    assert n4 == 19 and len(h4) == 1
    assert prompt_blocks("é" * 64)[1] == h4


# ---------------------------------------------------------------- property test
req_strategy = st.lists(
    st.tuples(
        st.integers(1, 300),  # prompt tokens
        st.integers(1, 120),  # output tokens
        st.integers(0, 3),  # shared-prefix family
        st.floats(0.0, 2.0),  # arrival time
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=req_strategy, blocks=st.integers(27, 60), seqs=st.integers(1, 8),
       budget=st.integers(16, 600), caching=st.booleans(), overhead=st.sampled_from([0.0, 0.05]))
def test_property_all_finish_and_block_accounting(reqs, blocks, seqs, budget, caching, overhead):
    eng = EngineModel(PROFILE, EngineConfig.from_profile(
        PROFILE, num_gpu_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=budget,
        enable_prefix_caching=caching, ttft_overhead_s=overhead))
    arrivals = sorted(
        ((t, f"r{i}", p, o, fam) for i, (p, o, fam, t) in enumerate(reqs)), key=lambda x: x[0])
    fam_ids = {fam: list(range(fam * 1000, fam * 1000 + 30)) for fam in range(4)}
    expected = {}
    now = 0.0
    ntok, fin, first = {}, set(), set()
    k = 0
    for _ in range(200_000):
        while k < len(arrivals) and arrivals[k][0] <= now:
            t, rid, p, o, fam = arrivals[k]
            # prompt and output blocks (the output's hashes given, as for a replayed reply): output blocks
            # are registered as they fill, on both paths, at the same point of the step
            hashes = blocks_from_hash_ids(fam_ids[fam])[: (p + o - 1) // 16]
            eng.add_request(EngineRequest(rid, p, o, hashes), t)
            expected[rid] = o
            k += 1
        nxt = eng.next_ready_time()
        if nxt is None:
            if k == len(arrivals):
                break
            now = arrivals[k][0]
            continue
        now = max(now, nxt)
        out = eng.step(now)
        eng._check_invariants()
        used = eng.stats()["kv_cache_usage"]
        assert 0.0 <= used <= 1.0
        if out.duration == 0.0:
            # nothing ready yet: jump to next arrival or ready time
            cands = [x for x in (eng.next_ready_time(),) if x is not None and x > now]
            if k < len(arrivals):
                cands.append(arrivals[k][0])
            if cands:
                now = max(now, min(cands))
            continue
        now += out.duration
        for r in out.first_tokens:
            assert r not in first
            first.add(r)
        for r in out.tokens:
            ntok[r] = ntok.get(r, 0) + 1
        for r in out.finished:
            assert r not in fin
            fin.add(r)
    assert fin == set(expected)
    assert first == set(expected)
    assert ntok == expected
    assert not eng.has_work()
    assert eng.stats()["kv_cache_usage"] == 0.0
    st_ = eng.stats()
    assert 0 <= st_["prefix_cache_hits"] <= st_["prefix_cache_queries"]


def test_stats_keys():
    st_ = make().stats()
    assert set(st_) == {"num_waiting", "num_running", "kv_cache_usage", "prefix_cache_queries",
                        "prefix_cache_hits", "num_preempted", "num_gpu_blocks", "max_num_seqs",
                        "block_tokens", "engine_work"}
    assert set(st_["engine_work"]) == {"steps", "prefill_tokens", "decode_tokens", "busy_s", "prefill_pairs"}


def test_config_is_frozen_dataclass():
    cfg = EngineConfig.from_profile(PROFILE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_num_seqs = 3  # type: ignore[misc]


# ---------------------------------------------------------------- decode fast path == general path
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=req_strategy, blocks=st.integers(27, 60), seqs=st.integers(1, 8),
       budget=st.integers(4, 600), caching=st.booleans(), overhead=st.sampled_from([0.0, 0.05]),
       abort_every=st.integers(0, 7))
def test_decode_fast_path_is_identical_to_general_path(reqs, blocks, seqs, budget, caching, overhead, abort_every):
    """Two engines, one with the all-decode fast path and one without, driven in lockstep (same
    arrivals, same aborts, KV pressure forcing preemptions, output blocks cached): every step's output,
    the stats and the block accounting are identical."""
    def mk(fast):
        e = EngineModel(PROFILE, EngineConfig.from_profile(
            PROFILE, num_gpu_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=budget,
            enable_prefix_caching=caching, ttft_overhead_s=overhead))
        e.decode_fast_path = fast
        return e

    fast, slow = mk(True), mk(False)
    arrivals = sorted(((t, f"r{i}", p, o, fam) for i, (p, o, fam, t) in enumerate(reqs)), key=lambda x: x[0])
    fam_ids = {fam: list(range(fam * 1000, fam * 1000 + 30)) for fam in range(4)}
    now, k, steps = 0.0, 0, 0
    for _ in range(200_000):
        while k < len(arrivals) and arrivals[k][0] <= now:
            t, rid, p, o, fam = arrivals[k]
            # prompt and output blocks (the output's hashes given, as for a replayed reply): output blocks
            # are registered as they fill, on both paths, at the same point of the step
            hashes = blocks_from_hash_ids(fam_ids[fam])[: (p + o - 1) // 16]
            for e in (fast, slow):
                e.add_request(EngineRequest(rid, p, o, hashes), t)
            k += 1
        nxt = fast.next_ready_time()
        assert nxt == slow.next_ready_time()
        if nxt is None:
            if k == len(arrivals):
                break
            now = arrivals[k][0]
            continue
        now = max(now, nxt)
        a, b = fast.step(now), slow.step(now)
        steps += 1
        assert a == b, (steps, a, b)
        assert fast.stats() == slow.stats()
        fast._check_invariants()
        if abort_every and steps % abort_every == 0 and a.tokens:
            victim = a.tokens[-1]
            if victim not in a.finished:
                assert fast.abort(victim, now) and slow.abort(victim, now)
        if a.duration == 0.0:
            cands = [x for x in (fast.next_ready_time(),) if x is not None and x > now]
            if k < len(arrivals):
                cands.append(arrivals[k][0])
            if cands:
                now = max(now, min(cands))
            continue
        now += a.duration
    assert not fast.has_work() and not slow.has_work()
    assert fast.stats() == slow.stats()


def test_an_abort_that_leaves_the_engine_idle_refreshes_its_report():
    """A request waiting in the engine is aborted (its client left) and nothing else is running: the
    engine runs no further step, so the abort itself must refresh the reported waiting count --
    otherwise the replica reports ``num_waiting=1`` for good and SP-P never sends it work again."""
    eng = make(max_num_seqs=1)
    eng.add_request(EngineRequest("busy", 50, 3), 0.0)
    eng.add_request(EngineRequest("queued", 50, 3), 0.0)
    eng.step(0.0)
    assert eng.stats()["num_waiting"] == 1  # precondition: the second request waits
    assert eng.abort("busy") and eng.abort("queued")
    assert eng.next_ready_time() is None  # idle: no step will refresh the stats
    st = eng.stats()
    assert (st["num_waiting"], st["num_running"]) == (0, 0)


def test_an_abort_keeps_counting_requests_that_still_wait():
    eng = make(max_num_seqs=1)
    for r in ("busy", "w1", "w2"):
        eng.add_request(EngineRequest(r, 50, 3), 0.0)
    eng.step(0.0)
    assert eng.stats()["num_waiting"] == 2
    eng.abort("w1")
    assert eng.stats()["num_waiting"] == 1


@pytest.mark.parametrize("reserve", [True, False])
def test_admission_reserves_the_whole_prompt_as_vllm_does(reserve):
    """vLLM 0.29 admits a waiting request only if the blocks of its whole prompt are free
    (``scheduler_reserve_full_isl``), not only its first chunk's; ``reserve_full_prompt`` (default on)
    does the same. 10 blocks of 16 tokens; ``a`` holds 6; ``b`` (5 blocks of prompt, 2-block chunks) fits
    its first chunk but not its prompt: it waits with the rule, and is admitted without it."""
    eng = make(num_gpu_blocks=10, max_num_batched_tokens=33, reserve_full_prompt=reserve)
    eng.add_request(EngineRequest("a", 96, 50), 0.0)
    now = 0.0
    while True:  # a prefills in chunks of 33 tokens: 6 blocks
        out = eng.step(now)
        now += out.duration
        if out.first_tokens:
            break
    eng.add_request(EngineRequest("b", 80, 2), now)
    eng.step(now)  # a decodes (its 7th block); b's first 32-token chunk needs 2 of the 3 left, its prompt 5
    st_ = eng.stats()
    assert (st_["num_running"], st_["num_waiting"]) == ((1, 1) if reserve else (2, 0))
