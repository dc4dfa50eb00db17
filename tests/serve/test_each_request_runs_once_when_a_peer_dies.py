"""Each request is answered once and run to completion at most once when a peer's ingress dies while a
hand-over is in flight -- on a real Ray Serve cluster, with the kill placed by a crash hook
(``serve/ingress/handovers.py``: ``arm_crash``), not by timing.

Three regions, one model replica each (``max_num_seqs`` 2): ``asia`` forwards what it cannot serve to
``eu`` (its clients allow only those two regions); ``us`` never forwards (no peer is ever fresh to it)
and holds, and ``eu`` steals from it. ``eu``'s ingress is armed to exit at a point of the hand-over
path -- after its model answered a peer's request and before the answer goes back (``served_for_peer``),
or right after it recorded the hand-over (``handover_accepted``) -- and a burst is sent to the origin.

Checked over every model replica's own count of the requests its engine ran to the end
(``ran_request_ids``): no request ran twice anywhere; every client got one answer, a 200 or a typed
JSON error (the request that was on ``eu`` when it died: 502 ``handover_lost``, never run again); and at
``served_for_peer`` that request had already run on ``eu``'s engine, so running it again at the origin --
what the ingress did before -- would have run it twice.
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
from region_cluster import deploy_holder_and_thief, region_cluster  # noqa: E402

from ray_geolb.serve.ingress import ADMIN_TOKEN_HEADER, INGRESS_DEPLOYMENT  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

REGIONS = {"us": 1, "eu": 1, "asia": 1}
TOKEN = "runs-once-admin-token-0123456789"
ADMIN = {ADMIN_TOKEN_HEADER: TOKEN}
#: the answers a client may get (README "One status per condition"); anything else fails the test
TYPED = {"queue_full", "wait_timeout", "deadline_exceeded", "forward_failed", "server_error", "handover_lost",
         "router_queue_full", "router_wait_timeout"}
#: what a request holds at an ingress and its router, and what a hand-over holds (idle: all 0)
OWNED = ("ingress_queue", "ingress_queue_tokens", "local_unrouted", "router_pending", "router_entries",
         "router_held", "router_inflight", "tracker_outstanding", "steal_in_flight", "steal_offer_tasks",
         "handovers_running")


@pytest.fixture(scope="module")
def geo():
    with region_cluster(REGIONS, "geolb_once_", "geolb_test_once") as (base, _port):
        deploy_holder_and_thief(REGIONS, TOKEN, plain=["asia"])
        with httpx.Client(timeout=30, headers=ADMIN) as c:
            for r in REGIONS:  # each region's router exists once a request went through
                assert c.post(f"{base}/{r}/v1/completions", json={"prompt": "warm", "max_tokens": 1}).status_code == 200
        asyncio.run(wait_until(_eu_sees(base, ("us", "asia")), "eu hears its peers", 60))
        asyncio.run(wait_until(_sees(base, "asia", "eu"), "asia hears eu", 60))
        yield base


def _sees(base, region, peer):
    async def sees():
        async with httpx.AsyncClient(timeout=30) as c:
            st = await ingress_state(c, base, region, ADMIN)
        return st is not None and (st["peers"].get(peer) or {}).get("age_s") is not None
    return sees


def _eu_sees(base, peers):
    async def sees():
        return all([await _sees(base, "eu", p)() for p in peers])
    return sees


def _actors(region):
    """{deployment: replica actor name} of region's app."""
    out = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["name"].startswith(f"SERVE_REPLICA::geolb-{region}#"):
            out.setdefault(a["name"].split("#")[1], []).append(a["name"])
    return out


def _model_handles():
    hs = {}
    for r in REGIONS:
        models = [d for d in _actors(r) if d != INGRESS_DEPLOYMENT]
        assert len(models) == 1, _actors(r)
        hs[r] = serve.get_deployment_handle(models[0], app_name=f"geolb-{r}")
    return hs


async def _ran():
    """Request id -> [regions whose engine ran it to the end, once per run] (one model replica per region)."""
    out = collections.defaultdict(list)
    for r, h in _model_handles().items():
        for rid, n in (await h.ran_request_ids.remote()).items():
            out[rid] += [r] * n
    return out


