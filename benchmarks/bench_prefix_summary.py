"""Cost of the cross-region prefix summary: bytes per heartbeat, build / parse time, and
the extra time a GeoPrefix region decision spends matching the peers' summaries.

A region ``us`` (GeoPrefix's local policy over 2 replicas, the 'cost' selector with ``GEOPREFIX_COST``)
with two peers whose heartbeats carry summaries of full indexes (``--docs`` contexts of 4-8k tokens
each, then unique questions, sent to their replicas). The same requests are decided by two routers that
differ only in ``peer_summary`` (on: the summaries are matched and priced; off: ignored), interleaved
request by request; a decision is ``RegionRouter.decide`` (a local replica is free, 8 requests in flight
on each, so GeoPrefix prices staying against both peers: ``forward_before_saturation``). Requests:
``context`` (a context one peer holds + a new question: the deepest match), ``miss`` (a context nobody
holds) and ``chat`` (2k characters of unique text). "match" is the two summary lookups alone (the request
already hashed; in a decision the hashing is shared with the regional snapshot's).

Run:  python benchmarks/bench_prefix_summary.py            (add --quick for a smaller run)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from ray_geolb.percentile import percentile
from ray_geolb.policy import PeerState, RegionRouter, ReplicaStats, RouteRequest, TwoLayerConfig, build_policy
from ray_geolb.policy.region import GEOPREFIX_COST
from ray_geolb.policy.region.prefix_summary import PrefixSummary

WORDS = "the of and to in is that for it as was with be by on not he this are or region replica cache".split()


def text(rng: random.Random, chars: int) -> str:
    out, n = [], 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def router(name: str, peer_summary: bool) -> RegionRouter:
    targets = [f"{name}-0", f"{name}-1"]
    local = build_policy("geoprefix", targets=targets)
    for t in targets:
        local.on_stats(t, ReplicaStats(max_num_seqs=256, timestamp=0.0))
    cost = GEOPREFIX_COST.model_copy(update={"peer_summary": peer_summary})
    return RegionRouter(TwoLayerConfig(region=name, remote="cost", cost=cost), local)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=32, help="contexts each peer's replicas hold")
    ap.add_argument("--requests", type=int, default=2000, help="decisions per request kind")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests = 300
    rng = random.Random(0)
    docs = [text(rng, rng.randint(16_000, 32_000)) for _ in range(3 * args.docs)]
    peers = {}
    build_s, parse_s, sizes = [], [], []
    for k, name in enumerate(("eu", "asia")):
        p = router(name, True)
        for i, d in enumerate(docs[k * args.docs:(k + 1) * args.docs]):
            for j in range(4):  # each context asked about 4 times
                p.on_dispatch(RouteRequest(f"{name}{i}.{j}", d + text(rng, 600)), f"{name}-{j % 2}", float(i))
        for _ in range(20):  # a heartbeat after each new insert: build, send, parse
            p.on_dispatch(RouteRequest(f"{name}x{_}", text(rng, 2000)), f"{name}-0", 1e6 + _)
            t0 = time.perf_counter()
            s = p.prefix_summary()
            wire = s.to_wire()
            t1 = time.perf_counter()
            blob = json.dumps(wire, separators=(",", ":"))
            t2 = time.perf_counter()
            parsed = PrefixSummary.from_wire(json.loads(blob))
            t3 = time.perf_counter()
            build_s.append(t1 - t0)
            parse_s.append(t3 - t2)
            sizes.append(len(blob))
        hb = p.heartbeat(0, 1.0, queued_tokens=0.0)
        peers[name] = PeerState(name, 2, 0, 1.0, rtt_s=0.1 if name == "eu" else 0.2, extra=hb.extra,
                                prefix_summary=parsed)
        print(f"{name}: index {p.local.index.num_nodes} blocks -> {parsed}", file=sys.stderr)
    on, off = router("us", True), router("us", False)
    busy = [text(rng, 1000) for _ in range(16)]
    for r in (on, off):
        for j, t in enumerate(busy):  # 8 requests in flight on each local replica (none finishes)
            r.on_dispatch(RouteRequest(f"busy{j}", t), f"us-{j % 2}", 1.0)
        for ps in peers.values():
            r.update_peer(PeerState(ps.region, ps.available_replicas, ps.queue_len, ps.timestamp, ps.rtt_s,
                                    dict(ps.extra), prefix_summary=ps.prefix_summary))
    kinds = {
        "context": lambda i: rng.choice(docs[:2 * args.docs]) + text(rng, 600),
        "miss": lambda i: rng.choice(docs[2 * args.docs:]) + text(rng, 600),
        "chat": lambda i: text(rng, 2000),
    }
    clock = time.perf_counter
    print("\nDecision (RegionRouter.decide, GeoPrefix, 2 peers with summaries), microseconds")
    print(f"{'request':>8} {'n':>5} | {'off p50':>8} {'off p99':>8} | {'on p50':>8} {'on p99':>8} | "
          f"{'extra p50':>9} | match p50 p99 | forwards on / off")
    for kind, make in kinds.items():
        lat = {True: [], False: []}
        fwd = {True: 0, False: 0}
        for i in range(args.requests):
            t = make(i)
            for flag, r in ((True, on), (False, off)) if i % 2 else ((False, off), (True, on)):
                req = RouteRequest(f"{kind}{i}", t)
                t0 = clock()
                d = r.decide(req, 2.0)
                lat[flag].append(clock() - t0)
                fwd[flag] += d.kind == "forward"
        (a50, a99), (b50, b99) = percentile(lat[False], (50, 99)), percentile(lat[True], (50, 99))
        match = []  # the summary lookups alone: both peers' summaries, request already hashed
        for i in range(args.requests):
            prep = peers["eu"].prefix_summary.prepare(make(i))
            t0 = clock()
            for ps in peers.values():
                ps.prefix_summary.match_keys(prep.keys, prep.ends)
            match.append(clock() - t0)
        m50, m99 = percentile(match, (50, 99))
        print(f"{kind:>8} {args.requests:>5} | {a50 * 1e6:8.1f} {a99 * 1e6:8.1f} | {b50 * 1e6:8.1f} {b99 * 1e6:8.1f} | "
              f"{(b50 - a50) * 1e6:9.1f} | {m50 * 1e6:5.1f} {m99 * 1e6:5.1f} | {fwd[True]} / {fwd[False]}")
    b50, b99 = percentile(build_s, (50, 99))
    p50, p99 = percentile(parse_s, (50, 99))
    print(f"\nsummary per heartbeat: {min(sizes)}-{max(sizes)} bytes of JSON; build + to_wire p50 {b50 * 1e3:.2f} ms "
          f"(p99 {b99 * 1e3:.2f}); from_wire p50 {p50 * 1e3:.3f} ms (p99 {p99 * 1e3:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
