"""Router overhead benchmark on a real local Ray Serve deployment (one run, five routers).

    python benchmarks/bench_router.py [--requests 600] [--concurrency 16] [--replicas 8]

For each router -- GeoPrefixRouter with its default policy (GeoPrefix), the same with the shared affinity
view of a region's ingress replicas (``SharedViewRouter``: its dispatches go out as sibling rows, and a
sibling with the same traffic sends as many back every 0.25 s, which it learns: ``SiblingFeeder``) and with
policy skylb, Ray's PrefixCacheAffinityRouter and Ray's default PowerOfTwoChoicesRequestRouter -- it deploys
8 replicas of a light deployment (answers at once), sends 600 requests at concurrency 16 through a DeploymentHandle
from this process (so the router runs here), and reports:

* time inside ``choose_replicas`` + ``on_request_routed`` per request (sum over the calls of one
  request), p50 / p99, measured by thin timing subclasses with ``time.perf_counter``;
* requests/s through the handle;
* affinity: share of a prompt group's later requests that land on the replica its first went to;
* warm: share of a group's later requests that land on *a* replica that was already sent that group's
  system prompt (a prefix-cache hit at a replica whose cache holds it, whichever replica that is);
* per-replica request counts (spread).

Workload: 32 shared 4,000-character system prompts, each request = one of them + ~28,000 unique
characters (Ray's PrefixCacheAffinityRouter needs a ``.prompt`` attribute, so requests are
``SimpleNamespace(prompt=...)``; GeoPrefixRouter reads the same field through ``canonical_text``).
Each prompt is built when its request is sent, as an ingress builds it from the body it has just read;
``--prebuilt-prompts`` builds all 19 MB of them first instead, so every router reads its prompt from
DRAM -- the hashing pass over a cold 32 KB prompt then costs GeoPrefixRouter ~25 us more.

SP-P and a fast replica: the light deployment reports ``num_waiting=0``, ``num_running=<in flight>``
and ``max_num_seqs=256`` (no KV fields), so the router knows each replica's headroom
(min(max_burst, 256 - running)). GeoPrefixRouter runs with its defaults (``max_burst`` 32 per report;
credits also come back on every completion); ``--max-burst N`` sets ``availability.max_burst`` for
both GeoPrefixRouter rows, and the run prints it. ``--stages`` also times the GeoPrefixRouter rows' stages (hashing,
tree walk, pricing, request book: ``router_stages.py``) in thread CPU time, to set beside
``profile_router_path.py``'s in-process figures. Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import statistics
import string
import time
from collections import Counter
from types import SimpleNamespace

import bench_state  # benchmarks/ is sys.path[0] when this runs
import ray
from ray import serve
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter
from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from router_stages import wrap_stages  # benchmarks/ is sys.path[0] when this runs

import ray_geolb.serve as geo_serve
from ray_geolb.percentile import percentile
from ray_geolb.serve.local import start_local_ray
from ray_geolb.serve.router import DEFAULT_POLICY, GeoPrefixRouter


# ------------------------------------------------------------------ timing subclasses
def _timed(base, label):
    class Timed(base):
        # The clocks stop before the bookkeeping below, so only the router's own call is timed.
        async def choose_replicas(self, candidate_replicas, pending_request=None):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return await base.choose_replicas(self, candidate_replicas, pending_request)
            finally:
                dt, dc = time.perf_counter() - t0, time.thread_time() - c0
                if pending_request is not None:
                    import bench_state

                    d = bench_state.TIMES.setdefault(("bench", label), {})
                    c = bench_state.TIMES.setdefault(("bench-cpu", label), {})
                    k = pending_request.metadata.internal_request_id
                    d[k] = d.get(k, 0.0) + dt
                    c[k] = c.get(k, 0.0) + dc

        def on_request_routed(self, pending_request, replica_id, result):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return base.on_request_routed(self, pending_request, replica_id, result)
            finally:
                dt, dc = time.perf_counter() - t0, time.thread_time() - c0
                import bench_state

                d = bench_state.TIMES.setdefault(("bench", label), {})
                c = bench_state.TIMES.setdefault(("bench-cpu", label), {})
                k = pending_request.metadata.internal_request_id
                d[k] = d.get(k, 0.0) + dt
                c[k] = c.get(k, 0.0) + dc

    Timed.__name__ = Timed.__qualname__ = f"Timed{label}"
    return Timed


class SharedViewRouter(GeoPrefixRouter):
    """GeoPrefixRouter as one of two ingress replicas of a region (its handle runs in this driver, where Serve's
    replica context says one): its dispatches go to its sibling outbox, and :class:`SiblingFeeder` plays a
    sibling with the same traffic, whose rows it learns (the shared affinity view)."""

    def _update_share(self):
        super()._update_share()
        self.sibling_outbox.enabled = True  # as the region ingress enables it with several replicas
        self.policy.sibling_outbox = self.sibling_outbox


class SiblingFeeder:
    """A sibling router with the same traffic, seen from the router under test: every ``period_s`` (a
    heartbeat) the router's own rows since the last one come back as the sibling's (same prompts, same
    replicas), into its ``sibling_inbox``, and the router is told to learn them -- what the registry's reply
    brings an ingress replica whose sibling routes as much as it does."""

    def __init__(self, router, period_s: float = 0.25):
        import threading

        self.router, self.period_s, self.rows = router, period_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.period_s):
            rows = self.router.sibling_outbox.take(512)
            self.router.sibling_inbox.extend(rows)
            self.rows += len(rows)
            self.router.publish_soon_threadsafe()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.rows


TimedGeo = _timed(GeoPrefixRouter, "Geo")
TimedGeoShared = _timed(SharedViewRouter, "GeoShared")
TimedGeoSky = _timed(GeoPrefixRouter, "GeoSky")
TimedPrefix = _timed(PrefixCacheAffinityRouter, "Prefix")
TimedPow2 = _timed(PowerOfTwoChoicesRequestRouter, "Pow2")
globals().update({c.__name__: c for c in (TimedGeo, TimedGeoShared, TimedGeoSky, TimedPrefix, TimedPow2)})


# ------------------------------------------------------------------ light deployment
class Light:
    """Answers at once; reports load + capacity so SP-P knows the headroom."""

    def __init__(self):
        self.inflight = 0
        self.served = 0
        self.rid = serve.get_replica_context().replica_id.unique_id

    async def __call__(self, body):
        self.inflight += 1
        try:
            await asyncio.sleep(0)
            self.served += 1
            return self.rid
        finally:
            self.inflight -= 1

    def record_routing_stats(self):
        return light_report(self.inflight)


def light_report(inflight: int) -> dict:
    """The light deployment's routing stats: nothing waits, ``inflight`` run, 256 sequence slots."""
    return {"num_waiting": 0, "num_running": inflight, "max_num_seqs": 256, "timestamp": time.time()}


