"""GeoPrefix prices a residual prefill's attention over the cached context.

R uncached tokens after a prefix hit of c cost ``t_p·R + q·R·(c + R/2)`` (engine/step_model.py: a chunk of
P new tokens after c computed ones attends to ``P·(c + P/2)`` pairs). ``q`` is learned online with ``t_p`` from
the engines' step work when their reports carry ``prefill_pairs`` -- no profile constant:

* the 4-term work fit recovers q and t_p from intervals of a chunked-prefill engine driven by the step model
  under heavy queueing, and falls back to the 3-term fit (q = 0) without the column or when it is degenerate;
* ``parse_engine_work`` takes reports with and without ``prefill_pairs`` and rejects a bad value with an
  ``EngineWorkError`` naming the field;
* the price: a replica holding a long prefix is cheaper, relative to one prefilling from zero, by
  ``t_p·c + q·c²/2`` (the linear price: ``t_p·c``), which flips a choice the linear price gets wrong;
  ``price_cached_context=False`` (and GORGO) keep the linear price.
"""

import math
import random
from collections import deque

import pytest

from policy_cases import TP, P, cost_policy, rq
from ray_geolb.engine.step_model import StepModel
from ray_geolb.policy import ReplicaStats
from ray_geolb.policy.availability import EngineWorkError, parse_engine_work
from ray_geolb.policy.ttft_model import TtftModel, TtftModelConfig, work_fit, work_fit_pairs

Q = 1e-6  # seconds per prefill-attention pair in the hand-computed cases (t_p = 1 ms: q·1000 pairs = t_p·1 token)

# the H100 constants of engine/profiles.py (step_fit on the committed GPU step times), copied so that this
# test drives the step model alone; the router never sees them
H100 = StepModel(overhead_s=2.713e-3, gemm_per_token_s=2.423e-5, knee_tokens=188,
                 decode_attn_per_ctx_token_s=4.395e-8, prefill_attn_per_pair_s=1.547e-9,
                 lone_attn_per_ctx_token_s=9.343e-8, chunk_overhead_s=7.827e-4, decode_overhead_s=3.591e-4)


def _drive(model, seed=0, duration_s=100.0, rate=12.0, budget=8192, max_seqs=128, report_every_s=0.5):
    """A vLLM-style chunked-prefill engine priced by ``model``: decodes first, then FCFS prefill chunks in the
    remaining token budget. Poisson arrivals above its capacity (the queue grows without bound); prompts of
    512..16384 tokens, 60 % of them with a prefix hit of 30..95 %. Returns the ``engine_work`` differences
    between reports every ``report_every_s``: (steps, prefill, decode, busy_s, prefill_pairs)."""
    rng = random.Random(seed)
    arrivals = deque()
    t = 0.0
    while t < duration_s:
        t += rng.expovariate(rate)
        L = rng.choice([512, 1024, 2048, 4096, 8192, 16384])
        c = 0 if rng.random() < 0.4 else int(L * rng.uniform(0.3, 0.95)) // 16 * 16
        arrivals.append((t, L, c, rng.randint(16, 200)))
    waiting, running = deque(), []
    cum, last, rows = [0, 0, 0, 0.0, 0.0], [0, 0, 0, 0.0, 0.0], []
    now, next_report = 0.0, report_every_s
    while now < duration_s:
        while arrivals and arrivals[0][0] <= now:
            _, L, c, out = arrivals.popleft()
            waiting.append([L, c, 0, out])
        if not waiting and not running:
            now = arrivals[0][0]
            continue
        decode_ctx = [r[0] for r in running]
        left = budget - len(decode_ctx)
        chunks, done = [], []
        for w in waiting:
            if left <= 0 or len(running) + len(done) >= max_seqs:
                break
            L, c, computed, _ = w
            p = min(L - c - computed, left)
            chunks.append((p, c + computed))
            w[2] += p
            left -= p
            if c + w[2] >= L:
                done.append(w)
        dt = model.time(chunks, decode_ctx)
        now += dt
        cum[0] += 1
        cum[1] += sum(p for p, _ in chunks)
        cum[2] += len(decode_ctx)
        cum[3] += dt
        cum[4] += sum(p * (c + 0.5 * p) for p, c in chunks)
        for r in running:
            r[0] += 1
            r[1] -= 1
        running = [r for r in running if r[1] > 0]
        for w in done:
            waiting.remove(w)
            running.append([w[0] + 1, w[3]])
        if now >= next_report:
            rows.append(tuple(a - b for a, b in zip(cum, last)))
            last = list(cum)
            next_report = now + report_every_s
    return rows, len(waiting)


