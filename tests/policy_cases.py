"""Shared cases of the policy tests: fixed 64-char prefix blocks, a 1 ms/token prior t_p (costs easy to
compute by hand), a 2,048-char shared prefix, and small builders of cost policies and region routers."""

from ray_geolb.policy import RegionRouter, ReplicaStats, RouteRequest, TwoLayerConfig, build_policy

FIXED = {"block_chars": 64, "growth": 0.0}  # fixed 64-char blocks: matches are exact multiples of 64
TP = 0.001  # 1 ms per token, so costs are easy to compute by hand
NEW = ("gorgo", "gorgo_proxy", "vllm_default", "jsq_load", "br0", "flowkv", "geoprefix")

P = "".join(chr(97 + (i * 7) % 26) for i in range(2048))  # 2048-char shared prefix


def rq(i, text, **kw):
    return RouteRequest(f"r{i}", text, **kw)


def cost_policy(name="gorgo", targets=("a", "b"), **over):
    cfg = {"availability": {"mode": "bp"}, "prefix": FIXED, "ttft": {"prior_tp_s": TP, "prior_base_s": 0.1}}
    cfg.update(over)
    return build_policy({"name": name, **cfg}, targets=list(targets))


def region(name="us", policy="geoprefix", targets=("us-0", "us-1"), **two):
    local = build_policy({"name": policy, "prefix": FIXED, "ttft": {"prior_tp_s": TP}}, targets=list(targets)) \
        if policy in ("gorgo", "geoprefix", "flowkv", "gorgo_proxy") else build_policy(policy, targets=list(targets))
    for t in targets:
        local.on_stats(t, ReplicaStats(max_num_seqs=64, timestamp=0.0))
    return RegionRouter(TwoLayerConfig(region=name, **two), local)


def fill(r, now=1.0):
    for t in r.local.targets:
        r.local.on_stats(t, ReplicaStats(num_waiting=1, timestamp=now))
