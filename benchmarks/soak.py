"""A bounded soak: minutes of Locust load on three local regions, with a fault in the middle.

    python benchmarks/soak.py [--duration 180] [--users 24] [--fault-at 0.33] [--fault-for 0.33]
        [--json out/soak.json]

Three labelled local Ray nodes (us, eu, asia) run the region apps ``build_region_apps`` builds (the
default GeoPrefixRouter behind each ``RegionIngress``, Ray Serve LLM's ``LLMServer`` over the
emulated engine in real time, 2 replicas in us and 1 elsewhere, ``max_num_seqs`` 4, inter-region
latency at 0.1x the shipped RTT table) and the registry. ``examples/locustfile.py`` runs headless in
its own process (users skewed 6:2:2 towards us, multi-turn streamed conversations) and logs every
request (``GEOLB_EVENTS``). At ``--fault-at`` of the run the fault starts: **eu is partitioned** from
us and asia (every crossing towards it dropped, the ingress's ``inject_faults``) and **one of us's two
model replicas is killed** (Serve replaces it); the partition heals after ``--fault-for``.

Printed (and written to ``--json``):

* served and failed requests by phase (before / during / after the fault), failures by error type;
* TTFT p50 / p99 per phase (streamed: the first SSE chunk, as the client sees it);
* the RSS of the router processes (the ingress replicas: each runs its region layer and the
  GeoPrefixRouter of its model handle), the proxy and the model replicas, every ``--sample-s``, and
  the ingress RSS drift: the mean over the last third of the run over the mean of the first third
  after warm-up (flat: ~1.0);
* every ingress's accounting after the load stops (idle: every count 0).

The prefix index of each router grows with the distinct prefixes it sees, up to GeoPrefix's
``prefix.max_nodes`` (200,000 by default), so the routers' RSS grows until the index is full; the
per-region index sizes are sampled beside the RSS. ``--index-max-nodes`` lowers the bound (a
non-default knob, printed), so that a run of a few minutes shows the RSS once every index is full.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ray_geolb.percentile import percentile  # noqa: E402

REGIONS = {"us": 2, "eu": 1, "asia": 1}
MODEL = "geolb-emulated"
OWNED = ("ingress_queue", "ingress_queue_tokens", "local_unrouted", "router_pending", "router_entries",
         "router_held", "router_inflight", "tracker_outstanding")


def rss_mb(pids: Dict[str, List[int]]) -> Dict[str, float]:
    import psutil

    out = {}
    for kind, ps in pids.items():
        total = 0
        for pid in ps:
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        out[kind] = total / 2**20
    return out


_PIDS: Dict[str, int] = {}


def processes(app_names) -> Dict[str, List[int]]:
    """PIDs of the apps' ingress replicas, model replicas and the HTTP proxies, by Serve's actor names
    (cached; a replica still starting is skipped this time rather than waited for)."""
    import ray

    from ray_geolb.serve.ingress import INGRESS_DEPLOYMENT

    out: Dict[str, List[int]] = {"ingress": [], "proxy": [], "replicas": []}
    for a in ray.util.list_named_actors(all_namespaces=True):
        name, ns = a["name"], a["namespace"]
        if name.startswith("SERVE_PROXY_ACTOR"):
            kind = "proxy"
        elif any(name.startswith(f"SERVE_REPLICA::{app}#") for app in app_names):
            kind = "ingress" if name.split("#")[1] == INGRESS_DEPLOYMENT else "replicas"
        else:
            continue
        if name not in _PIDS:
            try:
                ref = ray.get_actor(name, namespace=ns).__ray_call__.remote(lambda self: os.getpid())
                _PIDS[name] = ray.get(ref, timeout=2)
            except Exception:  # noqa: BLE001 - starting or gone: next time
                continue
        out[kind].append(_PIDS[name])
    return out


def _heap(_self) -> dict:
    """In a replica: Python's allocated blocks and a histogram of live objects by type."""
    import collections
    import gc
    import sys

    gc.collect()
    return {"blocks": sys.getallocatedblocks(),
            "types": dict(collections.Counter(type(o).__name__ for o in gc.get_objects()).most_common(200))}


def ingress_heaps(app_names) -> Dict[str, dict]:
    """``_heap`` of each app's ingress replica (the routers' processes), by app."""
    import ray

    from ray_geolb.serve.ingress import INGRESS_DEPLOYMENT

    out = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        name = a["name"]
        for app in app_names:
            if name.startswith(f"SERVE_REPLICA::{app}#{INGRESS_DEPLOYMENT}#"):
                try:
                    actor = ray.get_actor(name, namespace=a["namespace"])
                    out[app] = ray.get(actor.__ray_call__.remote(_heap), timeout=60)
                except Exception as e:  # noqa: BLE001
                    out[app] = {"error": repr(e)}
    return out