def test_work_fit_recovers_q_and_t_p_from_a_queueing_engine_priced_by_the_step_model():
    rows, backlog = _drive(H100)
    assert backlog > 100  # heavy queueing: most of each request's TTFT would be waiting
    model = TtftModel(TtftModelConfig(source="engine_steps"), fit_pairs=True)
    for r in rows:
        assert model.observe_work("r0", *r)
    _base, tp, src = model.line()
    q = model.pair_coef()
    assert src == "pooled" and model.pair_coef("r0") == pytest.approx(q)
    assert q == pytest.approx(H100.prefill_attn_per_pair_s, rel=0.05), q
    # t_p: the GEMM time per token (the per-chunk launches and the attention's read floor add a little)
    assert tp == pytest.approx(H100.gemm_per_token_s, rel=0.05), tp
    # the 3-term fit on the same intervals folds the attention into t_p: 40-60 % above the GEMM time
    linear = TtftModel(TtftModelConfig(source="engine_steps"))
    for r in rows:
        linear.observe_work("r0", *r)
    assert linear.pair_coef() == 0.0
    assert linear.t_p() > 1.3 * H100.gemm_per_token_s
    # and so does the pairs-fitting model when the reports carry no prefill_pairs (older replicas)
    old = TtftModel(TtftModelConfig(source="engine_steps"), fit_pairs=True)
    for r in rows:
        old.observe_work("r0", *r[:4])
    assert old.pair_coef() == 0.0 and old.t_p() == pytest.approx(linear.t_p())


def _rows(q=Q, n=12, degenerate=False):
    out = []
    for i in range(n):
        steps, prefill, decode = 10 + i, 1000 * (i % 4 + 1) + 37 * i, 50 * (i % 3) + 7 * i
        pairs = 500.0 * prefill if degenerate else 1e5 * ((i * 7) % 5 + 1) + 1234 * i
        out.append((steps, prefill, decode, 0.002 * steps + TP * prefill + 1e-4 * decode + q * pairs, pairs))
    return out


def test_work_fit_pairs_is_exact_on_linear_data_and_falls_back_without_a_usable_column():
    a, tp, td, q = work_fit_pairs(_rows())
    assert (a, tp, td, q) == pytest.approx((0.002, TP, 1e-4, Q))
    # pairs proportional to prefill tokens (every prompt alike): not identifiable -> the 3-term fit, q = 0
    deg = _rows(degenerate=True)
    assert work_fit_pairs(deg) == pytest.approx((*work_fit([r[:4] for r in deg]), 0.0))
    # no pairs at all (an all-zero column) -> the 3-term fit
    zero = [r[:4] + (0.0,) for r in _rows(q=0.0)]
    assert work_fit_pairs(zero) == pytest.approx((0.002, TP, 1e-4, 0.0))
    # a negative unconstrained q: the constrained optimum is on q = 0, the 3-term fit
    neg = _rows(q=-Q)
    assert work_fit_pairs(neg)[3] == 0.0
    assert work_fit_pairs(neg)[:3] == pytest.approx(work_fit([r[:4] for r in neg]))


def test_parse_engine_work_with_and_without_prefill_pairs():
    base = {"steps": 10, "prefill_tokens": 4096, "decode_tokens": 300, "busy_s": 0.5}
    assert parse_engine_work(base) == (10.0, 4096.0, 300.0, 0.5)  # an older replica: still valid
    assert parse_engine_work({**base, "prefill_pairs": None}) == (10.0, 4096.0, 300.0, 0.5)
    assert parse_engine_work({**base, "prefill_pairs": 1.5e7}) == (10.0, 4096.0, 300.0, 0.5, 1.5e7)
    rs = ReplicaStats.from_dict({"num_waiting": 0, "timestamp": 1.0, "engine_work": {**base, "prefill_pairs": 7}})
    assert rs.engine_work == (10.0, 4096.0, 300.0, 0.5, 7.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "many", True, [3]])
