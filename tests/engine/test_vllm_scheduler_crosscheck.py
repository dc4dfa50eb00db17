"""The EngineModel against vLLM 0.29's real v1 Scheduler (ray_geolb.engine.vllm_replay), step by step.

30 requests, 3 shared 640-token prefixes (23 of 30 requests), 2 arriving per step, max_num_seqs 16, a
512-token budget and a 300-block (4,784 usable tokens) KV cache: prefix hits, chunked prefills and
preemptions with resumes all happen. Figures measured when this test was written (vLLM 0.29.0):

* vLLM defaults: same scheduled set 100 % of 297 steps, same tokens 99.7 %, same admissions + hits
  95.8 %, same preempted set 100 %; first-admission hits 12,160 / 12,160 tokens; preemptions 9 / 9;
  every request finishes in the same step; simulated GPU time 2.4977 / 2.4973 s.
* before the engine model reserved the whole prompt at admission (vLLM's ``scheduler_reserve_full_isl``,
  on by default; the engine then checked the first chunk only and preempted what it over-admitted) the
  same run agreed on 99.3 / 98.3 / 79.2 / 81.8 %, with 9 / 11 preemptions. With the rule off on both
  sides: 100 % same scheduled and preempted sets, 11 / 11 preemptions.
* what is left: hits of resumed requests one block apart (vLLM caches full output blocks too, and so
  evicts prompt blocks the engine keeps).
* a cache large enough for everything: identical, step for step.
"""

import random

import pytest

try:
    from ray_geolb.serve.llm_server import guard_broken_torch_extras
except ImportError:  # no Ray here: then no ray[llm] and no vLLM either (importorskip below)
    guard_broken_torch_extras = None
if guard_broken_torch_extras is not None:
    guard_broken_torch_extras()  # this venv: CUDA torchvision / torchaudio over torch+cpu
pytest.importorskip("vllm")

from ray_geolb.engine.vllm_replay import TraceRequest, replay  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def trace():
    rng = random.Random(1)
    prefixes = [[rng.randrange(1, 120000) for _ in range(640)] for _ in range(3)]
    out = []
    for i in range(30):
        p = prefixes[i % 3] if i % 4 else []
        tail = [rng.randrange(1, 120000) for _ in range(rng.randint(50, 400))]
        out.append(TraceRequest(i // 2, tuple(p + tail), rng.randint(20, 120)))
    return out


def test_tight_cache_with_vllm_defaults(trace):
    r = replay(trace, num_blocks=300, max_num_seqs=16, max_num_batched_tokens=512)
    # the trace exercised what it is meant to
    assert r.steps >= 250
    assert r.hit_tokens[0] >= 10_000 and r.resume_hit_tokens[0] > 0
    assert r.preemptions[0] >= 5 and r.preemptions[1] >= 5
    assert r.unfinished == (0, 0)
    # agreement (measured 100 / 99.7 / 95.8 / 100 %)
    assert r.agree_scheduled == 1.0 and r.agree_preempted == 1.0
    assert r.preemptions[0] == r.preemptions[1]
    assert r.agree_tokens >= 0.99
    assert r.agree_hits >= 0.90
    assert r.first_hit_agree == 1.0 and r.hit_tokens[0] == r.hit_tokens[1]
    assert r.finish_step_agree == 1.0
    assert r.busy_steps[0] == r.busy_steps[1]
    assert abs(r.sim_time_s[1] / r.sim_time_s[0] - 1) < 0.01
    # what is left: hits of resumed requests (eviction order around vLLM's cached output blocks)
    assert {d.kind for d in r.divergences} <= {"tokens", "hits"}


def test_tight_cache_without_full_prompt_reservation(trace):
    # the rule off on both sides (vLLM's scheduler_reserve_full_isl, the engine's reserve_full_prompt)
    r = replay(trace, num_blocks=300, max_num_seqs=16, max_num_batched_tokens=512, reserve_full_isl=False)
    assert r.preemptions[0] >= 5 and r.preemptions[0] > replay(
        trace, num_blocks=300, max_num_seqs=16, max_num_batched_tokens=512).preemptions[0]
    assert r.agree_scheduled == 1.0 and r.agree_preempted == 1.0
    assert r.preemptions[0] == r.preemptions[1]
    assert r.agree_tokens >= 0.99 and r.agree_hits >= 0.9
    assert r.finish_step_agree == 1.0
    # what is left: hits of resumed requests (eviction order around vLLM's cached output blocks)
    assert {d.kind for d in r.divergences} <= {"tokens", "hits"}


def test_large_cache_identical(trace):
    r = replay(trace, num_blocks=3000, max_num_seqs=16, max_num_batched_tokens=512)
    assert r.preemptions == (0, 0)
    assert r.hit_tokens[0] >= 10_000
    assert r.first_divergence_step is None and not r.divergences
    assert (r.agree_scheduled, r.agree_tokens, r.agree_hits, r.finish_step_agree) == (1.0, 1.0, 1.0, 1.0)
    assert r.sim_time_s[0] == pytest.approx(r.sim_time_s[1], rel=1e-12)


def test_multi_turn_hits_on_cached_answers_match_vllm():
    """vLLM caches full output blocks, so turn 2 (turn 1's prompt + its answer + a new question) hits the
    answer too. Given the answer's block hashes (EngineRequest.block_hashes past the prompt), the engine
    model caches them as they fill: the same hit tokens as vLLM, step for step."""
    rng = random.Random(7)
    trace = []
    for i in range(8):
        p1 = tuple(rng.randrange(1, 120000) for _ in range(rng.randint(200, 500)))
        ans = tuple(rng.randrange(1, 120000) for _ in range(rng.randint(64, 160)))
        q2 = tuple(rng.randrange(1, 120000) for _ in range(rng.randint(20, 80)))
        trace.append(TraceRequest(i, p1, len(ans), f"c{i}t1", ans))
        trace.append(TraceRequest(i + 40, p1 + ans + q2, 16, f"c{i}t2"))
    r = replay(trace, num_blocks=3000, max_num_seqs=16, max_num_batched_tokens=512)
    assert r.unfinished == (0, 0) and not r.divergences
    assert r.hit_tokens[0] == r.hit_tokens[1]
    # more than the prompts alone could give: the answers' full blocks hit as well
    prompt_only = sum((len(t.prompt_token_ids) // 16) * 16 for t in trace[0::2])
    assert r.hit_tokens[1] > prompt_only