ROUTERS = [
    (f"GeoPrefixRouter({DEFAULT_POLICY})", TimedGeo, "Geo", {"policy": {"name": DEFAULT_POLICY}}),
    ("GeoPrefixRouter(shared view)", TimedGeoShared, "GeoShared", {"policy": {"name": DEFAULT_POLICY}}),
    ("GeoPrefixRouter(skylb)", TimedGeoSky, "GeoSky", {"policy": {"name": "skylb"}}),
    ("PrefixCacheAffinityRouter", TimedPrefix, "Prefix", {}),
    ("PowerOfTwo (default)", TimedPow2, "Pow2", {}),
]


def make_workload(n, groups=32, sys_chars=4000, uniq_chars=28000, seed=0):
    """[(group, make_prompt)]: each request's prompt is built by ``make_prompt()`` when it is sent,
    as an ingress builds it from the body it just read (see ``--prebuilt-prompts``)."""
    rng = random.Random(seed)
    alpha = string.ascii_lowercase + "     "
    sys_prompts = ["".join(rng.choices(alpha, k=sys_chars)) for _ in range(groups)]
    blob = "".join(rng.choices(alpha, k=uniq_chars + 4 * n + 64))
    reqs = []
    for i in range(n):
        g = rng.randrange(groups)
        off = rng.randrange(0, 4 * n)
        reqs.append((g, functools.partial(_prompt, sys_prompts[g], i, blob, off, uniq_chars)))
    return reqs


def _prompt(sys_prompt, i, blob, off, uniq_chars):
    return sys_prompt + f"[req {i}]" + blob[off: off + uniq_chars]


def prebuild(reqs):
    """The same workload with every prompt built up front (pages long cold by the time it is sent)."""
    return [(g, functools.partial(str, make())) for g, make in reqs]


async def drive(h, reqs, concurrency):
    out = [None] * len(reqs)
    idx = iter(range(len(reqs)))

    async def worker():
        for i in idx:
            out[i] = await h.remote(SimpleNamespace(prompt=reqs[i][1]()))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out, time.perf_counter() - t0


