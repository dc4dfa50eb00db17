"""One region through HTTP: GeoPrefixRouter vs Ray's power-of-two, 1 vs 2 ingress replicas, double grants.

    python benchmarks/bench_ingress.py [--requests 600] [--concurrency 1,8,32] [--rounds 2]
        [--configs geo-1,pow2-1,geo-2] [--grant-configs geo-1,geo-2,geo-2-noshare,pow2-2] [--profile geo-1]

One local Ray node labelled as region ``us`` runs the region app that ``build_region_apps`` builds
(``RegionIngress`` in front of Ray Serve LLM's ``LLMServer`` with the emulated engine), with 2 model
replicas that answer almost at once (engine time x 0.001, 1 output token, ``max_num_seqs`` 256) and
no registry (one region: nothing to forward to). Every configuration is deployed at once, each as
its own app (``/<config>/v1/chat/completions``), once per round. At each concurrency, each
configuration gets ``--requests`` chat requests in ``--slices`` slices, the configurations
alternating slice by slice (A B B A A B ...), so that the machine's noise, which drifts over seconds
on a shared 2-core VM, hits every configuration alike; a configuration's figures sum its slices. It
prints:

* requests/s, p50 / p99 latency, errors, and per round the ratios geo-N / pow2-N (same ingress,
  Ray's default router) and geo-2 / geo-1 (a second ingress replica);
* CPU milliseconds per request of the ingress replicas, the HTTP proxy and the model replicas (psutil);
* **over-capacity arrivals**: requests that reached an engine while all of its ``max_num_seqs``
  sequence slots were taken -- a slot granted that the engine did not have. Fast engines are never
  full, so a **double-grant check** then runs ``--grant-configs`` with engines that are the
  bottleneck (time scale 1.0, ``max_num_seqs`` 8, 128 output tokens, concurrency 32 > 16 slots). Each
  router of N ingress replicas takes 1/N of every report's headroom (``headroom_share="auto"``), so
  geo-N must show 0; ``geo-2-noshare`` (``headroom_share="none"``) and ``pow2-2`` (no SP-P) are the
  controls that do over-fill engines, so the counter is known to see a double grant;
* with ``--profile geo-1``: a py-spy profile of that configuration's ingress replica under load at
  concurrency 32 (top frames by own time, and ray_geolb's frames by total time).

Configurations: ``<router>-<ingress replicas>[-noshare]``, router ``geo`` (GeoPrefixRouter with its
defaults) or ``pow2`` (Ray's default power-of-two router in the same region ingress).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from typing import Dict, List

from ray_geolb.percentile import percentile

REGION = "us"
MODEL = "geolb-emulated"


def parse_config(name: str) -> dict:
    parts = name.split("-")
    if len(parts) not in (2, 3) or parts[0] not in ("geo", "pow2") or not parts[1].isdigit() \
            or (len(parts) == 3 and parts[2] != "noshare") or int(parts[1]) < 1:
        raise SystemExit(f"bench_ingress: bad configuration {name!r} (want geo-1, geo-2, pow2-2, geo-2-noshare)")
    return {"name": name, "router": parts[0], "ingress_replicas": int(parts[1]), "share": len(parts) == 2}


def build(cfg: dict, args, slow: bool) -> list:
    """The region app of ``cfg``: app ``bench-<config>-us``, served at ``/<config>``."""
    from dataclasses import replace

    from ray_geolb.serve.app import build_region_apps

    router_kwargs = None if cfg["share"] else {"headroom_share": "none"}
    scale, tokens = (args.grant_time_scale, args.grant_output_tokens) if slow else (0.001, 1)
    seqs = args.grant_max_num_seqs if slow else args.max_num_seqs
    apps = build_region_apps({REGION: args.replicas}, router=cfg["router"], registry=False, latency={"scale": 0},
                             time_scale=scale, output_tokens=tokens, engine_overrides={"max_num_seqs": seqs},
                             ingress_replicas=cfg["ingress_replicas"], router_kwargs=router_kwargs,
                             app_prefix=f"bench-{cfg['name']}-")
    return [replace(a, route_prefix=f"/{cfg['name']}") for a in apps]


async def wait_ready(client, url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    body = {"model": MODEL, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
    while True:
        try:
            r = await client.post(url, json=body)
            if r.status_code == 200:
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_ingress: {url} never answered 200")
        await asyncio.sleep(0.5)


async def load(client, url: str, n: int, concurrency: int, tag: str, max_tokens: int = 1) -> dict:
    lat: List[float] = []
    errors: Dict[str, int] = {}
    it = iter(range(n))

    async def worker(w: int) -> None:
        for i in it:
            body = {"model": MODEL, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": f"{tag} client {w} question {i}: " + "hello " * 40}]}
            t0 = time.perf_counter()
            try:
                r = await client.post(url, json=body)
                code = str(r.status_code)
            except Exception as e:  # noqa: BLE001
                code = type(e).__name__
            if code == "200":
                lat.append(time.perf_counter() - t0)
            else:
                errors[code] = errors.get(code, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return summarise([{"lat": lat, "errors": errors, "wall_s": time.perf_counter() - t0}])


def summarise(slices: List[dict]) -> dict:
    """One configuration's figures over its slices: requests/s = answered / summed wall time, latency
    percentiles over every slice's requests, errors, over-capacity arrivals and CPU summed."""
    lat = [x for s in slices for x in s["lat"]]
    wall = sum(s["wall_s"] for s in slices)
    errors: Dict[str, int] = {}
    cpu: Dict[str, float] = {}
    for s in slices:
        for k, v in s["errors"].items():
            errors[k] = errors.get(k, 0) + v
        for k, v in s.get("cpu_s", {}).items():
            cpu[k] = cpu.get(k, 0.0) + v
    return {"lat": lat, "ok": len(lat), "errors": errors, "wall_s": wall, "rps": len(lat) / wall if wall else 0.0,
            "p50_ms": 1000 * percentile(lat, 50) if lat else float("nan"),
            "p99_ms": 1000 * percentile(lat, 99) if lat else float("nan"),
            "over_capacity": sum(s.get("over_capacity", 0) for s in slices), "cpu_s": cpu,
            "cpu_ms_per_req": {k: 1000 * v / max(1, len(lat)) for k, v in cpu.items()}}


