"""One region through HTTP: requests/s with 1 and 2 ingress replicas, and slots granted twice.

    python benchmarks/bench_ingress.py [--requests 600] [--concurrency 32] [--rounds 2]
                                       [--configs geo-1,geo-2,geo-2-noshare] [--max-num-seqs 8]

One local Ray node labelled as region ``us`` runs the region app that ``build_region_apps`` builds
(``RegionIngress`` in front of Ray Serve LLM's ``LLMServer`` with the emulated engine, routed by
GeoPrefixRouter), with 2 model replicas that answer almost at once (engine time x 0.001, 1 output
token) and no registry (one region: nothing to forward to). For each configuration, rounds
interleaved in one Ray session (so the machine's noise hits every configuration alike), it sends
``--requests`` chat requests at ``--concurrency`` to ``/us/v1/chat/completions`` and prints:

* requests/s, p50 / p99 latency, errors;
* **over-capacity arrivals**: requests that reached an engine while all of its ``max_num_seqs``
  sequence slots were taken -- a slot SP-P granted that the engine did not have. Fast engines are
  never full, so after the throughput rounds a **double-grant check** runs each configuration once
  more with engines that are the bottleneck (time scale ``--grant-time-scale`` 1.0, 128 output tokens;
  ``pow2-2``, Ray's power-of-two without SP-P, is the control that over-fills engines). Each router of N
  ingress replicas takes 1/N of every report's headroom (``headroom_share="auto"``), so this must be
  0; ``geo-2-noshare`` (``headroom_share="none"``: each router grants the whole headroom) shows what
  double grants look like, so the counter is known to see them;
* CPU seconds per request of the ingress replicas, the HTTP proxy and the model replicas (psutil).

Configurations: ``<router>-<ingress replicas>[-noshare]``, router ``geo`` (GeoPrefixRouter, its
defaults) or ``pow2`` (Ray's default power-of-two in the same ingress). ``--max-num-seqs`` (default
8) is small on purpose: at concurrency 32 two replicas' 16 slots are over-subscribed, so SP-P has to
hold requests and a double grant would show. Every non-default knob is printed with the results.
"""

from __future__ import annotations

import argparse
import asyncio
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
    from ray_geolb.serve.app import build_region_apps

    router_kwargs = None if cfg["share"] else {"headroom_share": "none"}
    scale, tokens = (args.grant_time_scale, args.grant_output_tokens) if slow else (0.001, 1)
    return build_region_apps({REGION: args.replicas}, router=cfg["router"], registry=False, latency={"scale": 0},
                             time_scale=scale, output_tokens=tokens,
                             engine_overrides={"max_num_seqs": args.max_num_seqs},
                             ingress_replicas=cfg["ingress_replicas"], router_kwargs=router_kwargs,
                             app_prefix="bench-")


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
    wall = time.perf_counter() - t0
    return {"ok": len(lat), "errors": errors, "wall_s": wall, "rps": len(lat) / wall,
            "p50_ms": 1000 * percentile(lat, 50) if lat else float("nan"),
            "p99_ms": 1000 * percentile(lat, 99) if lat else float("nan")}


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


async def run_config(cfg: dict, args, base: str, slow: bool = False) -> dict:
    """One configuration: fast engines (throughput; the ingress is the bottleneck) or, ``slow``, engines
    that are the bottleneck (SP-P has to hold; over-capacity arrivals would show double grants)."""
    import httpx
    from ray import serve

    from ray_geolb.serve.app import deploy_region_apps

    apps = build(cfg, args, slow)
    deploy_region_apps(apps)
    app_name = apps[0].name
    url = f"{base}{apps[0].route_prefix}/v1/chat/completions"
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
            await wait_ready(client, url)
            await load(client, url, args.warmup, min(args.concurrency, 8), "warm-up")
            pids = serve_processes(app_name)
            oc0, cpu0 = await over_capacity(app_name), cpu_seconds(pids)
            n = args.grant_requests if slow else args.requests
            res = await load(client, url, n, args.concurrency, cfg["name"],
                             max_tokens=args.grant_output_tokens if slow else 1)
            cpu1 = cpu_seconds(pids)
            res["over_capacity"] = await over_capacity(app_name) - oc0
            res["cpu_ms_per_req"] = {k: 1000 * (cpu1[k] - cpu0.get(k, 0.0)) / max(1, res["ok"]) for k in cpu1}
            res["processes"] = {k: len(v) for k, v in pids.items()}
    finally:
        serve.delete(app_name)
    return res


