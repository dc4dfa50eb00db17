"""What cross-region work stealing costs (issue 28 item 4), side by side in one run, no Ray.

    python benchmarks/bench_steal.py [--requests 4000] [--rounds 5]

1. **The local decision path**: one region's ``RegionRouter`` (GeoPrefix, 8 replicas, two peers) decides and
   dispatches the same requests with stealing off and on, interleaved round by round (A, B, A, B, ...);
   per-request ``decide`` + ``on_dispatch`` + ``on_complete`` latency p50 / p99 of each, and their ratio.
   Stealing adds nothing to ``decide``; the thief's check runs after a completion (as the drivers call it):
   its cost is timed separately, when no peer holds requests (the common case: one dict scan) and when
   every peer does (an offer is built).
2. **Offer bytes**: the JSON wire size of an offer (``StealOffer.to_wire``) with no prefix summary, and
   with this region's summary at its bound (``summary_max_keys`` keys); heartbeats are unchanged by
   stealing (the thief reads the queue length they already carry).
3. **A victim's pick**: ``Victim.pick`` over a held queue of 64 requests (its ``scan`` bound) with a full
   summary in the offer.

Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time

from ray_geolb.percentile import percentile
from ray_geolb.policy import PeerState, ReplicaStats, RouteRequest, build_policy
from ray_geolb.policy.region import GEOPREFIX_COST, RegionRouter, TwoLayerConfig
from ray_geolb.policy.region.steal import StealOffer


def _prompts(n: int, seed: int = 0):
    rng = random.Random(seed)
    alphabet = string.ascii_letters + "      "
    heads = ["".join(rng.choices(alphabet, k=1000)) for _ in range(32)]
    return [heads[rng.randrange(32)] + "".join(rng.choices(alphabet, k=3000)) for _ in range(n)]


def _router(steal: bool) -> RegionRouter:
    targets = [f"us-{i}" for i in range(8)]
    local = build_policy("geoprefix", targets=targets)
    for t in targets:
        local.on_stats(t, ReplicaStats(max_num_seqs=256, timestamp=0.0))
    r = RegionRouter(TwoLayerConfig(region="us", remote="cost", cost=GEOPREFIX_COST,
                                    steal={"enabled": steal}), local)
    for p in ("eu", "asia"):
        r.update_peer(PeerState(p, 2, 0, 0.5, rtt_s=0.1, extra={"replicas": 2, "queued_tokens": 0}))
    return r


def _decide_round(r: RegionRouter, prompts, base: int):
    lat = []
    clock = time.perf_counter
    for i, text in enumerate(prompts):
        req = RouteRequest(f"r{base + i}", text)
        t0 = clock()
        d = r.decide(req, 1.0)
        if d.kind == "local":
            r.on_dispatch(req, d.target, 1.0)
            r.local.on_complete(req.request_id, d.target, 1.0)
        lat.append(clock() - t0)
    return lat


def _thief_check(r: RegionRouter, n: int, busy: bool):
    """The thief's check after a local completion: ``Thief.offers`` with the router's price."""
    for p in r.peers.values():
        p.queue_len = 5 if busy else 0
    lat = []
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        offers = r.thief.offers(r, 1.0, 4, 0, *r.steal_price())
        lat.append(clock() - t0)
        for peer, _o in offers:  # answered at once: the next check offers again
            r.thief.forget(peer)
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    prompts = _prompts(args.requests)
    off, on = _router(False), _router(True)
    lat = {"off": [], "on": []}
    for k in range(args.rounds):  # interleaved A/B: the machine's drift hits both alike
        lat["off"] += _decide_round(off, prompts, 2 * k * args.requests)
        lat["on"] += _decide_round(on, prompts, (2 * k + 1) * args.requests)
    us = {k: [x * 1e6 for x in v] for k, v in lat.items()}
    p = {k: percentile(v, (50, 99)) for k, v in us.items()}
    print(f"decide + dispatch + complete, {args.requests} requests x {args.rounds} rounds, 8 replicas, 2 peers:")
    print("stealing  p50 us   p99 us")
    for k in ("off", "on"):
        print(f"{k:8s}  {p[k][0]:7.1f}  {p[k][1]:7.1f}")
    print(f"ratio on/off: p50 {p['on'][0] / p['off'][0]:.3f}, p99 {p['on'][1] / p['off'][1]:.3f}")

    idle = [x * 1e6 for x in _thief_check(on, 20000, busy=False)]
    busy = [x * 1e6 for x in _thief_check(on, 5000, busy=True)]
    print("\nthief check after a local completion (stealing on), p50 / p99 us:")
    print(f"  no peer holds requests: {percentile(idle, (50,))[0]:.2f} / {percentile(idle, (99,))[0]:.2f}")
    print(f"  both peers hold requests (two offers built): {percentile(busy, (50,))[0]:.2f} / "
          f"{percentile(busy, (99,))[0]:.2f}")

    # offer bytes: no summary, and a summary at its bound (fill the prefix index with many distinct prompts)
    bare = StealOffer(1, "us", 4, 0.05, 1e-4)
    full_router = _router(True)
    cap = full_router.selector.config.summary_max_keys
    for i, text in enumerate(_prompts(3 * cap, seed=1)):
        req = RouteRequest(f"f{i}", text)
        full_router.on_dispatch(req, f"us-{i % 8}", 1.0)
    summary = full_router.prefix_summary()
    full = StealOffer(2, "us", 4, 0.05, 1e-4, summary)
    size = {k: len(json.dumps(o.to_wire(), separators=(",", ":"))) for k, o in (("bare", bare), ("full", full))}
    print(f"\noffer wire bytes: without a summary {size['bare']}; with a summary of {summary.n} keys "
          f"(summary_max_keys {cap}) {size['full']}")

    # a victim's pick over a held queue of 64 requests against the full summary
    victim = full_router.victim
    held = [(f"h{i}", RouteRequest(f"h{i}", t)) for i, t in enumerate(_prompts(64, seed=2))]
    picks = []
    for _ in range(200):
        t0 = time.perf_counter()
        victim.pick(full, held, 0.1, lambda i, tok, req: 5.0, max_hops=1, min_match_chars=256)
        picks.append((time.perf_counter() - t0) * 1e6)
    print(f"victim pick over 64 held requests (full summary): p50 {percentile(picks, (50,))[0]:.0f} us, "
          f"p99 {percentile(picks, (99,))[0]:.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
