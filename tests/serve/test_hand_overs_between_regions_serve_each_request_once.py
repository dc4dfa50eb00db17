"""Hand-overs between regions on one real local three-region Ray Serve cluster, emulated engines: work
stealing (``serve/ingress/steal.py``), and each request answered once and run to completion at most once
when a peer's ingress dies while a hand-over is in flight (``serve/ingress/handovers.py``). One module, so
the suite deploys the cluster once for both.

The regions, one model replica each (``max_num_seqs`` 2; ``region_cluster.deploy_holder_and_thief``):
``us`` never pushes -- its ``peer_stale_s`` is so short that no peer heartbeat is ever fresh to it, so it
holds what it cannot serve -- and ``eu`` pulls: it offers its free replica to ``us`` after each peer table
and each completion, and ``us`` hands held requests over (both with ``two_layer.steal.enabled``). ``asia``
runs the default region layer and forwards what it cannot serve to ``eu`` (its clients allow only those
two regions).

**Stealing** (requests to ``us``; ``asia`` takes no part): the exchange, then under faults -- the thief's
ingress dies mid-steal, a partition falls between victim and thief mid-steal, and the victim's ingress
dies with requests held (and restarts). Checked every time: every request gets a 200 or a typed JSON error
(only requests that were inside an ingress when it died may get the HTTP proxy's own error), no request is
served by two regions (the ingresses' served-id logs), and every ingress returns to idle (queues empty,
nothing in flight, no steal unsettled, no offer task left).

**A peer dying mid-hand-over**, the kill placed by a crash hook (``arm_crash``), not by timing: ``eu``'s
ingress is armed to exit at a point of the hand-over path -- after its model answered a peer's request and
before the answer goes back (``served_for_peer``), or right after it recorded the hand-over
(``handover_accepted``) -- and a burst is sent to the origin (``asia``: a forward; ``us``: a steal).
Checked over every model replica's own count of the requests its engine ran to the end
(``ran_request_ids``): no request ran twice anywhere; every client got one answer, a 200 or a typed JSON
error (the request that was on ``eu`` when it died: 502 ``handover_lost``, never run again); and at
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
TOKEN = "handover-admin-token-0123456789"
ADMIN = {ADMIN_TOKEN_HEADER: TOKEN}
#: the answers a client may get (README "One status per condition"); anything else fails the test
TYPED = {"queue_full", "wait_timeout", "deadline_exceeded", "forward_failed", "server_error", "handover_lost",
         "router_queue_full", "router_wait_timeout"}
#: and where some of the requests stream (the stealing tests)
TYPED_STREAMED = TYPED | {"stream_timeout", "too_many_requests"}
#: what a request holds at an ingress and its router, and what a steal or a hand-over holds (idle: all 0)
OWNED = ("ingress_queue", "ingress_queue_tokens", "local_unrouted", "router_pending", "router_entries",
         "router_held", "router_inflight", "tracker_outstanding", "steal_in_flight", "steal_offer_tasks",
         "handovers_running")


@pytest.fixture(scope="module")
def geo():
    with region_cluster(REGIONS, "geolb_hand_", "geolb_test_handovers") as (base, _port):
        deploy_holder_and_thief(REGIONS, TOKEN, plain=["asia"])
        with httpx.Client(timeout=30, headers=ADMIN) as c:
            for r in REGIONS:  # each region's router exists once a request went through
                assert c.post(f"{base}/{r}/v1/completions", json={"prompt": "warm", "max_tokens": 1}).status_code == 200
        asyncio.run(wait_until(_eu_sees(base, ("us", "asia")), "eu hears its peers", 60))
        asyncio.run(wait_until(_sees(base, "asia", "eu"), "asia hears eu", 60))
        yield base


# ------------------------------------------------------------------------------------------------------------ stealing
def ingress(region):
    return serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name=f"geolb-{region}")


def replica_actor(region):
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"SERVE_REPLICA::geolb-{region}#{INGRESS_DEPLOYMENT}#")]
    assert len(names) == 1, names
    return ray.get_actor(names[0], namespace="serve")


async def _to_us(c, base, i, tag):
    rid = f"{tag}-{i}-{uuid.uuid4().hex[:8]}"
    stream = i % 4 == 0
    body = {"messages": [{"role": "user", "content": f"steal {tag} request {i} " * 30}], "max_tokens": 16,
            "stream": stream}
    rec = {"id": rid, "stream": stream, "t0": time.monotonic()}
    try:
        async with c.stream("POST", f"{base}/us/v1/chat/completions", json=body, headers={"x-request-id": rid}) as r:
            rec["status"], rec["region"] = r.status_code, r.headers.get("x-geolb-region")
            rec["kind"] = response_kind(r.status_code, (await r.aread()).decode(), stream)
    except httpx.HTTPError as e:
        rec.update(status=None, kind=f"transport:{type(e).__name__}")
    rec["t1"] = time.monotonic()
    return rec


async def _burst(base, n, tag, during=None):
    """``n`` concurrent requests to us; ``during(c)`` (async) runs while they are in progress."""
    async with httpx.AsyncClient(timeout=90) as c:
        reqs = [asyncio.ensure_future(_to_us(c, base, i, tag)) for i in range(n)]
        if during is not None:
            await during(c)
        return await asyncio.gather(*reqs)


async def _state(c, base, region):
    return await ingress_state(c, base, region, ADMIN)


async def _until(check, what, bound=30.0):
    return await wait_until(check, what, bound)


async def _idle(what):
    """Every ingress back to idle: nothing queued, routed-but-unplaced, in flight or unsettled."""
    last = {}

    async def idle():
        last.update({r: await ingress(r).accounting.remote() for r in REGIONS})
        return all(not any(a.get(k) for k in OWNED) for a in last.values())

    try:
        return await _until(idle, f"{what}: idle", 30)
    except AssertionError as e:
        raise AssertionError(f"{e}: {last}") from None


async def _served():
    """Request id -> how many times an ingress (of those alive) served it locally."""
    logs = [await ingress(r).served_request_ids.remote() for r in REGIONS]
    return collections.Counter(i for log in logs for i in log)


def _check(results, tag, allow_untyped=lambda r: False):
    kinds = collections.Counter(r["kind"] for r in results)
    for r in results:
        ok = r["kind"] in ("ok", "stream_error") or (r["kind"].startswith("typed:") and r["kind"][6:] in TYPED_STREAMED)
        assert ok or allow_untyped(r), (tag, r)
    return kinds


def _steal_counters(st):
    return (st.get("steal") or {}).get("counters") or {}


def test_an_idle_region_steals_from_an_overloaded_one_and_serves_each_request_once(geo):
    base = geo

    async def run():
        async with httpx.AsyncClient(timeout=30) as c:
            before = {r: _steal_counters(await _state(c, base, r)) for r in REGIONS}
            results = await _burst(base, 24, "main")
            states = {r: await _state(c, base, r) for r in REGIONS}
        await _idle("main")
        return before, results, states, await _served()

    before, results, states, served = asyncio.run(run())
    kinds = _check(results, "main")
    assert kinds["ok"] == len(results), kinds
    us, eu = (_steal_counters(states[r]) for r in ("us", "eu"))
    delta = {k: eu[k] - before["eu"].get(k, 0) for k in eu}
    handed = us["handed"] - before["us"].get("handed", 0)
    print(f"\nsteal: us handed {handed}, eu {delta}; served in {collections.Counter(r['region'] for r in results)}")
    assert delta["offers_sent"] > 0 and handed > 0 and delta["taken"] > 0
    assert sum(r["region"] == "eu" for r in results) == delta["taken"]  # eu served exactly what it took
    assert states["us"]["steal"]["offer_bytes_max"] == 0 < states["eu"]["steal"]["offer_bytes_max"] < 16384
    assert states["us"]["counters"]["forwarded_out"] == 0  # us never pushed: every move was a steal
    ids = [r["id"] for r in results]
    assert all(served[i] == 1 for i in ids), {i: served[i] for i in ids if served[i] != 1}


def test_a_thief_that_dies_mid_steal_loses_nothing_and_serves_nothing_twice(geo):
    base = geo

    async def during(c):
        async def stealing():
            st = await _state(c, base, "us")
            return st is not None and sum((st["steal"]["victim_in_flight"] or {}).values()) > 0

        await _until(stealing, "a steal in flight", 20)
        ray.kill(replica_actor("eu"), no_restart=True)  # Serve starts a new eu ingress

    async def run():
        async with httpx.AsyncClient(timeout=30) as c:
            before = _steal_counters(await _state(c, base, "us"))
            results = await _burst(base, 24, "thief-dies", during)
            await _until(_eu_back(base), "eu back", 60)
            after = _steal_counters(await _state(c, base, "us"))
        await _idle("thief died")
        return before, after, results, await _served()

    before, after, results, served = asyncio.run(run())
    kinds = _check(results, "thief died")
    print(f"\nthief died: {dict(kinds)}; us steal counters {after} (before {before})")
    # every hand-over settled exactly once: taken by eu (served there, or a typed error if eu died while
    # serving it) or returned to us's queue (if eu died before taking it) -- which of the two depends on the
    # kill's timing, so the test asserts the accounting, not the race
    assert after["handed"] > before["handed"]
    assert after["handed"] == after["settled_taken"] + after["returned"] + after.get("abandoned", 0), after
    assert kinds["ok"] >= len(results) - 2, kinds  # only a stream eu had started may end in an error event
    assert all(served[r["id"]] <= 1 for r in results)  # (the dead eu's log is gone with it)


def test_a_partition_during_steals_sends_each_request_back_to_its_place(geo):
    base = geo

    async def during(c):
        async def offered():
            st = await _state(c, base, "us")
            return st is not None and _steal_counters(st).get("offers_received", 0) > received
        st = await _state(c, base, "us")
        received = _steal_counters(st).get("offers_received", 0)
        await _until(offered, "an offer", 20)
        await ingress("us").inject_faults.remote({"eu": {"drop": 1.0}})  # every us -> eu crossing dropped
        await asyncio.sleep(2.0)
        await ingress("us").inject_faults.remote(None)

    async def run():
        async with httpx.AsyncClient(timeout=30) as c:
            before = _steal_counters(await _state(c, base, "us"))
            results = await _burst(base, 24, "partition", during)
            after = _steal_counters(await _state(c, base, "us"))
        await _idle("partition")
        return before, after, results, await _served()

    before, after, results, served = asyncio.run(run())
    kinds = _check(results, "partition")
    print(f"\npartition: {dict(kinds)}; us steal counters {after} (before {before})")
    assert kinds["ok"] == len(results), kinds
    assert after["returned"] > before["returned"]  # a hand-over the partition dropped came back to us's queue
    assert all(served[r["id"]] == 1 for r in results)


def test_a_victim_that_dies_mid_steal_with_requests_held_leaves_its_thief_idle_and_steals_again(geo):
    base = geo
    window = {}

    async def during(c):
        async def held_and_stealing():
            st = await _state(c, base, "us")
            return st is not None and st["queue_len"] >= 4 and sum(st["steal"]["victim_in_flight"].values()) > 0

        await _until(held_and_stealing, "requests held at us and a steal in flight", 20)
        window["t0"] = time.monotonic()
        ray.kill(replica_actor("us"), no_restart=True)

    async def run():
        results = await _burst(base, 24, "victim-dies", during)
        window["t1"] = time.monotonic()

        async def us_back():
            async with httpx.AsyncClient(timeout=30) as c:
                return (await _to_us(c, base, 0, "after"))["kind"] == "ok"

        await _until(us_back, "us back", 60)
        await _idle("victim died")
        async with httpx.AsyncClient(timeout=30) as c:
            st = await _state(c, base, "eu")
            again = await _burst(base, 16, "after-restart")  # the new us ingress is a victim again
            us_after = await _state(c, base, "us")
        await _idle("after the restart")
        return results, st, again, us_after, await _served()

    results, eu_state, again, us_after, served = asyncio.run(run())
    # requests inside us's ingress when it died may get the proxy's own error; nothing else may
    kinds = _check(results, "victim died", allow_untyped=lambda r: r["t0"] <= window["t0"] <= r["t1"])
    print(f"\nvictim died: {dict(kinds)}; after its restart us handed {_steal_counters(us_after)['handed']}")
    assert eu_state["steal"]["offers_out"] == [] and eu_state["queue_len"] == 0
    assert all(r["kind"] == "ok" for r in again) and _steal_counters(us_after)["handed"] > 0
    assert all(served[r["id"]] <= 1 for r in results) and all(served[r["id"]] == 1 for r in again)


def _eu_back(base):
    async def back():
        async with httpx.AsyncClient(timeout=30) as c:
            st = await _state(c, base, "eu")
            return st is not None and (st["peers"].get("us") or {}).get("age_s") is not None
    return back


# ------------------------------------------------------------------------------------------ a peer dying mid-hand-over
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
