"""What the holder pass (``CostConfig.holder_pass_share``) adds to a GeoPrefix decision, side by side in one run.

8 replicas; the first 4 report 10 requests waiting (no slot: GeoPrefix's allowance is 8), the other 4 have slots.
20 conversations (~3,600 characters each) are indexed on the slotless replicas, then 3,000 turns of them are
routed: without the pass ``choose`` prices the 4 replicas with slots; with it, it also matches the prompt against
the 4 without and prices those holding at least half of it. Slots are never spent (``max_burst`` and the sequence
slots are unbounded), so every decision sees the same state. The median ``choose`` time per config over 3
alternating rounds, the best round of each, and their ratio.

Run:  python benchmarks/bench_holder_pass.py
"""

from __future__ import annotations

import random
import statistics
import time

from ray_geolb.policy import RouteRequest, build_policy
from ray_geolb.policy.availability import ReplicaStats

TARGETS = [f"r{i}" for i in range(8)]
SLOTLESS = 4


def policy(share):
    p = build_policy({"name": "geoprefix", "holder_pass_share": share,
                      "availability": {"slots_by_uncached_share": share is not None, "max_burst": 10**6}},
                     targets=TARGETS)
    for i, t in enumerate(TARGETS):
        p.on_stats(t, ReplicaStats(num_waiting=10 if i < SLOTLESS else 0, num_running=0, timestamp=0.0,
                                   max_num_seqs=10**6))
    return p


def one_round(share, convs, turns):
    p = policy(share)
    for k, c in enumerate(convs):  # each conversation once, on a replica without a slot
        p.on_dispatch(RouteRequest(f"seed{k}", c), TARGETS[k % SLOTLESS], 0.0)
    times = []
    for i, prompt in enumerate(turns):
        req = RouteRequest(f"q{i}", prompt)
        t0 = time.perf_counter()
        d = p.choose(req, 1.0)
        times.append(time.perf_counter() - t0)
        assert d is not None
    return statistics.median(times) * 1e6


def main():
    rng = random.Random(0)
    convs = [" ".join(f"conv{k} w{j}" for j in range(400)) for k in range(20)]
    turns = [convs[rng.randrange(len(convs))] + f" turn {i}" for i in range(3000)]
    res = {None: [], 0.5: []}
    for _ in range(3):
        for share in res:
            res[share].append(one_round(share, convs, turns))
    for share, v in res.items():
        print(f"holder_pass_share={share}: choose median {min(v):.1f} us per decision "
              f"(rounds {', '.join(f'{x:.1f}' for x in v)})")
    print(f"ratio with / without the pass: {min(res[0.5]) / min(res[None]):.2f}")


if __name__ == "__main__":
    main()