def test_parse_engine_work_rejects_a_bad_prefill_pairs_naming_the_field(bad):
    base = {"steps": 10, "prefill_tokens": 4096, "decode_tokens": 300, "busy_s": 0.5, "prefill_pairs": bad}
    with pytest.raises(EngineWorkError, match=r"engine_work\.prefill_pairs") as e:
        parse_engine_work(base)
    assert e.value.field == "engine_work.prefill_pairs" and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match=r"engine_work\.prefill_pairs"):  # the whole report is rejected
        ReplicaStats.from_dict({"timestamp": 1.0, "engine_work": base})
    with pytest.raises(EngineWorkError, match=r"engine_work\.busy_s"):
        parse_engine_work({**base, "prefill_pairs": 1.0, "busy_s": -2})
    with pytest.raises(EngineWorkError) as e:
        parse_engine_work([1, 2, 3, 4])
    assert e.value.field == "engine_work"


def _geoprefix(price=True, learn=True):
    """GeoPrefix (t_p = 1 ms prior) whose step-work fit learned t_p = 1 ms and q = 1 us per pair (or, with
    ``price=False``, the linear fit on work without attention: t_p = 1 ms, q = 0)."""
    pol = cost_policy("geoprefix", match_half_life_s=None, price_cached_context=price,
                      ttft={"prior_tp_s": TP, "prior_base_s": 0.1, "source": "engine_steps"})
    if learn:
        for r in _rows(q=Q if price else 0.0):
            assert pol.ttft.observe_work("a", *r)
    return pol


def _held(pol):
    """``a`` holds the 8192-char prefix (2048 tokens) and has nothing in flight."""
    pol.on_dispatch(rq(0, P * 4), "a", 0.0)
    pol.on_complete("r0", "a", 0.1)


def test_a_long_cached_prefix_saves_its_attention_too():
    pol = _geoprefix()
    assert pol.t_p("a") == pytest.approx(TP) and pol.pair_coef() == pytest.approx(Q)
    _held(pol)
    long_ = rq(1, P * 4 + "c" * 100)  # 8292 chars: 2073 tokens, 2048 of them cached at a
    costs = pol.costs(long_, ["a", "b"], 0.2)
    assert costs["a"] == pytest.approx(TP * 25 + Q * 25 * (2048 + 25 / 2))  # R = 25 after c = 2048
    assert costs["b"] == pytest.approx(TP * 2073 + Q * 2073 * 2073 / 2)  # the whole prompt from zero
    # the cached replica is cheaper by t_p·c + q·c²/2, not the linear t_p·c
    assert costs["b"] - costs["a"] == pytest.approx(TP * 2048 + Q * 2048 ** 2 / 2)
    lin = _geoprefix(price=False)
    _held(lin)
    lcosts = lin.costs(long_, ["a", "b"], 0.2)
    assert lcosts == pytest.approx({"a": TP * 25, "b": TP * 2073})
    assert costs["b"] - costs["a"] > 1.9 * (lcosts["b"] - lcosts["a"])
    d = pol.describe()
    assert d["prefill_pair_s"] == pytest.approx(Q) and d["t_p_s"] == pytest.approx(TP)


def test_the_cached_context_price_keeps_a_long_prompt_on_its_prefix_where_the_linear_price_moves_it():
    """``a`` holds the 2048-token prefix and has ten short (250-token) requests queued; ``b`` is idle. The
    linear price sees 2.5 s of queue against 2.05 s of saved prefill and sends the long prompt to ``b``;
    recomputing 2048 tokens of context also costs their attention (q·c²/2 = 2.1 s), so it stays at ``a``."""
    picks = {}
    for price in (False, True):
        pol = _geoprefix(price=price)
        _held(pol)
        for i in range(10):
            pol.on_dispatch(rq(10 + i, f"Z{i:03d}" + "qwertyuiop"[i] * 996), "a", 0.2)  # 250 tokens, no hit
        assert pol.queued_tokens("a") == pytest.approx(2500)
        if price:
            assert pol.queued_pairs("a") == pytest.approx(10 * 250 * 125)
            assert pol.queued_pairs("b") == 0.0
        picks[price] = pol.choose(rq(1, P * 4 + "c" * 100), 0.3).target
    assert picks == {False: "b", True: "a"}