async def ingress_counters(app_name: str) -> dict:
    """What one ingress replica held and decided (its state payload's counters), and its router's."""
    from ray import serve

    from ray_geolb.serve.ingress import INGRESS_DEPLOYMENT

    st = await serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name).state.remote()
    c = st["counters"]
    out = {k: c[k] for k in ("requests", "local", "held", "queue_full", "wait_timeout", "decide_errors") if c.get(k)}
    out.update({f"decision {k}": v for k, v in st.get("decisions", {}).items()})
    router = st.get("router") or {}
    out.update({f"router {k}": v for k, v in (router.get("counters") or {}).items() if v})
    return out


def _pid(actor) -> int:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=30)


def serve_processes(app_name: str) -> Dict[str, List[int]]:
    """PIDs of the app's ingress replicas, its model replicas and the HTTP proxies (by Serve's actor
    names; no dashboard needed)."""
    import ray

    from ray_geolb.serve.ingress import INGRESS_DEPLOYMENT

    out: Dict[str, List[int]] = {"ingress": [], "proxy": [], "replicas": []}
    for a in ray.util.list_named_actors(all_namespaces=True):
        name, ns = a["name"], a["namespace"]
        if name.startswith("SERVE_PROXY_ACTOR"):
            kind = "proxy"
        elif name.startswith(f"SERVE_REPLICA::{app_name}#"):
            kind = "ingress" if name.split("#")[1] == INGRESS_DEPLOYMENT else "replicas"
        else:
            continue
        out[kind].append(_pid(ray.get_actor(name, namespace=ns)))
    return out


def cpu_seconds(pids: Dict[str, List[int]]) -> Dict[str, float]:
    try:
        import psutil
    except ImportError:
        return {}
    out = {}
    for kind, ps in pids.items():
        total = 0.0
        for pid in ps:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        out[kind] = total
    return out


async def over_capacity(app_name: str) -> int:
    """Arrivals that found every sequence slot of their engine taken, summed over the app's replicas
    (cumulative since the replica started; asked directly, outside the routing path)."""
    from ray_geolb.serve.app import model_replica_actors

    total = 0
    for actor in model_replica_actors([app_name]).values():
        st = await actor.record_routing_stats.remote()
        total += int(st.get("over_capacity_arrivals", 0))
    return total