def heap_growth(first: Dict[str, dict], last: Dict[str, dict], top: int = 8) -> Dict[str, dict]:
    """Per ingress: allocated-block growth and the object types that grew most."""
    out = {}
    for app, a in first.items():
        b = last.get(app)
        if not b or "types" not in a or "types" not in b:
            continue
        grew = {t: b["types"].get(t, 0) - n for t, n in a["types"].items()}
        grew.update({t: n for t, n in b["types"].items() if t not in a["types"]})
        out[app] = {"blocks": b["blocks"] - a["blocks"],
                    "types": dict(sorted(((t, d) for t, d in grew.items() if d), key=lambda x: -x[1])[:top])}
    return out


def phase_summary(rows: List[dict]) -> dict:
    ok = [r for r in rows if r["status"] == 200 and not r["error"]]
    failed: Dict[str, int] = {}
    for r in rows:
        if r not in ok:
            k = f"{r['status']} {r['error']}"
            failed[k] = failed.get(k, 0) + 1
    ttft = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
    return {"requests": len(rows), "served": len(ok), "failed": failed,
            "ttft_p50_ms": percentile(ttft, 50) if ttft else None,
            "ttft_p99_ms": percentile(ttft, 99) if ttft else None,
            "served_by": {reg: sum(1 for r in ok if r["served"] == reg) for reg in REGIONS}}


