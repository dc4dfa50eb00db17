"""Where GeoPrefixRouter's time per request goes, without a cluster (an attribution aid for
``bench_router.py``, not a substitute for it).

    python benchmarks/profile_router_path.py [--requests 3000] [--policies geoprefix,skylb] [--evict-mb 32]

It drives one GeoPrefixRouter's own hooks -- ``choose_replicas``, ``on_request_routed``,
``on_request_completed`` and the replica-set sync -- in a plain asyncio loop, on ``bench_router.py``'s
workload (32 shared 4,000-character system prompts + ~28,000 unique characters, each prompt built
when its request is sent, 8 replicas, 16 requests in flight, a report from every replica every 0.5 s
saying nothing waits and how many run). Ray's ``PendingRequest`` and ``RunningReplica`` are stood in
for by objects with the attributes the router reads (metadata ids, args, future, created_at,
routing_context; replica_id, replica_metadata, routing_stats): nothing is sent anywhere, so the
figures are the router's Python alone, on a warm cache, without Ray's threads and the replica
processes beside it (``bench_router.py`` measures that; on this 2-core machine the same calls cost
3-5x as much there).

``--evict-mb`` runs each policy a second time with the CPU caches evicted before every request (``CacheEvictor``:
outside the timed hooks), side by side with the warm run: what the same Python costs when Ray's threads and the
replica processes on the same cores have displaced its data between two requests.

Prints, per policy: the time inside ``choose_replicas`` + ``on_request_routed`` per request
(p50 / p99, ``perf_counter``), then a second pass with each stage wrapped in a timer (the wrappers
add ~0.3 us per call, so the stages are an attribution, not exact): hashing the prompt
(``PrefixIndex.prepare``), the tree walk (``match``, ``insert``), the policy's choice, the request
book. Writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_router import light_report, make_workload  # noqa: E402
from router_stages import STAGES, unwrap_stages, wrap_stages  # noqa: E402

from ray_geolb.percentile import percentile  # noqa: E402
from ray_geolb.serve.router import GeoPrefixRouter  # noqa: E402

REPORT_PERIOD_S = 0.5  # bench_router's request_routing_stats_period_s
WARMUP = 200


class _Future:
    def done(self) -> bool:
        return False


class _Replica:
    """What GeoPrefixRouter reads of a Ray ``RunningReplica``."""

    def __init__(self, uid: str):
        self.replica_id = SimpleNamespace(unique_id=uid)
        self.replica_metadata = {}
        self.inflight = 0
        self.routing_stats = {}

    def report(self) -> None:  # as bench_router's light deployment reports
        self.routing_stats = light_report(self.inflight)


def _router(policy: str) -> GeoPrefixRouter:
    r = object.__new__(GeoPrefixRouter)  # Ray's RequestRouter.__init__ needs a deployment; the hooks do not
    r._replicas = {}
    r._deployment_id = None
    r.initialize_state(policy={"name": policy}, headroom_share="none")
    return r


class CacheEvictor:
    """Between two requests, outside the timed hooks, does what the rest of a Serve process and its neighbours do to
    the CPU caches: reads every cache line of ``mb`` MB and walks ``objects`` small Python objects, so the router's
    next call finds its own data and the interpreter's in DRAM rather than in L1/L2 (--evict-mb, --evict-objects)."""

    def __init__(self, mb: int, objects: int):
        self.buf = bytearray(mb * 1024 * 1024)
        self.objs = [{"i": i} for i in range(objects)]

    def __call__(self) -> None:
        if self.buf:
            bytes(self.buf[::64])  # one byte of every 64-byte line
        for o in self.objs:
            o["i"]


async def _drive(policy: str, n: int, replicas: int = 8, concurrency: int = 16, evict=None) -> list:
    r = _router(policy)
    reps = [_Replica(f"replica-{i}") for i in range(replicas)]
    for x in reps:
        x.report()
    r._sync(reps)
    lat, inflight, last_report = [], [], time.time()
    for i, (_g, make_prompt) in enumerate(make_workload(n + WARMUP)):
        pr = SimpleNamespace(
            metadata=SimpleNamespace(internal_request_id=f"iid-{i}", request_id=f"rid-{i}", session_id=None),
            args=(SimpleNamespace(prompt=make_prompt()),), kwargs={}, future=_Future(), created_at=time.time(),
            routing_context=SimpleNamespace(should_backoff=False))
        if evict is not None:
            evict()
        t0 = time.perf_counter()
        out = await r.choose_replicas(reps, pr)
        if not out or not out[0]:
            raise RuntimeError(f"{policy}: request {i} was held; this profile needs every request routed")
        rep = out[0][0]
        r.on_request_routed(pr, rep.replica_id, None)
        dt = time.perf_counter() - t0
        rep.inflight += 1
        inflight.append((pr, rep))
        if len(inflight) >= concurrency:
            done, at = inflight.pop(0)
            at.inflight -= 1
            r.on_request_completed(at.replica_id, done.metadata.internal_request_id)
        if time.time() - last_report >= REPORT_PERIOD_S:
            for x in reps:
                x.report()
            r._sync(reps)
            last_report = time.time()
        if i >= WARMUP:
            lat.append(dt * 1e6)
    if r.counters["internal_errors"] or r.counters["fallback"]:
        raise RuntimeError(f"{policy}: router errors {r.counters}")
    return lat


def _staged(policy: str, n: int, evict=None) -> dict:
    spent = {}
    saved = wrap_stages(spent)
    try:
        asyncio.run(_drive(policy, n, evict=evict))
    finally:
        unwrap_stages(saved)
    return {label: spent.get(label, 0.0) / (n + WARMUP) * 1e6 for _o, _n, label in STAGES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--policies", default="geoprefix,skylb")
    ap.add_argument("--evict-mb", type=int, default=0,
                    help="also run each policy with the CPU caches evicted between requests: read this many MB "
                         "(and walk --evict-objects objects) before each request, outside the timed hooks")
    ap.add_argument("--evict-objects", type=int, default=300_000)
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    print(f"GeoPrefixRouter's hooks in-process: {args.requests} requests (+{WARMUP} warm-up), 8 replicas, "
          f"concurrency 16, reports every {REPORT_PERIOD_S} s, bench_router's workload")
    for p in policies:
        lat = asyncio.run(_drive(p, args.requests))
        p50, p99 = percentile(lat, (50, 99))
        print(f"{p:10s} choose_replicas + on_request_routed per request: p50 {p50:6.1f} us  p99 {p99:6.1f} us")
        if args.evict_mb:
            ev = CacheEvictor(args.evict_mb, args.evict_objects)
            e50, e99 = percentile(asyncio.run(_drive(p, args.requests, evict=ev)), (50, 99))
            print(f"{'':10s} the same, caches evicted between requests ({args.evict_mb} MB read, "
                  f"{args.evict_objects:,} objects walked): p50 {e50:6.1f} us  p99 {e99:6.1f} us  "
                  f"({e50 / p50:.1f}x the p50)")
    columns = {p: _staged(p, args.requests) for p in policies}
    if args.evict_mb:
        ev = CacheEvictor(args.evict_mb, args.evict_objects)
        columns.update({f"{p} evicted": _staged(p, args.requests, evict=ev) for p in policies})
    print("\nstages, mean us per request (each wrapped in a timer; nested stages are included in their callers)")
    print(f"{'stage':58s}" + "".join(f"{c:>18s}" for c in columns))
    for _o, _n, label in STAGES:
        print(f"{label:58s}" + "".join(f"{col[label]:18.1f}" for col in columns.values()))


if __name__ == "__main__":
    main()