def test_queued_pairs_follow_the_report_like_queued_tokens():
    pol = _geoprefix()
    pol.on_dispatch(rq(0, "x" * 4000), "a", 0.0)  # 1000 tokens from zero: 500,000 pairs
    assert pol.queued_pairs("a") == pytest.approx(1000 * 500)
    pol.on_stats("a", ReplicaStats(num_waiting=2, timestamp=0.5))  # the report has seen it: 2 × the mean
    assert pol.queued_pairs("a") == pytest.approx(2 * 500_000)
    pol.on_complete("r0", "a", 0.6)
    assert pol.queued_pairs("a") == pytest.approx(2 * 500_000)


def test_q_is_learned_from_reports_and_is_zero_until_then_or_without_the_switch():
    pol = _geoprefix(learn=False)
    assert pol.pair_coef() == 0.0  # no fit yet: the linear price, whatever the profile
    _held(pol)
    long_ = rq(1, P * 4 + "c" * 100)
    assert pol.costs(long_, ["a", "b"], 0.2) == pytest.approx({"a": TP * 25, "b": TP * 2073})
    cum = [0.0] * 5
    for k, r in enumerate([(0,) * 5] + _rows()):
        cum = [x + y for x, y in zip(cum, r)]
        work = dict(zip(("steps", "prefill_tokens", "decode_tokens", "busy_s", "prefill_pairs"), cum))
        pol.on_stats("a", ReplicaStats.from_dict({"timestamp": 1.0 + k, "engine_work": work}))
    assert pol.pair_coef() == pytest.approx(Q) and pol.t_p("a") == pytest.approx(TP)
    # reports of an older replica (no prefill_pairs): t_p is learned, q stays 0
    old = _geoprefix(learn=False)
    cum = [0.0] * 5
    for k, r in enumerate([(0,) * 5] + _rows(q=0.0)):
        cum = [x + y for x, y in zip(cum, r)]
        work = dict(zip(("steps", "prefill_tokens", "decode_tokens", "busy_s"), cum))
        old.on_stats("a", ReplicaStats.from_dict({"timestamp": 1.0 + k, "engine_work": work}))
    assert old.pair_coef() == 0.0 and old.t_p("a") == pytest.approx(TP) and old.ttft.samples() == len(_rows())
    # GORGO keeps its constant, linear price: the switch is off and its model fits TTFTs
    gorgo = cost_policy("gorgo")
    assert gorgo.config.price_cached_context is False and gorgo.pair_coef() == 0.0
    _held(gorgo)
    assert gorgo.costs(long_, ["a", "b"], 0.2) == pytest.approx({"a": TP * 25, "b": TP * 2073})


def test_the_prior_floor_and_the_region_layer_see_the_slope_of_a_mean_prompt():
    """The prior (GORGO's TTFT slope) floors ``t_p + q·mean_prompt/2``, not the pairs fit's per-token term
    alone; the region layer, which prices prefill linearly, gets that slope."""
    pol = _geoprefix()
    mean = pol.mean_prompt_tokens  # 512 before any request
    assert pol.region_t_p() == pytest.approx(TP + Q * mean / 2)
    high = cost_policy("geoprefix", match_half_life_s=None,
                       ttft={"prior_tp_s": 2 * TP, "prior_base_s": 0.1, "source": "engine_steps"})
    for r in _rows():
        high.ttft.observe_work("a", *r)
    assert high.ttft.t_p() == pytest.approx(TP) and high.pair_coef() == pytest.approx(Q)
    assert high.pooled_t_p() == pytest.approx(2 * TP - Q * mean / 2)  # floored: the mean prompt's slope = prior
    assert high.region_t_p() == pytest.approx(2 * TP)
    flat = cost_policy("geoprefix", match_half_life_s=None, price_cached_context=False,
                       ttft={"prior_tp_s": 2 * TP, "prior_base_s": 0.1, "source": "engine_steps"})
    for r in _rows():
        flat.ttft.observe_work("a", *r)
    assert flat.pooled_t_p() == flat.region_t_p() == pytest.approx(2 * TP)  # the linear price: as before