def run_one(label, cls, key, kwargs, args, reqs, warm, rnd=0):
    app = f"bench-{key.lower()}-{rnd}"
    dep = serve.deployment(
        Light, name="Light", num_replicas=args.replicas, max_ongoing_requests=1000,
        ray_actor_options={"num_cpus": 0},
        request_router_config={"request_router_class": cls, "request_router_kwargs": kwargs,
                               "request_routing_stats_period_s": 0.5},
    )
    h = serve.run(dep.bind(), name=app, route_prefix=None)
    asyncio.run(drive(h, warm, args.concurrency))  # warm-up: creates the router, first stats
    time.sleep(1.5)
    bench_state.TIMES[("bench", key)] = {}
    bench_state.TIMES[("bench-cpu", key)] = {}
    bench_state.STAGES.clear()
    feeder = SiblingFeeder(geo_serve.router_for(app, "Light")) if key == "GeoShared" else None
    try:
        replicas, wall = asyncio.run(drive(h, reqs, args.concurrency))
    finally:
        fed = feeder.stop() if feeder is not None else None
    stages = {label: sec * 1e6 / len(reqs) for label, sec in bench_state.STAGES.items()}
    times_ms = [v * 1e3 for v in bench_state.TIMES[("bench", key)].values()]
    cpu_ms = [v * 1e3 for v in bench_state.TIMES[("bench-cpu", key)].values()]
    first = {}
    sent = set()  # (group, replica) pairs seen so far, in send order
    hits = later = warm_hits = 0
    for (g, _), rep in zip(reqs, replicas):
        if g not in first:
            first[g] = rep
        else:
            later += 1
            hits += rep == first[g]
            warm_hits += (g, rep) in sent
        sent.add((g, rep))
    counts = Counter(replicas)
    extra = ""
    if key.startswith("Geo"):
        r = geo_serve.router_for(app, "Light")
        extra = f"held={r.counters['held']} errors={r.counters['internal_errors']} fallback={r.counters['fallback']}"
        if fed is not None:
            extra += f" sibling rows fed={fed} learned={r.counters['sibling_inserts_learned']}"
    serve.delete(app)
    nan = float("nan")
    p50, p99 = percentile(times_ms, (50, 99)) if times_ms else (nan, nan)
    cpu_p50, cpu_p99 = percentile(cpu_ms, (50, 99)) if cpu_ms else (nan, nan)
    return {
        "router": label, "round": rnd, "load1": os.getloadavg()[0], "n_timed": len(times_ms),
        "p50_ms": p50, "p99_ms": p99,
        "cpu_p50_ms": cpu_p50, "cpu_p99_ms": cpu_p99,
        "mean_ms": statistics.fmean(times_ms) if times_ms else float("nan"),
        "rps": len(reqs) / wall, "affinity": hits / max(1, later), "warm": warm_hits / max(1, later),
        "spread": sorted(counts.values(), reverse=True), "extra": extra, "stages": stages,
    }