async def measure(client, url: str, app_name: str, n: int, concurrency: int, tag: str, max_tokens: int) -> dict:
    """One slice: ``n`` requests at ``concurrency``, with the CPU seconds and over-capacity arrivals
    of the app's processes meanwhile (the proxy is shared: only the slice's app is under load)."""
    pids = serve_processes(app_name)
    oc0, cpu0 = await over_capacity(app_name), cpu_seconds(pids)
    res = await load(client, url, n, concurrency, tag, max_tokens=max_tokens)
    cpu1 = cpu_seconds(pids)
    res["over_capacity"] = await over_capacity(app_name) - oc0
    res["cpu_s"] = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
    return res


def slice_order(names: List[str], k: int) -> List[str]:
    """The configurations' order in slice ``k``: A B, then B A, then A B, ... (no one always first)."""
    return list(names) if k % 2 == 0 else list(reversed(names))


@contextlib.asynccontextmanager
async def serving(cfgs: List[dict], args, base: str, slow: bool):
    """Deploy every configuration's app at once, wait until each answers and warm it up; yields an HTTP
    client and ``{config: (app name, chat URL)}``; deletes the apps on the way out."""
    import httpx
    from ray import serve

    from ray_geolb.serve.app import deploy_region_apps

    apps: Dict[str, tuple] = {}
    try:
        for cfg in cfgs:
            a = build(cfg, args, slow)[0]
            deploy_region_apps([a])
            apps[cfg["name"]] = (a.name, f"{base}{a.route_prefix}/v1/chat/completions")
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
            for _app_name, url in apps.values():
                await wait_ready(client, url)
                await load(client, url, args.warmup, 8, "warm-up")
            yield client, apps
    finally:
        for app_name, _url in apps.values():
            serve.delete(app_name)