def fmt(cfg: dict, res: dict) -> str:
    cpu = res.get("cpu_ms_per_req", {})
    cpu_s = " / ".join(f"{cpu.get(k, float('nan')):.1f}" for k in ("ingress", "proxy", "replicas"))
    err = sum(res["errors"].values())
    return (f"| {cfg['name']} | {res['rps']:.1f} | {res['p50_ms']:.0f} | {res['p99_ms']:.0f} | {err} | "
            f"{res['over_capacity']} | {cpu_s} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=2, help="model replicas in the region")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--configs", default="geo-1,geo-2,geo-2-noshare,pow2-2")
    ap.add_argument("--grant-requests", type=int, default=200, help="requests of the double-grant check")
    ap.add_argument("--grant-time-scale", type=float, default=1.0, help="engine time scale of that check")
    ap.add_argument("--grant-output-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    configs = [parse_config(c) for c in args.configs.split(",") if c]

    from ray_geolb.serve.llm_server import guard_broken_torch_extras

    guard_broken_torch_extras()
    import ray
    from ray import serve

    from ray_geolb.serve.local import free_port, ray_temp_dir, start_region_cluster

    print(f"bench_ingress: {args.requests} chat requests at concurrency {args.concurrency}, {args.rounds} rounds; "
          f"region {REGION}: {args.replicas} emulated LLMServer replicas (engine time x0.001, 1 output token, "
          f"max_num_seqs {args.max_num_seqs}); no registry; GeoPrefixRouter defaults except where named; "
          f"{os.cpu_count()} CPUs", flush=True)
    tmp = ray_temp_dir("geolb_bi_")
    cluster = start_region_cluster([REGION], tmp, namespace="geolb_bench", num_cpus=max(2, os.cpu_count() or 2))
    results: Dict[str, List[dict]] = {c["name"]: [] for c in configs}
    try:
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        base = f"http://127.0.0.1:{port}"
        for rnd in range(args.rounds):
            print(f"\nround {rnd + 1}\n\n| config | req/s | p50 ms | p99 ms | errors | over-capacity arrivals | "
                  f"CPU ms/req ingress / proxy / replicas |\n|---|---|---|---|---|---|---|", flush=True)
            for cfg in configs:
                res = asyncio.run(run_config(cfg, args, base))
                results[cfg["name"]].append(res)
                print(fmt(cfg, res), flush=True)
            one = [c for c in configs if c["ingress_replicas"] == 1 and c["share"]]
            for c in configs:
                if one and c["ingress_replicas"] > 1 and c["router"] == one[0]["router"]:
                    r = results[c["name"]][-1]["rps"] / results[one[0]["name"]][-1]["rps"]
                    print(f"round {rnd + 1}: {c['name']} / {one[0]['name']} = {r:.2f}x req/s", flush=True)
        print(f"\ndouble-grant check: engines at time scale {args.grant_time_scale:g}, {args.grant_output_tokens} "
              f"output tokens (the engines are the bottleneck), {args.grant_requests} requests at concurrency "
              f"{args.concurrency}\n\n| config | req/s | p50 ms | p99 ms | errors | over-capacity arrivals | "
              f"CPU ms/req ingress / proxy / replicas |\n|---|---|---|---|---|---|---|", flush=True)
        for cfg in configs:
            res = asyncio.run(run_config(cfg, args, base, slow=True))
            results[cfg["name"]][0]["grant_over_capacity"] = res["over_capacity"]
            print(fmt(cfg, res), flush=True)
        print("\nsummary (median over rounds)")
        for name, rs in results.items():
            rps = sorted(r["rps"] for r in rs)
            print(f"  {name}: req/s {percentile(rps, 50):.1f} (rounds {', '.join(f'{x:.1f}' for x in rps)}); "
                  f"over-capacity arrivals {sum(r['over_capacity'] for r in rs)} (throughput rounds), "
                  f"{rs[0].get('grant_over_capacity')} (double-grant check); "
                  f"errors {sum(sum(r['errors'].values()) for r in rs)}")
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