def time_stages() -> None:
    """``--stages``: wrap the stages of ``router_stages.py`` (hashing, tree walk, pricing, request book) in
    thread-CPU timers, in this process, where the handle's router runs; each router's run then reports
    their mean us per request. The wrappers add their own cost to the timed p50."""
    wrap_stages(bench_state.STAGES, time.thread_time)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--num-cpus", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the routers this many times in one Ray session (interleaved), and report "
                         "each round, the best round and the spread")
    ap.add_argument("--prebuilt-prompts", action="store_true",
                    help="build all 600 prompts (19 MB) before the run instead of when each request is sent: the "
                         "router then reads each prompt from DRAM (cold caches), as no real ingress would")
    ap.add_argument("--stages", action="store_true",
                    help="also time the GeoPrefixRouter rows' stages (router_stages.py) in thread CPU time; "
                         "the timers add to the p50")
    ap.add_argument("--max-burst", type=int, default=None,
                    help="GeoPrefixRouter availability.max_burst (default: the router's own default)")
    args = ap.parse_args()
    routers = ROUTERS
    if args.max_burst:
        routers = [(label, cls, key, {"policy": dict(kw["policy"], availability={"max_burst": args.max_burst})}
                    if "policy" in kw else kw) for label, cls, key, kw in ROUTERS]
    if args.stages:
        time_stages()
    start_local_ray(num_cpus=args.num_cpus, prefix="rgB", logging_level="error")
    serve.start()
    reqs = make_workload(args.requests)
    if args.prebuilt_prompts:
        reqs = prebuild(reqs)
    warm = [(0, functools.partial(str, f"warm-up {i} " * 50)) for i in range(32)]
    rounds = []
    try:
        for rnd in range(args.rounds):
            rounds.append([run_one(label, cls, key, kw, args, reqs, warm, rnd) for label, cls, key, kw in routers])
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"\nrouter benchmark: {args.replicas} replicas (light deployment, answers at once), "
          f"{args.requests} requests, "
          f"concurrency {args.concurrency}, 32 groups x 4,000-char system prompt + ~28,000 unique chars, prompts "
          + ("built before the run (--prebuilt-prompts)" if args.prebuilt_prompts
             else "built when each request is sent"))
    print("light replicas report num_waiting=0, num_running=in-flight, max_num_seqs=256 (no KV fields); "
          + (f"GeoPrefixRouter availability.max_burst={args.max_burst} (NOT the default)" if args.max_burst
             else "GeoPrefixRouter at its defaults (availability.max_burst 32: "
                  "SP-P headroom = min(32, 256 - running))"))
    hdr = (f"{'router':28s} {'p50 ms':>8s} {'p99 ms':>8s} {'mean ms':>8s} {'cpu p50':>8s} {'cpu p99':>8s} "
           f"{'req/s':>8s} {'affinity':>8s} {'warm':>6s} {'load1':>6s}  per-replica counts")
    print("times are per request, summed over its choose_replicas + on_request_routed calls; 'ms' = wall "
          "(perf_counter, includes GIL waits behind other threads of this process), 'cpu' = thread_time; "
          "load1 = the machine's 1-minute load average after the router's run (2 cores here)")
    verdicts = []
    for rows in rounds:
        if args.rounds > 1:
            print(f"\nround {rows[0]['round'] + 1} of {args.rounds}")
        print(hdr)
        print("-" * len(hdr))
        p2 = next(r for r in rows if r["router"].startswith("PowerOfTwo"))
        for r in rows:
            print(f"{r['router']:28s} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['mean_ms']:8.3f} "
                  f"{r['cpu_p50_ms']:8.3f} {r['cpu_p99_ms']:8.3f} {r['rps']:8.1f} "
                  f"{r['affinity']:8.3f} {r['warm']:6.3f} {r['load1']:6.1f}  {r['spread']} {r['extra']}")
        geo = [r for r in rows if r["router"].startswith("GeoPrefixRouter")]
        vs = {}
        for g in geo:
            v = vs[g["router"]] = {"p50": g["p50_ms"], "p99": g["p99_ms"], "cpu_p50": g["cpu_p50_ms"],
                                   "cpu_p99": g["cpu_p99_ms"], "thr": g["rps"] / p2["rps"], "aff": g["affinity"]}
            ok = lambda c: "met" if c else "NOT met"  # noqa: E731
            print(f"{g['router']} vs bar: p50 {v['p50']:.3f} ms (<= 0.1: {ok(v['p50'] <= 0.1)}), "
                  f"p99 {v['p99']:.3f} ms (<= 1: {ok(v['p99'] <= 1.0)}), throughput {v['thr']:.0%} of power-of-two "
                  f"(>= 90%: {ok(v['thr'] >= 0.9)}), affinity {v['aff']:.3f} (>= 0.8: {ok(v['aff'] >= 0.8)})")
        if args.stages:
            labels = list(dict.fromkeys(k for g in geo for k in g["stages"]))
            print("stages, thread CPU us per request (nested stages are included in their callers):")
            print(f"  {'stage':58s}" + "".join(f"{g['router'][16:-1][:14]:>16s}" for g in geo))
            for label in labels:
                print(f"  {label:58s}" + "".join(f"{g['stages'].get(label, 0.0):16.1f}" for g in geo))
        verdicts.append(vs)
        print(f"timed requests: {', '.join(str(r['n_timed']) for r in rows)}")
    if len(verdicts) > 1:
        for name in verdicts[0]:
            def span(k, fmt):
                xs = [v[name][k] for v in verdicts]
                return f"{k} " + " / ".join(fmt.format(x) for x in xs)
            print(f"\n{name} over {len(verdicts)} rounds: {span('p50', '{:.3f}')} ms; "
                  f"{span('p99', '{:.3f}')} ms; {span('cpu_p50', '{:.3f}')} ms; {span('cpu_p99', '{:.3f}')} ms; "
                  f"{span('thr', '{:.0%}')}; {span('aff', '{:.3f}')}")


if __name__ == "__main__":
    main()