async def soak(args, base: str, app_names: List[str]) -> dict:
    from ray import serve

    from ray_geolb.serve.app import model_replica_actors
    from ray_geolb.serve.ingress import INGRESS_DEPLOYMENT

    def ingress(region):
        return serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name=f"geolb-{region}")

    events = os.path.join(tempfile.mkdtemp(prefix="geolb_soak_"), "events.jsonl")
    env = dict(os.environ, GEOLB_MODEL=MODEL, GEOLB_MAX_TOKENS=str(args.max_tokens), GEOLB_TURNS="4",
               GEOLB_EVENTS=events)
    locustfile = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "locustfile.py")
    cmd = [sys.executable, "-m", "locust", "-f", locustfile, "--host", base, "--headless", "-u", str(args.users),
           "-r", str(args.users), "-t", f"{args.duration}s", "--only-summary"]
    t_start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    fault_at = t_start + args.fault_at * args.duration
    heal_at = t_start + (args.fault_at + args.fault_for) * args.duration
    faulted = healed = False
    samples = []
    next_sample = t_start

    async def index_nodes():
        out = {}
        for r in REGIONS:
            try:
                out[r] = (await asyncio.wait_for(ingress(r).accounting.remote(), 5)).get("index_nodes")
            except Exception:  # noqa: BLE001 - restarting
                out[r] = None
        return out

    killed = None
    heap0 = None
    while proc.poll() is None:
        now = time.time()
        if heap0 is None and now - t_start >= args.warmup_s:
            heap0 = ingress_heaps(app_names)
        if now >= next_sample:
            samples.append({"t": round(now - t_start, 1), "rss_mb": rss_mb(processes(app_names)),
                            "index_nodes": await index_nodes()})
            next_sample += args.sample_s
        if not faulted and now >= fault_at:
            for r in ("us", "asia"):
                await ingress(r).inject_faults.remote({"eu": {"drop": 1.0}})
            import ray

            actors = model_replica_actors(["geolb-us"])
            killed = sorted(actors)[0]
            ray.kill(actors[killed], no_restart=True)
            faulted = True
            print(f"[{now - t_start:6.1f} s] fault: eu partitioned from us and asia; us model replica {killed} killed",
                  flush=True)
        if faulted and not healed and now >= heal_at:
            for r in ("us", "asia"):
                await ingress(r).inject_faults.remote(None)
            healed = True
            print(f"[{now - t_start:6.1f} s] partition healed", flush=True)
        await asyncio.sleep(0.5)
    out_text = proc.stdout.read()
    if proc.returncode != 0:
        print(out_text[-3000:])
    rows = [json.loads(ln) for ln in open(events)] if os.path.exists(events) else []
    phases = {
        "before": [r for r in rows if r["t"] < fault_at],
        "during": [r for r in rows if fault_at <= r["t"] < heal_at],
        "after": [r for r in rows if r["t"] >= heal_at],
    }
    heap1 = ingress_heaps(app_names)
    # idle after the load: every ingress's accounting back to 0
    t_stop = time.monotonic()
    idle_after = None
    accts = {}
    while time.monotonic() - t_stop < args.idle_wait_s:
        accts = {r: await ingress(r).accounting.remote() for r in REGIONS}
        if all(not any(a.get(k) for k in OWNED) for a in accts.values()):
            idle_after = time.monotonic() - t_stop
            break
        await asyncio.sleep(0.5)
    warm = [s for s in samples if s["t"] >= args.warmup_s]
    third = max(1, len(warm) // 3)
    first = [s["rss_mb"]["ingress"] for s in warm[:third]]
    last = [s["rss_mb"]["ingress"] for s in warm[-third:]]
    return {
        "config": {"regions": REGIONS, "users": args.users, "duration_s": args.duration, "max_tokens": args.max_tokens,
                   "fault_at_s": args.fault_at * args.duration, "fault_for_s": args.fault_for * args.duration,
                   "killed_replica": killed, "engine": {"time_scale": 1.0, "max_num_seqs": 4},
                   "latency_scale": 0.1, "index_max_nodes": args.index_max_nodes, "idle_wait_s": args.idle_wait_s},
        "locust_rc": proc.returncode,
        "phases": {k: phase_summary(v) for k, v in phases.items()},
        "rss_samples": samples,
        "ingress_rss_drift": (sum(last) / len(last)) / (sum(first) / len(first)) if first and last else None,
        "idle_after_s": idle_after,
        "heap_growth": heap_growth(heap0 or {}, heap1),
        "accounting_after": {r: {k: a.get(k) for k in OWNED + ("oldest_inflight",)} for r, a in accts.items()},
    }


def fmt(x) -> str:
    return "-" if x is None else f"{x:.0f}"


def report(res: dict) -> None:
    print("\n| phase | requests | served | failed (by status and type) | TTFT p50 ms | TTFT p99 ms "
          "| served in us/eu/asia |")
    print("|---|---|---|---|---|---|---|")
    for name, p in res["phases"].items():
        f = ", ".join(f"{k}: {v}" for k, v in sorted(p["failed"].items())) or "0"
        by = "/".join(str(p["served_by"][r]) for r in REGIONS)
        print(f"| {name} | {p['requests']} | {p['served']} | {f} | {fmt(p['ttft_p50_ms'])} | {fmt(p['ttft_p99_ms'])} "
              f"| {by} |")
    print("\nRSS (MB) over time: t_s ingress(3 routers) proxy replicas | prefix-index nodes us/eu/asia")
    for s in res["rss_samples"]:
        m = s["rss_mb"]
        nodes = "/".join(str(s["index_nodes"].get(r)) for r in REGIONS)
        print(f"  {s['t']:7.1f}  {m['ingress']:8.1f}  {m['proxy']:7.1f}  {m['replicas']:8.1f} | {nodes}")
    for app, g in res.get("heap_growth", {}).items():
        print(f"{app} ingress, warm-up end -> load end: {g['blocks']:+d} Python blocks; objects by type {g['types']}")
    d = res["ingress_rss_drift"]
    print(f"\ningress RSS drift (mean of the last third / first third after warm-up): "
          f"{'-' if d is None else f'{d:.3f}'}")
    print(f"every ingress idle {res['idle_after_s']:.1f} s after the load stopped" if res["idle_after_s"] is not None
          else f"NOT idle {res['config']['idle_wait_s']:g} s after the load stopped: {res['accounting_after']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=int, default=180, help="seconds of load")
    ap.add_argument("--users", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--fault-at", type=float, default=1 / 3, help="fault start, as a share of the run")
    ap.add_argument("--fault-for", type=float, default=1 / 3, help="partition length, as a share of the run")
    ap.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period")
    ap.add_argument("--warmup-s", type=float, default=20.0, help="RSS samples before this are not in the drift")
    ap.add_argument("--index-max-nodes", type=int, default=None,
                    help="GeoPrefix's prefix.max_nodes (default: the policy's own, 200,000)")
    ap.add_argument("--idle-wait-s", type=float, default=120.0,
                    help="how long to wait for every ingress to be idle after the load")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    from ray_geolb.serve.llm_server import guard_broken_torch_extras

    guard_broken_torch_extras()
    import httpx
    import ray
    from ray import serve

    from ray_geolb.serve.app import build_region_apps, deploy_region_apps
    from ray_geolb.serve.local import free_port, ray_temp_dir, start_region_cluster

    cluster = start_region_cluster(list(REGIONS), ray_temp_dir("geolb_soak_"), namespace="geolb_soak")
    try:
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        base = f"http://127.0.0.1:{port}"
        policy = None if args.index_max_nodes is None else {"name": "geoprefix",
                                                             "prefix": {"max_nodes": args.index_max_nodes}}
        apps = build_region_apps(REGIONS, time_scale=1.0, output_tokens=args.max_tokens, policy=policy,
                                 engine_overrides={"max_num_seqs": 4}, latency={"scale": 0.1},
                                 ingress={"max_queue": 256, "max_wait_s": 30.0})
        deploy_region_apps(apps)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
        for region in REGIONS:
            deadline = time.monotonic() + 120
            while httpx.post(f"{base}/{region}/v1/chat/completions", json=body, timeout=30).status_code != 200:
                assert time.monotonic() < deadline, f"{region} never answered"
                time.sleep(0.5)
        time.sleep(3.0)  # the registry and the RTT probes: every region sees its peers
        print(f"soak: {args.duration} s, {args.users} users, regions {REGIONS}; fault at "
              f"{args.fault_at * args.duration:.0f} s for {args.fault_for * args.duration:.0f} s", flush=True)
        res = asyncio.run(soak(args, base, [a.name for a in apps]))
    finally:
        try:
            serve.shutdown()
        except Exception:  # noqa: BLE001
            pass
        ray.shutdown()
        cluster.shutdown()
    report(res)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
