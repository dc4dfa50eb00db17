"""A burst against one region whose engines are the bottleneck, every request with a 4-s deadline
(``x-geolb-timeout-s``): the requests the queue ahead cannot serve in time are refused early with 429
``deadline_unreachable`` and ``Retry-After``, every refusal names ``Retry-After``, and no client waits
past its deadline + 0.5 s (the ingress keeps ``DEADLINE_RESERVE_S`` of it for the proxy time it cannot
see). ``benchmarks/bench_deadlines.py`` is the 300-request version."""

import asyncio
import time

import pytest

ray = pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")

from region_cluster import region_cluster  # noqa: E402

from ray_geolb.serve.app import build_region_apps, deploy_region_apps  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

DEADLINE_S = 4.0
MARGIN_S = 0.5
BURST = 60


@pytest.fixture(scope="module")
def base():
    with region_cluster(["us"], "geolb_dl_", "geolb_test_deadlines", num_cpus=2) as (url, _port):
        # one replica with 2 sequence slots, 64 output tokens: the burst takes far longer than 4 s to drain
        apps = build_region_apps({"us": 1}, registry=False, latency={"scale": 0}, time_scale=1.0, output_tokens=64,
                                 engine_overrides={"max_num_seqs": 2})
        deploy_region_apps(apps)
        base = f"{url}{apps[0].route_prefix}"
        with httpx.Client(timeout=60) as c:
            for _ in range(6):  # the engine and the ingress's service-time estimate warm up
                r = c.post(f"{base}/v1/chat/completions", json=_body(-1))
                assert r.status_code == 200, r.text
        yield base


def _body(i):
    return {"model": "geolb-emulated", "max_tokens": 64,
            "messages": [{"role": "user", "content": f"burst request {i}, how long will you take?"}]}


async def _burst(url):
    limits = httpx.Limits(max_connections=BURST + 4, max_keepalive_connections=BURST + 4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        async def one(i):
            t0 = time.monotonic()
            r = await c.post(url, json=_body(i), headers={"x-geolb-timeout-s": str(DEADLINE_S)})
            kind = None if r.status_code == 200 else r.json()["error"]["type"]
            return r.status_code, kind, r.headers.get("retry-after"), time.monotonic() - t0

        return await asyncio.gather(*(one(i) for i in range(BURST)))


def test_a_burst_is_refused_early_with_retry_after_and_no_client_waits_past_its_deadline(base):
    res = asyncio.run(_burst(f"{base}/v1/chat/completions"))
    lat = sorted(r[3] for r in res)
    by = {}
    for st, kind, ra, _ in res:
        by[(st, kind, ra is not None)] = by.get((st, kind, ra is not None), 0) + 1
    print(f"{BURST} requests, deadline {DEADLINE_S:g} s: {by}; client latency max {lat[-1]:.2f} s, "
          f"p50 {lat[len(lat) // 2]:.2f} s")
    assert lat[-1] <= DEADLINE_S + MARGIN_S, by
    served = [r for r in res if r[0] == 200]
    early = [r for r in res if r[0] == 429 and r[1] == "deadline_unreachable"]
    assert served and early, by  # some fit, and those that could not were told so
    assert all(r[2] is not None and int(r[2]) >= 1 for r in res if r[0] != 200), by  # every refusal: Retry-After
    # refused early: before the deadline had run out, not when it ran out
    assert min(r[3] for r in early) < DEADLINE_S / 2, by