async def run_round(cfgs: List[dict], args, base: str) -> Dict[str, dict]:
    """Every configuration deployed at once, their slices alternating: ``{config: {concurrency:
    result, "counters": ..., "profile": ...}}``. Fast engines: the ingress is the bottleneck."""
    names = [c["name"] for c in cfgs]
    out: Dict[str, dict] = {n: {} for n in names}
    async with serving(cfgs, args, base, slow=False) as (client, apps):
        for c in args.concurrency:
            n = args.requests if c > 1 else max(50, args.requests // 4)
            per = max(1, n // args.slices)
            slices: Dict[str, List[dict]] = {name: [] for name in names}
            for k in range(args.slices):
                for name in slice_order(names, k):
                    app_name, url = apps[name]
                    slices[name].append(await measure(client, url, app_name, per, c, f"{name}-{k}", 1))
            for name in names:
                out[name][c] = summarise(slices[name])
        for name in names:
            out[name]["counters"] = await ingress_counters(apps[name][0])
            if name in args.profile:
                out[name]["profile"] = await profile_ingress(client, apps[name][1], apps[name][0], args, name)
    return out


async def run_grant_check(cfg: dict, args, base: str) -> dict:
    """One configuration with engines that are the bottleneck (SP-P has to hold; over-capacity
    arrivals would show double grants), deployed alone."""
    async with serving([cfg], args, base, slow=True) as (client, apps):
        app_name, url = apps[cfg["name"]]
        res = await measure(client, url, app_name, args.grant_requests, 32, cfg["name"], args.grant_output_tokens)
    return summarise([res])


async def profile_ingress(client, url: str, app_name: str, args, tag: str) -> str:
    """py-spy (sampling, attached to the running ingress replica) while the region serves
    ``args.requests`` requests at concurrency 32; returns the top frames by own time."""
    import shutil
    import subprocess
    import tempfile

    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return "py-spy not installed (pip install py-spy)"
    pid = serve_processes(app_name)["ingress"][0]
    raw = os.path.join(tempfile.mkdtemp(prefix="geolb_spy_"), f"{tag}.txt")
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--output", raw, "--rate", "200",
                             "--nonblocking", "--duration", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    await asyncio.sleep(1.0)
    await load(client, url, args.requests, 32, tag + "-profiled")
    proc.send_signal(2)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    if not os.path.exists(raw):
        return "py-spy failed: " + proc.stderr.read().decode()[-500:]
    return top_frames(raw, args.profile_top)


def _frame(fr: str) -> str:
    """``func (path/to/file.py:line)`` -> ``func (pkg/file.py)``: a function, its file and package."""
    if " (" not in fr:
        return fr
    func, _, where = fr.partition(" (")
    path = where.rsplit(":", 1)[0]
    parts = path.split("/")
    if "ray_geolb" in parts:
        path = "/".join(parts[parts.index("ray_geolb"):])
    else:
        path = "/".join(parts[-2:])
    return f"{func} ({path})"


def top_frames(raw_path: str, top: int) -> str:
    """Own ("self") and total samples per function from py-spy's raw (collapsed-stack) output."""
    own: Dict[str, int] = {}
    total: Dict[str, int] = {}
    samples = 0
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            k = int(count)
            samples += k
            frames = [_frame(fr) for fr in stack.split(";")]
            own[frames[-1]] = own.get(frames[-1], 0) + k
            for fr in set(frames):
                total[fr] = total.get(fr, 0) + k
    lines = [f"{samples} samples; top {top} by own time (own %, total %):"]
    for fr, k in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * k / samples:5.1f} %  {100 * total[fr] / samples:5.1f} %  {fr}")
    ours = sorted(((k, fr) for fr, k in total.items() if "ray_geolb/" in fr), reverse=True)[:top]
    lines.append(f"top {top} ray_geolb frames by total time (total %):")
    lines += [f"  {100 * k / samples:5.1f} %  {fr}" for k, fr in ours]
    return "\n".join(lines)


def fmt(name: str, c: int, res: dict) -> str:
    cpu = res.get("cpu_ms_per_req", {})
    cpu_s = " / ".join(f"{cpu.get(k, float('nan')):.2f}" for k in ("ingress", "proxy", "replicas"))
    err = sum(res["errors"].values())
    return (f"| {name} | {c} | {res['rps']:.1f} | {res['p50_ms']:.1f} | {res['p99_ms']:.1f} | {err} | "
            f"{res['over_capacity']} | {cpu_s} |")


HEADER = ("| config | concurrency | req/s | p50 ms | p99 ms | errors | over-capacity arrivals | "
          "CPU ms/req ingress / proxy / replicas |\n|---|---|---|---|---|---|---|---|")


def pairs_of(names: List[str]) -> List[tuple]:
    """geo-N / pow2-N (same ingress replicas) and geo-2 / geo-1, where both were run."""
    pairs = [(n, n.replace("geo-", "pow2-", 1)) for n in names if n.startswith("geo-") and not n.endswith("noshare")]
    pairs += [("geo-2", "geo-1")] if {"geo-1", "geo-2"} <= set(names) else []
    return [(a, b) for a, b in pairs if b in names]


def ratios(rnd: int, results: Dict[str, List[dict]], names: List[str], concurrency: List[int]) -> None:
    """The pairs' req/s ratio and p50 difference per concurrency, for this round."""
    for a, b in pairs_of(names):
        for c in concurrency:
            ra, rb = results[a][rnd][c], results[b][rnd][c]
            print(f"round {rnd + 1}, concurrency {c}: {a} / {b} = {ra['rps'] / rb['rps']:.2f}x req/s, "
                  f"p50 {ra['p50_ms'] - rb['p50_ms']:+.2f} ms", flush=True)


def ratios_over_rounds(results: Dict[str, List[dict]], names: List[str], concurrency: List[int]) -> None:
    """Per pair and concurrency: the per-round ratios and p50 differences, their medians, and the
    pooled figures (every round's slices as one measurement: answered / summed wall time, p50 of all)."""
    for a, b in pairs_of(names):
        for c in concurrency:
            ra, rb = [r[c] for r in results[a]], [r[c] for r in results[b]]
            rs = [x["rps"] / y["rps"] for x, y in zip(ra, rb)]
            ds = [x["p50_ms"] - y["p50_ms"] for x, y in zip(ra, rb)]
            pa, pb = summarise(ra), summarise(rb)
            print(f"  {a} / {b} at concurrency {c}: req/s ratio per round {', '.join(f'{x:.2f}' for x in rs)} "
                  f"(median {percentile(sorted(rs), 50):.2f}x, pooled {pa['rps'] / pb['rps']:.2f}x); p50 difference "
                  f"per round {', '.join(f'{x:+.2f}' for x in ds)} ms (median {percentile(sorted(ds), 50):+.2f}, "
                  f"pooled {pa['p50_ms'] - pb['p50_ms']:+.2f} ms)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600, help="requests per measurement (concurrency 1: a quarter)")
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--slices", type=int, default=4,
                    help="slices per measurement, the configurations alternating slice by slice")
    ap.add_argument("--replicas", type=int, default=2, help="model replicas in the region")
    ap.add_argument("--max-num-seqs", type=int, default=256, help="engine sequence slots (throughput rounds)")
    ap.add_argument("--configs", default="geo-1,pow2-1,geo-2")
    ap.add_argument("--grant-configs", default="geo-1,geo-2,geo-2-noshare,pow2-2")
    ap.add_argument("--grant-requests", type=int, default=200, help="requests of the double-grant check")
    ap.add_argument("--grant-max-num-seqs", type=int, default=8)
    ap.add_argument("--grant-time-scale", type=float, default=1.0, help="engine time scale of that check")
    ap.add_argument("--grant-output-tokens", type=int, default=128)
    ap.add_argument("--profile", default="", help="configs whose ingress py-spy profiles (e.g. geo-1)")
    ap.add_argument("--profile-top", type=int, default=25)
    args = ap.parse_args(argv)
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c]
    args.profile = [c for c in args.profile.split(",") if c]
    if args.slices < 1:
        raise SystemExit(f"bench_ingress: --slices must be >= 1, got {args.slices}")
    configs = [parse_config(c) for c in args.configs.split(",") if c]
    grant = [parse_config(c) for c in args.grant_configs.split(",") if c]

    from ray_geolb.serve.llm_server import guard_broken_torch_extras

    guard_broken_torch_extras()
    import ray
    from ray import serve

    from ray_geolb.serve.local import free_port, ray_temp_dir, start_region_cluster

    print(f"bench_ingress: {args.requests} chat requests per measurement at concurrency {args.concurrency} "
          f"(a quarter at concurrency 1), {args.rounds} rounds, every configuration deployed at once and "
          f"alternating in {args.slices} slices per measurement; region {REGION}: {args.replicas} emulated LLMServer "
          f"replicas (engine time x0.001, 1 output token, max_num_seqs {args.max_num_seqs}); no registry; "
          f"GeoPrefixRouter and the ingress at their defaults except where named; {os.cpu_count()} CPUs", flush=True)
    tmp = ray_temp_dir("geolb_bi_")
    cluster = start_region_cluster([REGION], tmp, namespace="geolb_bench", num_cpus=max(2, os.cpu_count() or 2))
    results: Dict[str, List[dict]] = {c["name"]: [] for c in configs}
    try:
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        base = f"http://127.0.0.1:{port}"
        for rnd in range(args.rounds):
            print(f"\nround {rnd + 1}\n\n{HEADER}", flush=True)
            out = asyncio.run(run_round(configs, args, base))
            for cfg in configs:
                res = out[cfg["name"]]
                results[cfg["name"]].append(res)
                for c in args.concurrency:
                    print(fmt(cfg["name"], c, res[c]), flush=True)
            for cfg in configs:
                print(f"  ({cfg['name']} ingress counters, all measurements of the round: "
                      f"{out[cfg['name']]['counters']})", flush=True)
            ratios(rnd, results, [c["name"] for c in configs], args.concurrency)
        for cfg in configs:
            for rnd, res in enumerate(results[cfg["name"]]):
                if "profile" in res:
                    print(f"\npy-spy profile of the {cfg['name']} ingress, round {rnd + 1}:\n{res['profile']}")
        if grant:
            print(f"\ndouble-grant check: engines at time scale {args.grant_time_scale:g}, max_num_seqs "
                  f"{args.grant_max_num_seqs}, {args.grant_output_tokens} output tokens (the engines are the "
                  f"bottleneck), {args.grant_requests} requests at concurrency 32\n\n{HEADER}", flush=True)
        for cfg in grant:
            print(fmt(cfg["name"], 32, asyncio.run(run_grant_check(cfg, args, base))), flush=True)
        print("\nsummary (median over rounds)")
        for name, rs in results.items():
            for c in args.concurrency:
                rps = sorted(r[c]["rps"] for r in rs)
                p50 = sorted(r[c]["p50_ms"] for r in rs)
                print(f"  {name} @ {c}: req/s {percentile(rps, 50):.1f} (rounds {', '.join(f'{x:.1f}' for x in rps)}),"
                      f" p50 {percentile(p50, 50):.2f} ms; over-capacity {sum(r[c]['over_capacity'] for r in rs)}; "
                      f"errors {sum(sum(r[c]['errors'].values()) for r in rs)}")
        ratios_over_rounds(results, [c["name"] for c in configs], args.concurrency)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
