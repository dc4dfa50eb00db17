"""BalanceRoute (vllm_default, jsq_load, br0) and FlowKV: their load scores on hand-computed cases."""

import pytest

from policy_cases import FIXED, TP, P, rq
from ray_geolb.policy import ReplicaStats, build_policy


def test_vllm_default_score_counts_unseen_dispatches_as_waiting():
    pol = build_policy("vllm_default", targets=["a", "b"])
    pol.on_stats("a", ReplicaStats(num_waiting=1, num_running=2, timestamp=0.0))  # 4+2 = 6
    pol.on_stats("b", ReplicaStats(num_waiting=0, num_running=5, timestamp=0.0))  # 5
    assert pol.score("a") == 6 and pol.score("b") == 5
    assert pol.choose(rq(0, "hi"), 1.0).target == "b"
    pol.on_dispatch(rq(0, "hi"), "b", 1.0)  # unseen: 4·1 + 5 = 9
    assert pol.score("b") == 9 and pol.choose(rq(1, "hi"), 1.0).target == "a"


def test_jsq_load_adds_tokens_dispatched_since_the_report():
    pol = build_policy("jsq_load", targets=["a", "b"])
    pol.on_stats("a", ReplicaStats(kv_cache_usage=0.5, num_gpu_blocks=100, block_tokens=16, timestamp=0.0))
    pol.on_stats("b", ReplicaStats(kv_cache_usage=0.4, num_gpu_blocks=100, block_tokens=16, timestamp=0.0))
    assert pol.choose(rq(0, "x" * 800), 1.0).target == "b"
    pol.on_dispatch(rq(0, "x" * 800), "b", 1.0)  # +200 tokens: (640 + 200)/1600 = 0.525
    assert pol.kv_load("b") == pytest.approx(0.525)
    assert pol.choose(rq(1, "x" * 800), 1.0).target == "a"
    fresh = build_policy({"name": "jsq_load", "capacity_tokens": 1000}, targets=["c"])
    fresh.on_dispatch(rq(2, "x" * 400), "c", 0.0)  # no stats: own in-flight tokens / capacity_tokens
    assert fresh.kv_load("c") == pytest.approx(0.1)


def test_br0_marginal_overflow_then_jsq_tie_break():
    pol = build_policy({"name": "br0", "decode_tps": 0.0}, targets=["a", "b"])
    cap = dict(num_gpu_blocks=100, block_tokens=10, timestamp=0.0)  # 1000 tokens
    pol.on_stats("a", ReplicaStats(kv_cache_usage=0.5, **cap))
    pol.on_stats("b", ReplicaStats(kv_cache_usage=0.7, **cap))
    pol.on_dispatch(rq(0, "x" * 400, output_tokens_hint=300), "a", 1.0)  # K=500+100, grows by 300: P=900
    req = rq(1, "y" * 400, output_tokens_hint=100)  # s = 100 + 100
    assert pol.projected("a", 1.0) == pytest.approx(900)
    assert pol.overflow("a", req, 1.0) == pytest.approx(100)  # 900 + 200 - 1000
    assert pol.overflow("b", req, 1.0) == pytest.approx(0)  # 700 + 200 <= 1000
    assert pol.choose(req, 1.0).target == "b"  # although b's KV load (0.7) > a's (0.6)
    # outputs already produced shrink the projection: 10 s at 10 tok/s -> grow 200, P=800, F(a)=0
    pol2 = build_policy({"name": "br0", "decode_tps": 10.0}, targets=["a", "b"])
    pol2.on_stats("a", ReplicaStats(kv_cache_usage=0.5, **cap))
    pol2.on_stats("b", ReplicaStats(kv_cache_usage=0.7, **cap))
    pol2.on_dispatch(rq(0, "x" * 400, output_tokens_hint=300), "a", 1.0)
    assert pol2.overflow("a", req, 11.0) == 0 and pol2.choose(req, 11.0).target == "a"  # tie -> JSQ load
    # already overflowing: marginal = the whole request (not the total overflow)
    pol2.on_stats("b", ReplicaStats(kv_cache_usage=1.2, **dict(cap, timestamp=12.0)))
    assert pol2.overflow("b", req, 12.0) == pytest.approx(200)


# ----------------------------------------------------------------------------- FlowKV
def flowkv(**over):
    cfg = {"name": "flowkv", "prefix": FIXED, "ttft": {"prior_tp_s": TP}}
    cfg.update(over)
    return build_policy(cfg, targets=["a", "b"])


def test_flowkv_node_score_and_sliding_window():
    pol = flowkv()
    pol.on_stats("a", ReplicaStats(num_running=64, num_waiting=32, kv_cache_usage=0.5, max_num_seqs=128, timestamp=0.0))
    # 0.3·64/128 + 0.4·32/128 + 0.2·0.5 + 0.1·min(1, 32·512/8192)
    assert pol.node_score("a") == pytest.approx(0.15 + 0.1 + 0.1 + 0.1)
    pol.on_stats("a", ReplicaStats(num_running=0, num_waiting=0, kv_cache_usage=0.1, max_num_seqs=128, timestamp=1.0))
    assert pol.smoothed("a") == pytest.approx((0.25, 0.125, 0.3, 1.0))  # mean of the two reports
    pol.on_stats("a", ReplicaStats(num_running=0, num_waiting=0, kv_cache_usage=0.1, max_num_seqs=128, timestamp=10.0))
    assert pol.smoothed("a") == pytest.approx((0.0, 0.0, 0.1, 0.0))  # older reports left the 5 s window
    pol.on_dispatch(rq(0, "x" * 4000), "a", 11.0)  # unseen: +1/128 waiting, +1000/8192 budget
    assert pol.node_score("a") == pytest.approx(0.4 / 128 + 0.2 * 0.1 + 0.1 * 1000 / 8192)


def test_flowkv_states_route_differently():
    pol = flowkv(eps_low=0.3, eps_high=0.6, idle_threshold=0.3, extreme_duration_s=5.0)
    hot = dict(kv_cache_usage=0.9, max_num_seqs=10)
    # normal: both idle -> TTFT cost; a has the prefix
    pol.on_dispatch(rq(0, P + "a" * 1952), "a", 0.0)
    pol.on_complete("r0", "a", 0.5)
    d = pol.choose(rq(1, P + "b" * 1952), 1.0)
    assert pol.state == "normal" and d.target == "a" and d.reason == "normal_ttft"
    # imbalanced: a is busy (not idle), b idle -> b even though a has the prefix
    pol.on_stats("a", ReplicaStats(num_running=10, num_waiting=10, timestamp=2.0, **hot))  # 0.3+0.4+0.18+0.1 = 0.98
    pol.on_stats("b", ReplicaStats(num_running=0, num_waiting=0, timestamp=2.0, kv_cache_usage=0.0, max_num_seqs=10))
    d = pol.choose(rq(2, P + "c" * 1952), 2.5)
    assert pol.state == "imbalanced" and pol.system_score == pytest.approx(0.49) and d.target == "b"
    assert d.reason == "imbalanced_idle_ttft"
    # extreme: both hot -> least score; scale up once it lasted extreme_duration_s
    pol.on_stats("b", ReplicaStats(num_running=10, num_waiting=5, timestamp=3.0, **hot))  # 0.3+0.2+0.18+0.1=0.78
    d = pol.choose(rq(3, P + "d" * 1952), 3.0)
    assert pol.state == "extreme" and d.target == "b" and d.reason == "extreme_least_score"
    assert pol.scale_signal is None
    pol.choose(rq(4, "e" * 100), 8.5)
    assert pol.scale_signal == "up" and pol.describe()["scale_signal"] == "up"
