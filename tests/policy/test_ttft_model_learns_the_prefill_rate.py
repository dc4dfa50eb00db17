"""The online TTFT model: GORGO Table 1 prior, Theil-Sen fit, pooled fallback, bad samples, and the
observed TTFTs reaching a policy's model."""

import random

import pytest

from policy_cases import TP, cost_policy, rq
from ray_geolb.policy.ttft_model import TtftModel, TtftModelConfig, theil_sen


def test_ttft_model_falls_back_to_gorgo_table1_prior():
    m = TtftModel()
    b, s, src = m.line("r0")
    assert src == "prior" and b == pytest.approx(0.15072) and s == pytest.approx(0.0938e-3)
    assert m.predict("r0", 1000) == pytest.approx(0.15072 + 0.0938)


def test_theil_sen_recovers_a_known_line_from_noisy_samples_with_outliers():
    rng = random.Random(7)
    m = TtftModel(TtftModelConfig(window=128, min_samples=8))
    base, tp = 0.2, 0.0005
    for i in range(128):
        x = rng.uniform(100, 8000)
        y = base + tp * x + rng.gauss(0, 0.01)
        if i % 5 == 0:  # 20 % outliers: requests that queued for seconds
            y += rng.uniform(2.0, 20.0)
        m.observe("r0", x, y)
    b, s, src = m.line("r0")
    assert src == "key"
    assert s == pytest.approx(tp, rel=0.05) and b == pytest.approx(base, abs=0.03)
    # ordinary least squares on the same data is dragged far off by the outliers
    xs, ys = zip(*zip(m._w["r0"].xs, m._w["r0"].ys))
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    ols = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    ols_b = my - ols * mx
    assert abs(ols_b - base) > 0.5 or abs(ols - tp) / tp > 0.2


def test_ttft_model_pooled_fallback_window_and_bad_samples():
    m = TtftModel(TtftModelConfig(window=16, min_samples=4, min_spread_tokens=10))
    for x in (100, 200, 300, 400):
        assert m.observe("a", x, 0.1 + 0.001 * x)
    assert m.line("a")[2] == "key" and m.line("b")[2] == "pooled"  # b has no samples: pooled line
    assert m.t_p("b") == pytest.approx(0.001)
    assert not m.observe("a", -1, 0.5) and not m.observe("a", 10, float("nan")) and not m.observe("a", "x", 1)
    for i in range(40):
        m.observe("a", 100 + i, 1.0)
    assert m.samples("a") == 16  # bounded window
    assert m.line("a")[1] == pytest.approx(0.0, abs=1e-9)  # the line moved with the window (slope clamped >= 0)
    assert theil_sen([1, 1, 1], [1, 2, 3]) is None  # no x spread: no slope


def test_observed_ttfts_reach_the_policy_model_through_on_complete():
    pol = cost_policy(ttft={"prior_tp_s": TP, "prior_base_s": 0.1, "min_samples": 4, "min_spread_tokens": 10})
    for i, n in enumerate((400, 800, 1200, 1600, 2000)):
        req = rq(i, "q%d " % i + "z" * (n * 4 - 4))
        pol.on_dispatch(req, "a", float(i))
        pol.on_complete(req.request_id, "a", float(i) + 1, ttft_s=0.05 + 0.0002 * req.prompt_tokens, req=req)
    b, s, src = pol.ttft.line("a")
    assert src == "key" and s == pytest.approx(0.0002, rel=0.01) and b == pytest.approx(0.05, abs=1e-3)
    assert pol.work.count("a") == 0 and pol.tracker.outstanding("a") == 0
    req = rq(99, "failed " * 100)
    pol.on_dispatch(req, "b", 9.0)
    pol.on_complete(req.request_id, "b", 9.5, ttft_s=3.0, ok=False, req=req)
    assert pol.ttft.samples("b") == 0  # a failed request teaches nothing


def test_a_model_that_is_not_online_keeps_its_measured_line():
    """GORGO's own setting (§4.2): t_p measured offline and kept, whatever TTFTs are observed."""
    m = TtftModel(TtftModelConfig(online=False, prior_tp_s=4.8e-4, prior_base_s=0.0535, min_samples=3))
    for i in range(50):
        assert m.observe("r", 100 + 10 * i, 5.0) is False  # queueing-dominated samples: ignored
    assert m.line("r") == (0.0535, 4.8e-4, "prior") and m.samples("r") == 0
    learner = TtftModel(TtftModelConfig(min_samples=3))
    for i in range(50):
        learner.observe("r", 100 + 10 * i, 5.0)
    assert learner.t_p("r") == 0.0  # the online fit of the same samples clamps to 0
