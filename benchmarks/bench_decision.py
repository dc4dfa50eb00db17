"""Per-request routing decision latency and index memory: ray_geolb vs Ray's PrefixTree, one run.

For each prompt size (~2k, ~32k, ~128k characters) and target count (16, 256):
  ours  = SkyLB policy ``choose`` + ``on_dispatch`` (canonical text hashing, prefix match among
          available targets, pick, insert, in-flight accounting) -- the full decision path;
  ray   = Ray 2.60 ``PrefixTree.prefix_match`` + ``insert`` (what PrefixCacheAffinityRouter does
          per request, minus its actor round trips) on the same prompts.
Prompts: 32 shared "system prompts" (1/8 of the length) + a unique remainder, shuffled groups.
Memory: tracemalloc bytes held per million stored characters after inserting the same prompts.

Run:  python benchmarks/bench_decision.py            (add --quick for a smaller run)
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import string
import sys
import time
import tracemalloc

from ray_geolb.percentile import percentile


def make_prompts(n, length, seed):
    rng = random.Random(seed)
    alphabet = string.ascii_letters + "      "
    heads = ["".join(rng.choices(alphabet, k=length // 8)) for _ in range(32)]
    return [heads[rng.randrange(32)] + "".join(rng.choices(alphabet, k=length - length // 8)) for _ in range(n)]


def bench_ours(prompts, n_targets):
    from ray_geolb.policy import ReplicaStats, RouteRequest, build_policy

    targets = [f"replica-{i}" for i in range(n_targets)]
    pol = build_policy({"name": "skylb", "prefix": {"max_nodes": 1_000_000}}, targets=targets)
    for t in targets:
        pol.on_stats(t, ReplicaStats(max_num_seqs=256, timestamp=0.0))
    lat = []
    clock = time.perf_counter
    for i, text in enumerate(prompts):
        req = RouteRequest(f"r{i}", text)
        t0 = clock()
        d = pol.choose(req, 1.0)
        pol.on_dispatch(req, d.target, 1.0)
        lat.append(clock() - t0)
        pol.on_complete(req.request_id, d.target)
    return lat


def bench_ray(prompts, n_targets):
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTree

    targets = [f"replica-{i}" for i in range(n_targets)]
    tree = PrefixTree()
    tree.add_tenants(targets, 0.0)
    rng = random.Random(0)
    lat = []
    clock = time.perf_counter
    for text in prompts:
        t0 = clock()
        matched, tenants = tree.prefix_match(text, targets)
        tenant = rng.choice(tenants) if tenants else rng.choice(targets)
        tree.insert(text, tenant, time.time())
        lat.append(clock() - t0)
    return lat


def memory_per_million_chars(prompts, n_targets):
    from ray_geolb.policy import PrefixIndex

    out = {}
    gc.collect()
    tracemalloc.start()
    idx = PrefixIndex(max_nodes=None)
    for i, p in enumerate(prompts):
        idx.insert(p, f"replica-{i % n_targets}")
    cur, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stored = sum(len(p) for p in prompts)
    out["ours"] = cur / stored * 1e6
    del idx
    try:
        from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTree
    except ImportError:
        return out
    gc.collect()
    tracemalloc.start()
    tree = PrefixTree()
    tree.add_tenants([f"replica-{i}" for i in range(n_targets)], 0.0)
    for i, p in enumerate(prompts):
        tree.insert(p, f"replica-{i % n_targets}", 0.0)
    cur, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["ray"] = cur / stored * 1e6
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts per case")
    args = ap.parse_args(argv)
    sizes = {"2k": (2_000, 3000), "32k": (32_000, 800), "128k": (128_000, 200)}
    if args.quick:
        sizes = {k: (v[0], max(50, v[1] // 5)) for k, v in sizes.items()}
    try:
        import ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree  # noqa: F401
        have_ray = True
    except ImportError:
        have_ray = False
        print("Ray's PrefixTree is not importable: install ray[serve]==2.60.* for the comparison", file=sys.stderr)
    rows = []
    for label, (length, n) in sizes.items():
        prompts = make_prompts(n, length, seed=length)
        for n_targets in (16, 256):
            ours = bench_ours(prompts, n_targets)
            ray_ = bench_ray(prompts, n_targets) if have_ray else None
            ours_p50, ours_p99 = percentile(ours, (50, 99))
            row = {
                "prompt": label, "targets": n_targets, "n": n,
                "ours_p50_us": ours_p50 * 1e6, "ours_p99_us": ours_p99 * 1e6,
            }
            if ray_:
                ray_p50, ray_p99 = percentile(ray_, (50, 99))
                row.update(ray_p50_us=ray_p50 * 1e6, ray_p99_us=ray_p99 * 1e6,
                           speedup_p50=ray_p50 / ours_p50,
                           speedup_mean=statistics.mean(ray_) / statistics.mean(ours))
            rows.append(row)
            print(f"  done {label} x {n_targets} targets", file=sys.stderr)
    print("\nDecision latency (match + pick + insert), microseconds")
    hdr = (f"{'prompt':>6} {'targets':>7} {'n':>5} | {'ours p50':>9} {'ours p99':>9} | "
           f"{'ray p50':>9} {'ray p99':>9} | {'x p50':>6} {'x mean':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        rp = (f"{r['ray_p50_us']:9.1f} {r['ray_p99_us']:9.1f} | {r['speedup_p50']:6.1f} {r['speedup_mean']:6.1f}"
              if "ray_p50_us" in r else f"{'-':>9} {'-':>9} | {'-':>6} {'-':>6}")
        print(f"{r['prompt']:>6} {r['targets']:>7} {r['n']:>5} | "
              f"{r['ours_p50_us']:9.1f} {r['ours_p99_us']:9.1f} | {rp}")
    mem = memory_per_million_chars(make_prompts(300, 32_000, seed=9), 16)
    print("\nIndex memory per million stored characters (32k prompts, 16 targets):")
    for k, v in mem.items():
        print(f"  {k:>4}: {v / 1e6:8.2f} MB")
    gate = [r for r in rows if r["prompt"] == "32k" and r["targets"] == 256][0]
    ok = gate["ours_p50_us"] <= 100 and gate["ours_p99_us"] <= 1000 and gate.get("speedup_p50", 99) >= 3
    print(f"\n32k x 256 gate (p50 <= 100 us, p99 <= 1 ms, >= 3x Ray): {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
