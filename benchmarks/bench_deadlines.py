"""Deadlines under a burst: 300 concurrent requests, half with ``x-geolb-timeout-s: 10``.

    flock /tmp/ray_test.lock python benchmarks/bench_deadlines.py [--requests 300] [--timeout-s 10]
        [--replicas 2] [--max-num-seqs 4] [--output-tokens 64] [--time-scale 1.0] [--rounds 1]

One local Ray node labelled as region ``us`` runs the region app ``build_region_apps`` builds
(``RegionIngress`` in front of Ray Serve LLM's ``LLMServer`` with the emulated engine, the
GeoPrefixRouter, no registry: one region, nothing to forward to). The engines are the bottleneck
(``--replicas`` x ``--max-num-seqs`` sequence slots, ``--output-tokens`` tokens per request at engine
time x ``--time-scale``), so the burst takes far longer than the deadline to drain. After a warm-up,
``--requests`` non-streamed chat requests are sent at once; every second one carries
``x-geolb-timeout-s: <--timeout-s>``, the others none (the ingress's 300 s default).

Printed, per round: the client-side latency distribution of the deadline requests (p50 / p90 / p99 /
max), how many answered later than deadline + 0.5 s, the answers by status, and each refusal status
with and without ``Retry-After`` (and how long after the send a refusal came); the same for the requests
without a deadline. The client is this process (httpx, one connection per request).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time
from typing import Dict, List

from ray_geolb.percentile import percentile

REGION = "us"
MODEL = "geolb-emulated"
MARGIN_S = 0.5


def build(args) -> list:
    from dataclasses import replace

    from ray_geolb.serve.app import build_region_apps

    apps = build_region_apps({REGION: args.replicas}, registry=False, latency={"scale": 0},
                             time_scale=args.time_scale, output_tokens=args.output_tokens,
                             engine_overrides={"max_num_seqs": args.max_num_seqs}, app_prefix="bench-dl-")
    return [replace(a, route_prefix="/dl") for a in apps]


def body(i: int, max_tokens: int) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"request {i}: tell me about the deadline of request {i}"}]}


async def one(client, url: str, i: int, timeout_s, max_tokens: int) -> dict:
    headers = {} if timeout_s is None else {"x-geolb-timeout-s": str(timeout_s)}
    t0 = time.monotonic()
    try:
        r = await client.post(url, json=body(i, max_tokens), headers=headers)
        status, retry_after = r.status_code, r.headers.get("retry-after")
        kind = message = None
        if status != 200:
            try:
                kind, message = r.json()["error"]["type"], r.json()["error"]["message"]
            except Exception:  # noqa: BLE001 - not our JSON
                kind = "?"
    except Exception as e:  # noqa: BLE001 - a client-side failure is a result too
        status, retry_after, kind, message = -1, None, type(e).__name__, None
    return {"i": i, "deadline": timeout_s is not None, "status": status, "retry_after": retry_after,
            "type": kind, "message": message, "latency_s": time.monotonic() - t0}


async def wait_ready(client, url: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = await client.post(url, json=body(-1, 1))
            if r.status_code == 200:
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} never answered 200")
        await asyncio.sleep(0.5)


def report(results: List[dict], timeout_s: float) -> dict:
    out = {}
    for group, rs in (("deadline", [r for r in results if r["deadline"]]),
                      ("no deadline", [r for r in results if not r["deadline"]])):
        lat = sorted(r["latency_s"] for r in rs)
        statuses = collections.Counter(r["status"] for r in rs)
        refusals = collections.Counter(
            (r["status"], r["type"], "Retry-After" if r["retry_after"] else "no Retry-After")
            for r in rs if r["status"] != 200)
        ref_lat = sorted(r["latency_s"] for r in rs if r["status"] != 200)
        ok_lat = sorted(r["latency_s"] for r in rs if r["status"] == 200)
        print(f"  {group}: {len(rs)} requests; client latency s p50 {percentile(lat, 50):.2f} p90 "
              f"{percentile(lat, 90):.2f} p99 {percentile(lat, 99):.2f} max {lat[-1]:.2f}", flush=True)
        print(f"    answers by status: {dict(sorted(statuses.items()))}", flush=True)
        if ok_lat:
            print(f"    200s: p50 {percentile(ok_lat, 50):.2f} s, max {ok_lat[-1]:.2f} s", flush=True)
        for (st, typ, ra), n in sorted(refusals.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2])):
            print(f"    refused {st} {typ}: {n} ({ra})", flush=True)
        if ref_lat:
            print(f"    refusals came after: p50 {percentile(ref_lat, 50):.2f} s, max {ref_lat[-1]:.2f} s", flush=True)
            early = sorted((r for r in rs if r["type"] == "deadline_unreachable"), key=lambda r: r["i"])
            for r in early[:1] + early[-1:]:  # what the ingress expected, for the first and the last sent
                print(f"    e.g. request {r['i']}: {r['message']} (Retry-After {r['retry_after']})", flush=True)
        if group == "deadline":
            over = sum(1 for x in lat if x > timeout_s + MARGIN_S)
            over1 = sum(1 for x in lat if x > timeout_s + 1.0)
            print(f"    answered later than deadline + {MARGIN_S:g} s ({timeout_s + MARGIN_S:g} s): {over}; "
                  f"later than {timeout_s + 1:g} s: {over1}", flush=True)
            out = {"over": over, "max": lat[-1], "statuses": dict(statuses),
                   "no_retry_after": sum(n for (st, _t, ra), n in refusals.items() if ra == "no Retry-After")}
    return out


async def burst(url: str, args) -> List[dict]:
    import httpx

    limits = httpx.Limits(max_connections=args.requests + 8, max_keepalive_connections=args.requests + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        await wait_ready(client, url)
        for k in range(args.warmup):  # the engines and the drain-rate estimate warm up
            await asyncio.gather(*(one(client, url, 10_000 + 8 * k + j, None, args.output_tokens) for j in range(8)))
        await asyncio.sleep(args.pause_s)
        tasks = [one(client, url, i, args.timeout_s if i % 2 == 0 else None, args.output_tokens)
                 for i in range(args.requests)]
        t0 = time.monotonic()
        res = await asyncio.gather(*tasks)
        print(f"  burst of {args.requests} drained in {time.monotonic() - t0:.1f} s", flush=True)
        return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--timeout-s", type=float, default=10.0, help="x-geolb-timeout-s of every second request")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=2, help="warm-up rounds of 8 concurrent requests")
    ap.add_argument("--pause-s", type=float, default=0.0, help="pause between warm-up and burst")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)

    from ray_geolb.serve.llm_server import guard_broken_torch_extras

    guard_broken_torch_extras()
    from ray_geolb.serve.app import deploy_region_apps
    from ray_geolb.serve.local import serve_on_region_cluster

    print(f"bench_deadlines: {args.requests} concurrent non-streamed chat requests, every second one with "
          f"x-geolb-timeout-s: {args.timeout_s:g}; region {REGION}: {args.replicas} emulated LLMServer replicas "
          f"(max_num_seqs {args.max_num_seqs}, {args.output_tokens} output tokens, engine time x{args.time_scale:g}); "
          f"no registry; {os.cpu_count()} CPUs", flush=True)
    summary: List[Dict] = []
    with serve_on_region_cluster([REGION], "geolb_dl_", "geolb_bench_dl", num_cpus=max(2, os.cpu_count() or 2)) as base:
        apps = build(args)
        deploy_region_apps(apps)
        url = f"{base}{apps[0].route_prefix}/v1/chat/completions"
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}", flush=True)
            res = asyncio.run(burst(url, args))
            summary.append(report(res, args.timeout_s))
            time.sleep(2.0)
        print(f"summary: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
