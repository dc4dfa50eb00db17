"""Chaos under load on a real local three-region Ray Serve cluster (the ``serve deploy`` config of
``examples/serve_three_regions.yaml`` on emulated engines, as ``test_three_regions_over_http.py``).

While clients keep sending chat requests (streamed and not, skewed towards ``us``), one fault after
another: a partition of ``eu`` from its peers (every crossing towards it dropped, ``inject_faults``),
then healed; one of ``us``'s two model replicas killed; ``eu``'s ingress replica killed; the registry killed.
Checked: every request gets a 200 or a typed JSON error (only requests that were in ``eu``'s ingress
when it died may get the HTTP proxy's own error), no request is served by two regions, every
ingress's accounting returns to idle, and each recovery is timed (printed; bounded generously).
"""

import asyncio
import collections
import time
import uuid

import pytest

ray = pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")

from fakes import ingress_state, response_kind, wait_until  # noqa: E402
from ray import serve  # noqa: E402
from region_cluster import deploy_config, region_cluster, serve_config_on_cpu, wait_for_peers  # noqa: E402

from ray_geolb.serve.ingress import ADMIN_TOKEN_HEADER, INGRESS_DEPLOYMENT  # noqa: E402
from ray_geolb.serve.registry import DEFAULT_NAME, DEFAULT_NAMESPACE  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

REGIONS = {"us": 2, "eu": 1, "asia": 1}
TOKEN = "chaos-admin-token-0123456789"
ADMIN = {ADMIN_TOKEN_HEADER: TOKEN}
MODEL = "llama-3.1-8b"
#: the error types the ingress answers with (README "One status per condition")
TYPED = {"queue_full", "wait_timeout", "deadline_exceeded", "stream_timeout", "forward_failed", "server_error",
         "handover_lost", "router_queue_full", "router_wait_timeout", "too_many_requests"}
RECOVERY_BOUND_S = 90.0
#: what a request holds at an ingress and its router (idle: all 0)
OWNED = ("ingress_queue", "ingress_queue_tokens", "local_unrouted", "router_pending", "router_entries",
         "router_held", "router_inflight", "tracker_outstanding")


@pytest.fixture(scope="module")
def cluster():
    with region_cluster(REGIONS, "geolb_chaos_", "geolb_test_chaos") as (base, port):
        cfg = serve_config_on_cpu(
            "examples/serve_three_regions.yaml", port,
            engine={"time_scale": 0.2, "output_tokens": 8, "engine_overrides": {"max_num_seqs": 2}},
            args={"regions": REGIONS, "latency": {"scale": 0.1},
                  "ingress": {"max_queue": 64, "max_wait_s": 30.0, "admin_token": TOKEN, "stream_idle_timeout_s": 5.0}})
        deploy_config(cfg)
        wait_for_peers(base, REGIONS, ADMIN)
        yield base


def ingress(region):
    return serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name=f"geolb-{region}")


def replica_actor(app, deployment):
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"SERVE_REPLICA::{app}#{deployment}#")]
    assert len(names) == 1, names
    return ray.get_actor(names[0], namespace="serve")


class Load:
    """Clients that keep sending requests until stopped; every answer recorded with its time."""

    def __init__(self, base, clients=6):
        self.base = base
        self.clients = clients
        self.results = []  # dicts: t0, t1, region, id, stream, status, kind, route
        self._stop = asyncio.Event()

    async def _one(self, c, k, i):
        region = ("us", "us", "us", "eu", "asia")[(k + i) % 5]
        stream = i % 3 == 0
        rid = uuid.uuid4().hex
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"chaos client {k} turn {i} " * 20}],
                "max_tokens": 8, "stream": stream}
        rec = {"t0": time.monotonic(), "region": region, "id": rid, "stream": stream}
        try:
            async with c.stream("POST", f"{self.base}/{region}/v1/chat/completions", json=body,
                                headers={"x-request-id": rid}) as r:
                rec["status"] = r.status_code
                rec["route"] = r.headers.get("x-geolb-route")
                raw = (await r.aread()).decode()
        except httpx.HTTPError as e:
            rec.update(status=None, kind=f"transport:{type(e).__name__}")
        else:
            rec["kind"] = response_kind(rec["status"], raw, stream)
        rec["t1"] = time.monotonic()
        self.results.append(rec)

    async def _client(self, k):
        async with httpx.AsyncClient(timeout=120) as c:
            i = 0
            while not self._stop.is_set():
                await self._one(c, k, i)
                i += 1

    async def __aenter__(self):
        self._tasks = [asyncio.ensure_future(self._client(k)) for k in range(self.clients)]
        return self

    async def __aexit__(self, *exc):
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def ok_since(self, region, t):
        return any(r["region"] == region and r["t0"] >= t and r["kind"] == "ok" for r in self.results)


async def _until(check, what, bound=RECOVERY_BOUND_S):
    return await wait_until(check, f"{what}: not recovered", bound, poll_s=0.2)


async def _state(c, base, region):
    return await ingress_state(c, base, region, ADMIN)