async def _one(c, base, origin, i, tag):
    rid = f"{tag}-{i}-{uuid.uuid4().hex[:8]}"
    body = {"messages": [{"role": "user", "content": f"once {tag} request {i} " * 30}], "max_tokens": 16}
    headers = {"x-request-id": rid, "x-allowed-regions": f"{origin},eu"}
    rec = {"id": rid, "t0": time.monotonic()}
    try:
        r = await c.post(f"{base}/{origin}/v1/chat/completions", json=body, headers=headers)
        rec.update(status=r.status_code, region=r.headers.get("x-geolb-region"),
                   kind=response_kind(r.status_code, r.text, False))
    except httpx.HTTPError as e:
        rec.update(status=None, kind=f"transport:{type(e).__name__}")
    return rec


async def _back_and_idle():
    """eu's ingress is back (a new replica: it hears its peers) and every ingress is idle again."""
    ingress = {r: serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name=f"geolb-{r}") for r in REGIONS}
    last = {}

    async def idle():
        try:
            last.update({r: await ingress[r].accounting.remote() for r in REGIONS})
        except Exception as e:  # noqa: BLE001 - eu restarting
            last["error"] = repr(e)
            return False
        return all(not any(last[r].get(k) for k in OWNED) for r in REGIONS)

    try:
        await wait_until(idle, "idle", 60)
    except AssertionError as e:
        raise AssertionError(f"{e}: {last}") from None


def _drill(base, origin, point, n=24):
    """Arm eu at ``point``, send ``n`` concurrent requests to ``origin``; returns (results, ran, lost ids)."""
    tag = f"{origin}-{point}"

    async def run():
        await wait_until(_eu_sees(base, ("us", "asia")), "eu hears its peers", 90)  # (a new eu after a drill)
        eu = serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name="geolb-eu")
        assert await eu.arm_crash.remote(point, 1) == {point: 1}
        async with httpx.AsyncClient(timeout=90) as c:
            results = await asyncio.gather(*[_one(c, base, origin, i, tag) for i in range(n)])
        await _back_and_idle()
        return results, await _ran()

    results, ran = asyncio.run(run())
    kinds = collections.Counter(r["kind"] for r in results)
    print(f"\n{tag}: {dict(kinds)}; ran where: "
          f"{collections.Counter(tuple(ran.get(r['id'], [])) for r in results)}")
    for r in results:  # exactly one answer each: a 200 or a typed error, never a transport failure
        assert r["kind"] == "ok" or (r["kind"].startswith("typed:") and r["kind"][6:] in TYPED), (tag, r)
    for r in results:  # run to completion at most once, on every model replica's own count
        assert len(ran.get(r["id"], [])) <= 1, (tag, r, ran.get(r["id"]))
    for r in results:
        if r["kind"] == "ok":
            assert ran.get(r["id"]) == [r["region"]], (tag, r, ran.get(r["id"]))  # it ran where it says
    lost = [r for r in results if r["kind"] == "typed:handover_lost"]
    assert lost, f"{tag}: no request was on eu when it died; the drill did not exercise the path: {kinds}"
    return results, ran, lost


@pytest.mark.parametrize("origin", ["asia", "us"], ids=["forward", "steal"])
def test_a_peer_dying_after_its_engine_ran_a_handed_over_request_never_runs_it_again(geo, origin):
    results, ran, lost = _drill(geo, origin, "served_for_peer")
    # the first request eu served for origin had run to its end on eu's engine when eu died: running it
    # again anywhere would have shown a second run
    assert any(ran.get(r["id"]) == ["eu"] for r in lost), (lost, {r["id"]: ran.get(r["id"]) for r in lost})


@pytest.mark.parametrize("origin", ["asia", "us"], ids=["forward", "steal"])
def test_a_peer_dying_as_it_takes_a_handed_over_request_answers_it_once(geo, origin):
    results, ran, lost = _drill(geo, origin, "handover_accepted")
    assert all(ran.get(r["id"]) in (None, []) for r in lost)  # it died before any work: nothing ran