def test_faults_under_load_lose_nothing_serve_nothing_twice_and_recover(cluster):
    base = cluster
    recovery = {}
    windows = {}

    async def run():
        async with httpx.AsyncClient(timeout=30) as c, Load(base) as load:
            await asyncio.sleep(3.0)

            # 1. partition eu: us and asia drop every crossing towards it, then heal
            t = time.monotonic()
            for r in ("us", "asia"):
                await ingress(r).inject_faults.remote({"eu": {"drop": 1.0}})
            await asyncio.sleep(6.0)
            st = await _state(c, base, "us")
            assert st["injected_faults"] == {"eu": {"drop": 1.0, "extra_ms": 0.0}}
            for r in ("us", "asia"):
                await ingress(r).inject_faults.remote(None)
            t_heal = time.monotonic()

            async def eu_back():
                sts = [await _state(c, base, r) for r in ("us", "asia")]
                return all(s and "eu" in s["available_peers"] and not s["open_circuits"] for s in sts)

            recovery["partition healed -> eu a peer again"] = await _until(eu_back, "partition")
            windows["partition"] = (t, t_heal)

            # 2. one of us's two model replicas dies: the other one serves on, Serve replaces it
            t_kill = time.monotonic()
            killed = sorted(_model_replicas("geolb-us"))[0]
            ray.kill(_model_replicas("geolb-us")[killed], no_restart=True)

            async def us_serves_locally():
                return any(r["region"] == "us" and r["t0"] > t_kill and r["kind"] == "ok" and r.get("route") == "local"
                           for r in load.results)

            recovery["us model replica killed -> us serves locally"] = await _until(us_serves_locally, "replica")

            # 3. eu's ingress replica dies (Serve replaces it)
            t = time.monotonic()
            ray.kill(replica_actor("geolb-eu", INGRESS_DEPLOYMENT), no_restart=True)

            async def eu_answers():
                return load.ok_since("eu", t + 0.5)

            recovery["eu ingress killed -> eu answers"] = await _until(eu_answers, "ingress")
            windows["eu_ingress"] = (t, time.monotonic())

            # 4. the registry dies (Ray restarts it, empty; heartbeats rebuild it)
            t = time.monotonic()
            reg = ray.get_actor(DEFAULT_NAME, namespace=DEFAULT_NAMESPACE)
            ray.kill(reg, no_restart=False)

            async def rebuilt():
                try:
                    table = await asyncio.wait_for(reg.table.remote(), 5)
                except Exception:  # noqa: BLE001 - restarting
                    return False
                return set(table["regions"]) == set(REGIONS) and table["uptime_s"] < time.monotonic() - t + 1

            recovery["registry killed -> table rebuilt"] = await _until(rebuilt, "registry")

            async def replaced():
                reps = _model_replicas("geolb-us")
                return len(reps) == 2 and killed not in reps and \
                    serve.status().applications["geolb-us"].status == "RUNNING"

            await _until(replaced, "replacement", RECOVERY_BOUND_S * 2)
            recovery["us model replica killed -> Serve replaced it"] = time.monotonic() - t_kill
            await asyncio.sleep(2.0)
        # load stopped: every ingress back to idle
        t = time.monotonic()

        last = {}

        async def idle():
            last.update({r: await ingress(r).accounting.remote() for r in REGIONS})
            return all(not any(a.get(k) for k in OWNED) and not a.get("unavailable")
                       and not any(any(v) for v in a.get("engines", {}).values()) for a in last.values())

        try:
            recovery["load stopped -> every ingress idle"] = await _until(idle, "idle", 60)
        except AssertionError as e:
            stuck = {x[0] for a in last.values() for x in a.get("oldest_inflight", [])}
            about = [r for r in load.results if r["id"] in stuck]
            raise AssertionError(f"{e}: {last}; recoveries so far {recovery}; windows {windows}; "
                                 f"stuck requests {about}") from None
        served = [await ingress(r).served_request_ids.remote() for r in REGIONS]
        return load.results, served

    results, served = asyncio.run(run())
    kinds = collections.Counter(r["kind"] for r in results)
    print("\nchaos: %d requests, outcomes %s" % (len(results), dict(kinds)))
    for what, s in recovery.items():
        print(f"chaos recovery: {what}: {s:.2f} s")
    assert len(results) > 100 and kinds["ok"] > 0.8 * len(results), kinds
    # every answer is a 200 or a typed error, except requests caught in eu's dying ingress
    t0, t1 = windows["eu_ingress"]
    for r in results:
        if r["kind"] in ("ok", "stream_error") or (r["kind"].startswith("typed:") and r["kind"][6:] in TYPED):
            continue
        assert r["region"] == "eu" and r["t0"] <= t1 and r["t1"] >= t0 - 1, r
    # the partition cost no request: us and asia served theirs locally or in the other region
    p0, p1 = windows["partition"]
    during = [r for r in results if r["region"] != "eu" and p0 <= r["t0"] and r["t1"] <= p1]
    assert during and all(r["kind"] == "ok" for r in during), collections.Counter(r["kind"] for r in during)
    # nothing served by two regions (the logs of the ingress that died are gone with it)
    counts = collections.Counter(i for log in served for i in log)
    assert not [i for i, n in counts.items() if n > 1]
    assert sum(counts.values()) > 50


def _model_replicas(app):
    """{actor name: handle} of the app's model replicas (every deployment but the ingress)."""
    return {a["name"]: ray.get_actor(a["name"], namespace="serve")
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"SERVE_REPLICA::{app}#") and f"#{INGRESS_DEPLOYMENT}#" not in a["name"]}
