"""Three regions on a real local Ray Serve cluster, deployed the way users deploy them: the ``serve
deploy`` config ``examples/serve_three_regions.yaml`` (three region apps built by
``ray_geolb.serve.app:region_app`` from an ``LLMConfig``: RegionIngress in front of Ray Serve LLM's
``LLMServer``, routed by GeoPrefixRouter), with only the engine replaced by the emulated one
(``tests/region_cluster.py``). One labelled Ray node per region (us = head, eu, asia), the real HTTP
proxy, the real registry actor. ONE cluster for the whole module.

Engines: max_num_seqs=2 per replica and real-time steps (~10 ms/token), so a replica is saturated by a
handful of requests; inter-region latency injected at 0.1x the default RTT table.
"""

import asyncio
import csv
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")

from ray import serve  # noqa: E402
from region_cluster import deploy_config, region_cluster, serve_config_on_cpu, wait_for_peers  # noqa: E402

from ray_geolb.serve.ingress import ADMIN_TOKEN_HEADER, INGRESS_DEPLOYMENT  # noqa: E402
from ray_geolb.serve.local import free_port  # noqa: E402
from ray_geolb.serve.registry import DEFAULT_NAME, DEFAULT_NAMESPACE  # noqa: E402
from repo import REPO  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

REGIONS = {"us": 1, "eu": 1, "asia": 1}
LABEL = "ray.io/availability-region"
TOKEN = "test-admin-token-0123456789"
ADMIN = {ADMIN_TOKEN_HEADER: TOKEN}  # the operator: debug headers and the state endpoint
MODEL = "llama-3.1-8b"  # the model id of examples/serve_three_regions.yaml


#: where the head node (region us) serves Prometheus metrics
METRICS_PORT = free_port()


@pytest.fixture(scope="module")
def geo():
    with region_cluster(REGIONS, "geolb_mr_", "geolb_test_mr", metrics_port=METRICS_PORT) as (base, port):
        cfg = serve_config_on_cpu(
            "examples/serve_three_regions.yaml", port,
            engine={"time_scale": 1.0, "output_tokens": 16, "engine_overrides": {"max_num_seqs": 2}},
            args={"regions": REGIONS, "latency": {"scale": 0.1},
                  "ingress": {"max_queue": 10, "max_wait_s": 20.0, "admin_token": TOKEN}})
        deploy_config(cfg)
        wait_for_peers(base, REGIONS, ADMIN)
        yield base


def chat(content, n=16, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": n, **extra}


async def burst(base, region, bodies, headers=None):
    async with httpx.AsyncClient(timeout=120) as c:
        return await asyncio.gather(*[c.post(f"{base}/{region}/v1/chat/completions", json=b, headers=headers or {})
                                      for b in bodies])


def geoh(r):
    return {k[len("x-geolb-"):]: v for k, v in r.headers.items() if k.startswith("x-geolb-")}


async def wait_idle(base, regions=REGIONS, timeout=30):
    """Wait until every region reports an available replica and an empty queue again."""
    deadline = time.time() + timeout
    async with httpx.AsyncClient(timeout=30) as c:
        while True:
            sts = [(await c.get(f"{base}/{r}/v1/geolb/state", headers=ADMIN)).json() for r in regions]
            if all(s["local_available"] > 0 and s["lb_queue_len"] == 0 for s in sts) and \
                    all(len(s["available_peers"]) == len(regions) - 1 for s in sts):
                return
            assert time.time() < deadline, sts
            await asyncio.sleep(0.2)


# ---------------------------------------------------------------------------------------------- HTTP
def test_models_health_and_headers(geo):
    with httpx.Client(timeout=60) as c:
        m = c.get(f"{geo}/eu/v1/models").json()
        assert m["data"][0]["id"] == MODEL and m["data"][0]["region"] == "eu"
        h = c.get(f"{geo}/asia/healthz", headers=ADMIN).json()
        assert h["status"] == "ok" and h["region"] == "asia" and h["registry"]["connected"]
        r = c.post(f"{geo}/us/v1/chat/completions", json=chat("tell me about the alps " * 20, n=5), headers=ADMIN)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 5
        assert body["choices"][0]["message"]["role"] == "assistant"
        g = geoh(r)
        assert g["region"] == "us" and g["route"] == "local" and g["origin"] == "us"
        assert g["replica"] and g["reason"] and float(g["queue-wait-ms"]) >= 0
        # the same prompt again: the router matched its prefix
        r2 = c.post(f"{geo}/us/v1/chat/completions", json=chat("tell me about the alps " * 20, n=5), headers=ADMIN)
        assert int(geoh(r2)["matched-prefix"]) > 100 and geoh(r2)["replica"] == g["replica"]


def test_streaming_sse(geo):
    with httpx.Client(timeout=60) as c:
        for path, body in (("chat/completions", chat("stream please " * 10, n=6, stream=True)),
                           ("completions", {"prompt": "once upon a time " * 10, "max_tokens": 4, "stream": True})):
            r = c.post(f"{geo}/eu/v1/{path}", json=body, headers=ADMIN)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert geoh(r)["region"] == "eu" and geoh(r)["replica"]
            events = [ln[len("data: "):] for ln in r.text.splitlines() if ln.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            n_tok = body["max_tokens"]
            assert len(chunks) == n_tok + 1 and chunks[-1]["choices"][0]["finish_reason"] == "length"
            if path == "chat/completions":
                assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
                assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
            else:
                assert chunks[0]["choices"][0]["text"].startswith("tok")


def _sse_reply(text, kind):
    chunks = [json.loads(ln[len("data: "):]) for ln in text.splitlines()
              if ln.startswith("data: ") and ln != "data: [DONE]"]
    key = (lambda c: c["delta"].get("content") or "") if kind == "chat" else (lambda c: c.get("text") or "")
    return "".join(key(ch["choices"][0]) for ch in chunks if ch.get("choices"))


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_conversations_next_turn_matches_the_reply_its_replica_cached(geo, kind, stream):
    """The engine caches a reply as it decodes it, and a conversation's next turn starts with prompt + reply:
    the region ingress reads the reply from the finished response (a stream: at its end) and hands it to
    its GeoPrefixRouter (``serve/ingress/replies.py``), so the next turn matches past the end of the first
    turn's prompt -- without it the match stops at the prompt's last whole block."""
    from ray_geolb.policy.canonical import canonical_text

    with httpx.Client(timeout=60) as c:
        first = f"a {kind} conversation, streamed {stream}: " + "what is in the valley? " * 12
        if kind == "chat":
            path, body = "chat/completions", chat(first, n=64, stream=stream)
        else:
            path, body = "completions", {"model": MODEL, "prompt": first, "max_tokens": 64, "stream": stream}
        r1 = c.post(f"{geo}/asia/v1/{path}", json=body, headers=ADMIN)
        assert r1.status_code == 200, r1.text
        if stream:
            reply = _sse_reply(r1.text, kind)
        else:
            choice = r1.json()["choices"][0]
            reply = choice["message"]["content"] if kind == "chat" else choice["text"]
        assert len(reply) > 150, reply  # a reply longer than a block where the first turn ends
        if kind == "chat":
            nxt = dict(body, messages=body["messages"] + [{"role": "assistant", "content": reply},
                                                         {"role": "user", "content": "and then?"}])
        else:
            nxt = dict(body, prompt=first + reply + " And then?")
        r2 = c.post(f"{geo}/asia/v1/{path}", json=nxt, headers=ADMIN)
        assert r2.status_code == 200, r2.text
        assert geoh(r2)["replica"] == geoh(r1)["replica"]
        assert int(geoh(r2)["matched-prefix"]) > len(canonical_text(body)) + 64, (geoh(r2), len(canonical_text(body)))


def test_bad_requests_name_the_problem(geo):
    u = f"{geo}/us/v1/chat/completions"
    with httpx.Client(timeout=30) as c:
        cases = [
            (c.post(u, content=b"{not json"), 400, "not valid JSON"),
            (c.post(u, json=[1, 2]), 400, "JSON object"),
            (c.post(u, json={"model": MODEL}), 400, "'messages'"),
            (c.post(u, json={"messages": []}), 400, "'messages'"),
            (c.post(u, json={"messages": [{"content": "no role"}]}), 400, "role"),
            (c.post(u, json=chat("x", n=0)), 400, "max_tokens"),
            (c.post(u, json=chat("x", stream="yes")), 400, "stream"),
            (c.post(u, json={**chat("x"), "model": "gpt-17"}), 404, "gpt-17"),
            (c.post(u, json={**chat("x"), "allowed_regions": ["mars"]}), 400, "mars"),
            (c.post(u, json=chat("x"), headers={"x-allowed-regions": ",,"}), 400, "x-allowed-regions"),
            (c.post(u, json=chat("x"), headers={"x-geolb-max-wait-s": "soon"}), 400, "x-geolb-max-wait-s"),
            (c.post(f"{geo}/us/v1/completions", json={"max_tokens": 3}), 400, "'prompt'"),
        ]
        for r, status, needle in cases:
            assert r.status_code == status, (needle, r.status_code, r.text)
            err = r.json()["error"]
            assert needle in err["message"], (needle, err)
            assert err["code"] == status


def _hostile_bodies():
    """Hypothesis strategy: request bodies a client might send by mistake or on purpose -- arbitrary
    JSON values, chat bodies with wrong types in every field, deep nesting, lone surrogates, huge
    numbers, raw bytes -- mostly invalid, some valid (max_tokens 1, so the engine answers fast)."""
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))
    anyjson = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                           st.dictionaries(st.text(max_size=10), kids, max_size=4)),
                           max_leaves=12)
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "", 3]),
                                     "content": st.one_of(st.text(max_size=60), anyjson)})
    chat_body = st.fixed_dictionaries(
        {"messages": st.one_of(st.lists(message, max_size=3), anyjson)},
        optional={"model": st.one_of(st.just(MODEL), st.text(max_size=8)),
                  "max_tokens": st.one_of(st.just(1), st.integers(-5, 10**9), anyjson),
                  "stream": st.one_of(st.booleans(), anyjson),
                  "allowed_regions": st.one_of(st.just(["us"]), anyjson),
                  "temperature": anyjson, "tools": anyjson, "n": anyjson})
    # a lone surrogate in any string field, integers past Python's 4,300-digit parse limit,
    # duplicate keys, and both output-length fields (agreeing, disagreeing, over the limit), n
    surrogate = st.sampled_from(["\\ud800", "\\udfff", "a\\udc80b", "\\ud83d"])  # JSON escapes, raw in the body
    huge_int = st.integers(4000, 6000).map(lambda d: "9" * d)
    tok = st.one_of(st.just("1"), st.integers(-3, 20000).map(str), huge_int, st.just("null"))
    field = st.sampled_from(["model", "role", "content", "user", "stop", "allowed_regions", "tool_choice", "n",
                             "max_tokens", "max_completion_tokens", "stream", "temperature"])

    def raw_chat(draw_fields):
        """A chat body written by hand (so it can hold what json.dumps cannot: duplicates, lone
        surrogates as escapes, 5,000-digit literals)."""
        return b"{" + ", ".join(f'"{k}": {v}' for k, v in draw_fields).encode() + b"}"

    msg = '[{"role": "user", "content": "hi"}]'
    with_surrogate = st.tuples(field, surrogate).map(lambda fs: raw_chat(
        [("model", f'"{MODEL}"'), ("messages", msg if fs[0] not in ("role", "content") else
                                   f'[{{"role": "{fs[1] if fs[0] == "role" else "user"}", '
                                   f'"content": "{fs[1] if fs[0] == "content" else "hi"}"}}]'),
         ("max_tokens", "1")] + ([] if fs[0] in ("role", "content") else [(fs[0], f'"{fs[1]}"')])))
    with_huge_int = st.tuples(field, huge_int).map(lambda fs: raw_chat(
        [("model", f'"{MODEL}"'), ("messages", msg), (fs[0], fs[1])]))
    duplicates = st.tuples(field, st.lists(st.one_of(tok, st.just('"x"'), st.just(f'"{MODEL}"')), min_size=2,
                                           max_size=3)).map(lambda fs: raw_chat(
        [("model", f'"{MODEL}"'), ("messages", msg), ("max_tokens", "1")] + [(fs[0], v) for v in fs[1]]))
    both_fields = st.tuples(tok, tok, st.one_of(st.none(), st.integers(-1, 3).map(str))).map(lambda t: raw_chat(
        [("model", f'"{MODEL}"'), ("messages", msg), ("max_tokens", t[0]), ("max_completion_tokens", t[1])]
        + ([] if t[2] is None else [("n", t[2])])))
    as_bytes = st.one_of(
        anyjson.map(lambda v: json.dumps(v).encode()),
        chat_body.map(lambda v: json.dumps(v, allow_nan=True).encode()),
        st.binary(max_size=200),
        st.integers(100, 6000).map(lambda d: b'{"messages": ' + b"[" * d + b"]" * d + b"}"),
        st.just(b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "\\ud800"}]}'),
        with_surrogate, with_huge_int, duplicates, both_fields,
    )
    headers = st.dictionaries(st.sampled_from(["x-allowed-regions", "x-geolb-max-wait-s", "x-session-id",
                                               "x-geolb-hops", "x-geolb-origin", "content-type"]),
                              st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
                              max_size=3)
    return as_bytes, headers


def test_fuzzed_bodies_and_headers_get_a_typed_answer_never_a_500_or_a_hang(geo):
    """Hypothesis-generated bodies and headers against the real region endpoint: every answer is a
    200 or a typed 4xx/429/503 JSON error, within a bound; never a 500, never a hang."""
    from hypothesis import HealthCheck, given, settings

    bodies, headers = _hostile_bodies()
    seen = {}
    client = httpx.Client(timeout=30)

    @settings(max_examples=120, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(body=bodies, hdrs=headers)
    def probe(body, hdrs):
        path = "chat/completions" if len(body) % 3 else "completions"
        r = client.post(f"{geo}/us/v1/{path}", content=body, headers={**hdrs, "content-type": "application/json"})
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code in (200, 400, 403, 404, 413, 422, 429, 503), (r.status_code, body[:200], r.text[:300])
        if r.status_code != 200:
            assert r.headers["content-type"] == "application/json", r.headers
            err = r.json()["error"]
            assert err["message"] and err["code"] == r.status_code
        elif path == "chat/completions":  # served: never more output than the effective limit allows
            usage = r.json().get("usage") or {}
            assert usage.get("completion_tokens", 0) <= 8192

    try:
        probe()
    finally:
        client.close()
    assert seen.get(400, 0) >= 10, seen  # the generator really sends bad input
    assert sum(seen.values()) >= 120, seen
    assert 500 not in seen, seen


#: the most a hostile body may take to get its typed 4xx from the real ingress (seconds).
#: Measured on a 2-core machine: 0.007-0.012 s for the small bodies, 0.09-0.11 s for the 50 MB ones
#: (which took 1.0 s when the body was read whole before the 413); the bound leaves room for a loaded CI.
HOSTILE_BOUND_S = 5.0


def test_hostile_bodies_get_a_typed_4xx_within_a_bound_and_output_never_exceeds_the_limit(geo):
    """Hostile and edge-case bodies against the real us ingress: both token fields, n, a lone surrogate in
    ``model``, a 5,000-digit integer, and a 50 MB body with and without Content-Length each get a
    typed JSON 4xx within HOSTILE_BOUND_S; a body whose limit sits in ``max_completion_tokens`` gets
    exactly that many tokens, streamed or not."""
    u = f"{geo}/us/v1/chat/completions"
    hi = [{"role": "user", "content": "hardening check"}]
    big = b"9" * 5000
    cases = [
        ("both fields disagree", json.dumps({"model": MODEL, "messages": hi, "max_tokens": 4,
                                             "max_completion_tokens": 40}).encode(), 400, "max_completion_tokens"),
        ("max_completion_tokens over the limit", json.dumps({"model": MODEL, "messages": hi,
                                                             "max_completion_tokens": 20000}).encode(),
         400, "max_completion_tokens"),
        ("n=2", json.dumps({"model": MODEL, "messages": hi, "n": 2}).encode(), 400, "n"),
        ("surrogate in model", b'{"model": "x\\ud800", "messages": [{"role": "user", "content": "hi"}]}', 404, "model"),
        ("5,000-digit integer", b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "hi"}],'
                                b' "max_tokens": ' + big + b"}", 400, None),
    ]
    timings = {}
    with httpx.Client(timeout=60) as c:
        for name, raw, status, param in cases:
            t0 = time.monotonic()
            r = c.post(u, content=raw, headers={"content-type": "application/json"})
            took = timings[name] = time.monotonic() - t0
            assert r.status_code == status and r.headers["content-type"] == "application/json", (name, r.text[:300])
            err = r.json()["error"]
            assert err["code"] == status and err["param"] == param, (name, err)
            assert took < HOSTILE_BOUND_S, (name, took)

        blob = b"x" * (50 * 1024 * 1024)
        t0 = time.monotonic()
        r = c.post(u, content=blob, headers={"content-type": "application/json"})  # with Content-Length
        took = timings["50 MB, Content-Length"] = time.monotonic() - t0
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large", r.text[:300]
        assert "Content-Length" in r.json()["error"]["message"] and took < HOSTILE_BOUND_S, took

        def chunks():
            for _ in range(50):
                yield b"x" * (1024 * 1024)

        t0 = time.monotonic()
        r = c.post(u, content=chunks(), headers={"content-type": "application/json"})  # chunked: no length
        took = timings["50 MB, chunked"] = time.monotonic() - t0
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large", r.text[:300]
        assert "no Content-Length" in r.json()["error"]["message"] and took < HOSTILE_BOUND_S, took

        # the limit in max_completion_tokens is the one the engine obeys, streamed or not
        r = c.post(u, json={"model": MODEL, "messages": hi, "max_completion_tokens": 7})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7, r.text[:300]
        r = c.post(u, json={"model": MODEL, "messages": hi, "max_tokens": 5, "max_completion_tokens": 5,
                            "stream": True})
        events = [ln[len("data: "):] for ln in r.text.splitlines() if ln.startswith("data: ")]
        tokens = [e for e in events[:-1] if json.loads(e)["choices"] and
                  json.loads(e)["choices"][0].get("delta", {}).get("content")]
        assert r.status_code == 200 and events[-1] == "[DONE]" and len(tokens) == 5, events[-3:]
        # the router took the ingress's prompts by the ids the ingress minted (not the client's x-request-id)
        before = c.get(f"{geo}/us/v1/geolb/state", headers=ADMIN).json()["router"]["counters"]["handed_over"]
        rs = [c.post(u, json={"model": MODEL, "messages": [{"role": "user", "content": f"same id {i}"}],
                              "max_tokens": 2}, headers={"x-request-id": "chosen-by-the-client"}) for i in range(2)]
        assert all(r.status_code == 200 for r in rs), [r.text[:200] for r in rs]
        after = c.get(f"{geo}/us/v1/geolb/state", headers=ADMIN).json()
        assert after["router"]["counters"]["handed_over"] >= before + 1, after["router"]["counters"]
        assert after["counters"]["requests"] > 0
        # and the ingress is healthy afterwards
        assert c.get(f"{geo}/us/healthz").json()["status"] == "ok"
    print("hostile bodies, seconds to the typed 4xx:", {k: round(v, 3) for k, v in timings.items()})


# ---------------------------------------------------------------------------------------------- routing
def test_local_while_not_saturated(geo):
    async def run():
        await wait_idle(geo)
        out = []
        for i in range(6):  # one at a time: us is never saturated
            out += await burst(geo, "us", [chat(f"sequential {i} " * 30, n=4)])
        return out

    rs = asyncio.run(run())
    assert all(r.status_code == 200 for r in rs)
    assert {geoh(r)["route"] for r in rs} == {"local"} and {geoh(r)["region"] for r in rs} == {"us"}


def test_forward_only_when_saturated(geo):
    async def run():
        await wait_idle(geo)
        # let two replica reports (0.5 s period) arrive after the last test's tail, so us's router
        # grants its full capacity rather than what a stale report left
        await asyncio.sleep(1.2)
        return await burst(geo, "us", [chat(f"burst user {i} " * 40, n=40) for i in range(12)])

    rs = asyncio.run(run())
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    routes = [(geoh(r)["route"], geoh(r)["region"]) for r in rs]
    local = [x for x in routes if x[0] == "local"]
    fwd = [x for x in routes if x[0] == "forwarded"]
    assert len(local) >= 2, routes  # us took what it could (2 seqs per replica) ...
    assert fwd, routes  # ... and the overflow went to peers
    assert all(reg in ("eu", "asia") for _, reg in fwd) and all(reg == "us" for _, reg in local)
    assert all(geoh(r)["origin"] == "us" for r in rs)


def test_peer_extras_reach_the_cost_selector(geo):
    """GeoPrefix's region layer in Serve: each ingress publishes its router's load (in-flight requests,
    queued tokens, pooled t_p, replicas) and its hash-only prefix summary in its heartbeat, the
    registry relays them, and the saturated
    region's cost selector prices the peers with it. eu is nearer and has a free slot and an empty
    queue (SP-P availability says "go"), but already runs a long request; asia is idle. The overflow
    from us goes to asia, and the cost beyond the RTT that made eu dearer is the relayed in-flight
    count's term (w_shared x residual prefill x eu's running requests): ~0.1 s here, against an
    injected RTT difference of 7 ms. (The measured RTTs are not compared: on this 2-core machine a
    probe can spike to hundreds of ms under load.)"""
    async def run():
        await wait_idle(geo)
        async with httpx.AsyncClient(timeout=120) as c:
            async def state(r):
                return (await c.get(f"{geo}/{r}/v1/geolb/state", headers=ADMIN)).json()

            for r in REGIONS:  # each region's router exists (it is created with its first request)
                warm = await c.post(f"{geo}/{r}/v1/chat/completions", json=chat(f"warm {r}", n=1),
                                    headers={"x-allowed-regions": r})
                assert warm.status_code == 200, warm.text
            # eu's long request must still run when the probe is decided (~15 s of decode at ~10 ms a
            # token: the waits below take a few seconds, more on a loaded machine)
            eu_long = asyncio.ensure_future(c.post(f"{geo}/eu/v1/chat/completions",
                                                   json=chat("eu batch " * 300, n=1500),
                                                   headers={"x-allowed-regions": "eu"}))
            t0 = time.time()
            deadline = time.time() + 20
            while True:  # eu's in-flight request reaches us through the registry
                st = await state("us")
                # (asia's warm-up request must have left its router too: its in-flight count is relayed
                # one heartbeat later, so an early read can still show it)
                if st["peers"]["eu"]["extra"].get("inflight", 0) >= 1 and "replicas" in st["peers"]["asia"]["extra"] \
                        and st["peers"]["asia"]["extra"].get("inflight") == 0 \
                        and {"eu", "asia"} <= set(st["available_peers"]):
                    break
                assert time.time() < deadline, st["peers"]
                await asyncio.sleep(0.1)
            seen = st["peers"]
            deadline = time.time() + 20
            while not (st["peers"]["eu"]["prefix_summary"] or {}).get("keys"):
                # eu's router indexed the long prompt: its hash-only summary reaches us via the registry
                assert time.time() < deadline, st["peers"]["eu"]
                await asyncio.sleep(0.1)
                st = await state("us")
            summary = st["peers"]["eu"]["prefix_summary"]
            us_long = [asyncio.ensure_future(c.post(f"{geo}/us/v1/chat/completions",
                                                    json=chat(f"us long {i} " * 300, n=600),
                                                    headers={"x-allowed-regions": "us"})) for i in range(2)]
            deadline = time.time() + 20
            while True:  # us's 2 engine slots are taken, and us sees both peers (a heartbeat can come late)
                st = await state("us")
                if st["local_available"] == 0 and {"eu", "asia"} <= set(st["available_peers"]):
                    break
                assert time.time() < deadline, (st["local_available"], st["available_peers"], st["peers"])
                await asyncio.sleep(0.05)
            setup_s = time.time() - t0
            probe = await c.post(f"{geo}/us/v1/chat/completions", json=chat("where should I go " * 250, n=4))
            after = await state("us")
            rest = await asyncio.gather(eu_long, *us_long)
        return seen, probe, after, rest, summary, setup_s

    seen, probe, after, rest, summary, setup_s = asyncio.run(run())
    # the summary: a Bloom filter of block keys (no text), a few hundred bytes, stated false-positive rate
    assert summary["keys"] >= 10 and 0 < summary["bytes"] < 4096 and summary["false_positive_rate"] < 0.01, summary
    assert all(r.status_code == 200 for r in rest)
    assert after["remote"] == "cost"  # GeoPrefix's region layer (geoprefix_two_layer) by default
    for r in ("eu", "asia"):  # the relayed extras: what each peer's ingress computed from its router
        ex = seen[r]["extra"]
        assert ex["replicas"] == 1 and ex["t_p_s"] > 0 and ex["queued_tokens"] >= 0, seen
    assert seen["eu"]["extra"]["inflight"] >= 1 and seen["asia"]["extra"]["inflight"] == 0, seen
    assert probe.status_code == 200, probe.text
    g = geoh(probe)
    costs, inflight = after["last_costs_s"], after["last_cost_inflight"]
    # what the comparison priced: eu's running request, and nothing at asia
    assert inflight.get("eu", 0) >= 1 and inflight.get("asia") == 0, (
        "the probe was priced against other in-flight counts than the scenario's", inflight, costs,
        f"setup {setup_s:.1f} s", after["decisions"], after["counters"])
    assert (g["route"], g["region"]) == ("forwarded", "asia"), (g, costs, inflight, after["peers"])
    assert "eu" in costs, ("eu was not priced: not an available peer when the probe was decided", costs,
                           after["available_peers"], after["peers"])
    assert costs["asia"] < costs["eu"] and costs["asia"] < costs["stay"], costs
    rtt = after["last_cost_rtts_ms"]  # the RTTs that comparison used
    beyond_rtt = {r: costs[r] - rtt[r] / 1000 for r in ("eu", "asia")}
    tp = seen["eu"]["extra"]["t_p_s"]
    prompt_tokens = len("where should I go " * 250) / 4
    # eu's extra cost is its running request priced at (about) a full residual prefill
    assert beyond_rtt["eu"] - beyond_rtt["asia"] > 0.5 * tp * prompt_tokens, (beyond_rtt, tp)


def test_hop_limit_forwarded_request_waits_at_peer(geo):
    """eu is saturated while us and asia are free: a request forwarded to eu (hops=1) is served in eu
    after waiting -- never forwarded again -- while a fresh eu request (hops=0) would be forwarded."""
    eu = serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name="geolb-eu")

    async def run():
        await wait_idle(geo)
        async with httpx.AsyncClient(timeout=120) as c:
            fill = [asyncio.ensure_future(c.post(f"{geo}/eu/v1/chat/completions", json=chat(f"fill eu {i} " * 30, n=60),
                                                 headers={"x-allowed-regions": "eu"})) for i in range(6)]
            for _ in range(100):  # until eu is saturated and holding
                st = (await c.get(f"{geo}/eu/v1/geolb/state", headers=ADMIN)).json()
                if st["local_available"] == 0 and st["queue_len"] > 0:
                    break
                await asyncio.sleep(0.05)
            assert st["local_available"] == 0, st
            t0 = time.monotonic()
            fwd = eu.forwarded.remote(chat("forwarded from us " * 30, n=4),
                                      {"hops": 1, "origin": "us", "max_tokens": 4, "request_id": "hop-test"})
            fresh = asyncio.ensure_future(c.post(f"{geo}/eu/v1/chat/completions",
                                                 json=chat("fresh eu request " * 30, n=4)))
            meta, res = await fwd
            waited = time.monotonic() - t0
            fresh = await fresh
            fills = await asyncio.gather(*fill)
        return meta, res, waited, fresh, fills

    meta, res, waited, fresh, fills = asyncio.run(run())
    assert meta["region"] == "eu" and meta["hops"] == 1 and meta["origin"] == "us"
    assert res["object"] == "chat.completion" and res["usage"]["completion_tokens"] == 4  # eu's LLMServer answered
    assert meta["queue_wait_ms"] > 50 and waited > 0.05  # it waited in eu's queue
    assert fresh.status_code == 200 and geoh(fresh)["route"] == "forwarded" and geoh(fresh)["region"] != "eu"
    assert all(f.status_code == 200 and geoh(f)["region"] == "eu" for f in fills)


def test_allowed_regions_never_violated(geo):
    async def run():
        await wait_idle(geo)
        a = await burst(geo, "us", [chat(f"residency A {i} " * 40, n=30) for i in range(10)],
                        headers={"x-allowed-regions": "us,eu"})
        await wait_idle(geo)
        b = await burst(geo, "asia", [chat(f"residency B {i} " * 40, n=30, allowed_regions=["asia"]) for i in range(6)])
        await wait_idle(geo)
        c = await burst(geo, "us", [chat(f"residency C {i} " * 40, n=10, allowed_regions="eu") for i in range(3)])
        return a, b, c

    a, b, c = asyncio.run(run())
    assert all(r.status_code == 200 for r in a + b + c), [r.text for r in a + b + c if r.status_code != 200]
    assert {geoh(r)["region"] for r in a} <= {"us", "eu"}
    assert any(geoh(r)["route"] == "forwarded" for r in a)  # overflow went to eu, never asia
    assert {geoh(r)["region"] for r in b} == {"asia"}  # held locally rather than sent away
    assert {geoh(r)["region"] for r in c} == {"eu"}  # us itself is not allowed: forwarded to eu
    assert {geoh(r)["route"] for r in c} == {"forwarded"}


def test_queue_full_429_and_wait_limit_503(geo):
    async def run():
        await wait_idle(geo)
        async with httpx.AsyncClient(timeout=120) as c:
            reqs = [c.post(f"{geo}/asia/v1/chat/completions", json=chat(f"overload {i} " * 30, n=40),
                           headers={"x-allowed-regions": "asia"}) for i in range(24)]
            full = await asyncio.gather(*reqs)
            await wait_idle(geo)
            # asia's engine has 2 sequence slots and GeoPrefix's pending allowance lets up to 8 more wait in
            # the engine, fewer when its reports lag: fills are sent one by one until 4 wait in asia's
            # ingress (a fixed number either all went to the engine or filled the queue to max_queue=10, and
            # the impatient request was then refused with 429 instead of waiting), so the impatient request
            # waits behind them for a slot that cannot free within its 0.3 s
            fill = []
            deadline = time.monotonic() + 30
            while (await c.get(f"{geo}/asia/v1/geolb/state", headers=ADMIN)).json()["lb_queue_len"] < 4:
                assert time.monotonic() < deadline, f"{len(fill)} fills, and 4 never waited in asia's ingress"
                if len(fill) < 30:
                    fill.append(asyncio.ensure_future(c.post(f"{geo}/asia/v1/chat/completions",
                                                             json=chat(f"slow {len(fill)} " * 30, n=80),
                                                             headers={"x-allowed-regions": "asia"})))
                await asyncio.sleep(0.1)
            t0 = time.monotonic()
            timed = await c.post(f"{geo}/asia/v1/chat/completions", json=chat("impatient " * 30, n=4),
                                 headers={"x-allowed-regions": "asia", "x-geolb-max-wait-s": "0.3"})
            dt = time.monotonic() - t0
            await asyncio.gather(*fill)
        return full, timed, dt

    full, timed, dt = asyncio.run(run())
    codes = [r.status_code for r in full]
    assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= 6, codes
    for r in full:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            err = r.json()["error"]
            assert err["type"] == "queue_full" and "max_queue=10" in err["message"]
            assert r.headers["x-geolb-region"] == "asia"
    assert timed.status_code == 503, timed.text
    assert timed.json()["error"]["type"] == "wait_timeout" and int(timed.headers["retry-after"]) >= 1
    assert 0.25 < dt < 5


def test_a_heartbeat_claiming_more_replicas_than_its_region_has_is_refused(geo):
    """The deployment registered each region with its replica count (``serve deploy`` config path): a
    heartbeat that says eu has 1,000 available replicas (it has 1) is refused with a typed reason, and
    eu keeps its last good figures."""
    from ray_geolb.policy.region.heartbeat import heartbeat_message

    reg = ray.get_actor(DEFAULT_NAME, namespace=DEFAULT_NAMESPACE)
    assert ray.get(reg.stats.remote(), timeout=30)["replicas_registered"] == REGIONS
    forged = heartbeat_message("eu", "eu/forged", 1000, 0, {"us": 0.01})
    table = ray.get(reg.heartbeat_batch.remote([forged]), timeout=30)
    assert table["refused"] == {"over_capacity": 1}, table.get("errors")
    assert table["regions"]["eu"]["available_replicas"] <= REGIONS["eu"]


def test_registry_killed_mid_run(geo):
    """Kill the registry (Ray restarts it, empty) in the middle of a run: no request is lost, the
    registry is rebuilt from heartbeats, and cross-region forwarding resumes."""
    reg = ray.get_actor(DEFAULT_NAME, namespace=DEFAULT_NAMESPACE)

    async def run():
        await wait_idle(geo)
        async with httpx.AsyncClient(timeout=120) as c:
            async def client(k):
                out = []
                for i in range(6):
                    out.append(await c.post(f"{geo}/us/v1/chat/completions", json=chat(f"steady {k} {i} " * 30, n=20)))
                return out

            tasks = [asyncio.ensure_future(client(k)) for k in range(4)]
            await asyncio.sleep(0.8)
            ray.kill(reg, no_restart=False)
            killed_at = time.monotonic()
            results = [r for t in await asyncio.gather(*tasks) for r in t]
        # rebuilt: the restarted actor knows every region again
        deadline = time.monotonic() + 30
        table = None
        while True:
            try:
                table = await reg.table.remote()
            except ray.exceptions.RayError as e:  # still restarting (ActorUnavailableError): not rebuilt yet
                table = repr(e)
            else:
                if set(table["regions"]) == set(REGIONS) and table["uptime_s"] < time.monotonic() - killed_at + 1:
                    break
            assert time.monotonic() < deadline, table
            await asyncio.sleep(0.2)
        await wait_idle(geo)
        after = await burst(geo, "us", [chat(f"after restart {i} " * 40, n=40) for i in range(12)])
        return results, after

    results, after = asyncio.run(run())
    assert len(results) == 24 and all(r.status_code == 200 for r in results), [
        r.text for r in results if r.status_code != 200]
    assert all(r.status_code == 200 for r in after), [(r.status_code, r.text[:300]) for r in after]
    assert any(geoh(r)["route"] == "forwarded" for r in after), [geoh(r) for r in after]


def test_every_region_heartbeats_to_the_standby_registry_too(geo):
    """The example config runs a standby registry in eu (``registry.standbys``): every region's ingress
    reports its link to it connected, the standby's table holds every region, and it holds no snapshot
    (the primary alone mirrors it)."""
    from ray_geolb.serve.registry import standby_name

    name = standby_name(DEFAULT_NAME, "eu")
    standby = ray.get_actor(name, namespace=DEFAULT_NAMESPACE)

    async def states():
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=30) as c:
            while True:
                sts = {r: (await c.get(f"{geo}/{r}/v1/geolb/state", headers=ADMIN)).json() for r in REGIONS}
                links = {r: s["registry"]["standbys"][name] for r, s in sts.items()}
                if all(link["connected"] and link["successes"] > 0 for link in links.values()):
                    return links
                assert time.monotonic() < deadline, links
                await asyncio.sleep(0.2)

    asyncio.run(states())
    table, stats = ray.get([standby.table.remote(), standby.stats.remote()], timeout=30)
    assert set(table["regions"]) == set(REGIONS)
    assert not stats["snapshot_nodes"]
    assert stats["node_region"] == "eu"  # created by the ingresses (create_if_missing), pinned to eu's nodes


def test_restarted_ingress_reloads_its_snapshot(geo):
    """The regional snapshot (what us forwarded where) is mirrored to the registry; when the us ingress
    replica dies, Serve starts a new one, which reloads the snapshot from the registry."""
    reg = ray.get_actor(DEFAULT_NAME, namespace=DEFAULT_NAMESPACE)

    async def run():
        await wait_idle(geo)
        rs = await burst(geo, "us", [chat(f"snapshot user {i} " * 40, n=40) for i in range(12)])
        assert any(geoh(r)["route"] == "forwarded" for r in rs)
        async with httpx.AsyncClient(timeout=30) as c:
            before = (await c.get(f"{geo}/us/v1/geolb/state", headers=ADMIN)).json()
            deadline = time.monotonic() + 20
            while (await reg.stats.remote())["snapshot_nodes"].get("us", 0) == 0:
                assert time.monotonic() < deadline, "snapshot never mirrored to the registry"
                await asyncio.sleep(0.2)
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                     if a["name"].startswith(f"SERVE_REPLICA::geolb-us#{INGRESS_DEPLOYMENT}#")]
            assert len(names) == 1, names
            ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
            deadline = time.monotonic() + 60
            while True:
                try:
                    st = (await c.get(f"{geo}/us/v1/geolb/state", headers=ADMIN)).json()
                    if st["source"] != before["source"] and st["snapshot_loaded_from_registry"]:
                        return before, st
                except (httpx.HTTPError, ValueError):
                    pass
                assert time.monotonic() < deadline, "no new us ingress with a reloaded snapshot"
                await asyncio.sleep(0.3)

    before, after = asyncio.run(run())
    assert before["snapshot_nodes"] > 0 and after["snapshot_nodes"] > 0
    assert after["counters"]["requests"] == 0  # a fresh replica: the snapshot came from the registry


# ---------------------------------------------------------------------------------------------- Locust
def test_locustfile_runs_headless_against_the_region_endpoints(geo, tmp_path):
    """``examples/locustfile.py`` as a user runs it (headless, in its own process) against the real
    region endpoints: multi-turn streamed conversations in all three regions, TTFT and where each
    request was served reported as their own entries, no failed request."""
    # never import locust here: importing it monkey-patches the process with gevent (Ray then hangs)
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed")
    asyncio.run(wait_idle(geo))
    prefix = tmp_path / "locust"
    env = dict(os.environ, GEOLB_MODEL=MODEL, GEOLB_MAX_TOKENS="8", GEOLB_TURNS="3")
    locustfile = REPO / "examples" / "locustfile.py"
    p = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(locustfile), "--host", geo, "--headless", "-u", "5", "-r", "5",
         "-t", "8s", "--csv", str(prefix), "--only-summary"],
        capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    with open(f"{prefix}_stats.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by_name = {r["Name"]: r for r in rows}
    assert int(by_name["Aggregated"]["Failure Count"]) == 0
    chats = [r for r in rows if r["Name"].endswith("/chat")]
    assert sum(int(r["Request Count"]) for r in chats) >= 5, rows
    assert any(r["Type"] == "TTFT" and int(r["Request Count"]) > 0 for r in rows), rows
    served = [r for r in rows if r["Type"] == "SERVED"]
    assert served and all(r["Name"].startswith("served:") for r in served), rows



# ---------------------------------------------------------------------------------------------- privacy
PUBLIC_GEOLB_HEADERS = {"x-geolb-region", "x-geolb-route", "x-geolb-origin"}


def test_responses_carry_no_cache_figures_without_the_admin_token(geo):
    """A client learns where its request was served, nothing about what the cache held; the state
    endpoint and the detailed health check answer only the operator."""
    prompt = "my confidential contract clause " * 30
    with httpx.Client(timeout=60) as c:
        for _ in range(2):  # the second one matches the first one's prefix
            r = c.post(f"{geo}/us/v1/completions", json={"prompt": prompt, "max_tokens": 2},
                       headers={"x-allowed-regions": "us"})
        s = c.post(f"{geo}/us/v1/chat/completions", json=chat(prompt, n=2, stream=True),
                   headers={"x-allowed-regions": "us"})
        for resp in (r, s):
            assert resp.status_code == 200, resp.text
            assert {k for k in resp.headers if k.startswith("x-geolb-")} == PUBLIC_GEOLB_HEADERS, dict(resp.headers)
        assert r.json()["usage"].keys() == {"prompt_tokens", "completion_tokens", "total_tokens"}
        assert "cached" not in s.text
        for token in (None, "wrong-token-0123456789abcdef"):
            hdr = {} if token is None else {ADMIN_TOKEN_HEADER: token}
            st = c.get(f"{geo}/us/v1/geolb/state", headers=hdr)
            assert st.status_code == 403 and st.json()["error"]["type"] == "forbidden", st.text
            assert ADMIN_TOKEN_HEADER in st.json()["error"]["message"]
            assert c.get(f"{geo}/us/healthz", headers=hdr).json() == {"status": "ok", "region": "us"}
        full = c.get(f"{geo}/us/v1/geolb/state", headers=ADMIN).json()
        assert "admin_token" not in full["config"] and TOKEN not in json.dumps(full)


def test_byte_guessing_attack_learns_nothing(geo):
    """The attack the matched-prefix header allowed: a victim sent ``known + secret digit + rest``;
    the attacker, who knows ``known`` (placed so the digit ends a prefix-index block), sends
    ``known + guess + other text`` for each digit and compares the responses. With the operator's
    token the figures reveal the digit (so the oracle is real); without it every guess gets the same
    response (ids, timestamps and generated text aside)."""
    from ray_geolb.policy import build_policy
    from ray_geolb.serve.router import DEFAULT_POLICY

    ends = build_policy(DEFAULT_POLICY).index.prepare("x" * 4000).ends
    boundary = next(e for e in ends if e > 700)  # the secret digit is the last byte of this block

    def observe(resp):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        return ({k: v for k, v in resp.headers.items() if k.startswith("x-geolb-")},
                body["usage"], body["choices"][0]["finish_reason"], len(body["choices"][0]["text"]))

    def attack(known, secret, headers):
        with httpx.Client(timeout=60) as c:
            victim = known + secret + " and the rest of the victim's document " * 5
            assert c.post(f"{geo}/us/v1/completions", json={"prompt": victim, "max_tokens": 2},
                          headers={"x-allowed-regions": "us"}).status_code == 200
            seen = {}
            for guess in "0123456789":
                attempt = known + guess + " attacker's own filler text " * 5
                seen[guess] = observe(c.post(f"{geo}/us/v1/completions", json={"prompt": attempt, "max_tokens": 2},
                                             headers={"x-allowed-regions": "us", **headers}))
            return seen

    def known_text(tag):
        base = f"[{tag}] the launch code of the vault is "
        return (base * 40)[: boundary - 1 - len("code=")] + "code="

    # the operator's view: the matched length singles out the secret digit
    seen = attack(known_text("operator"), "7", ADMIN)
    matched = {g: int(h["x-geolb-matched-prefix"]) for g, (h, *_rest) in seen.items()}
    # (the figure is GeoPrefix's age-discounted estimate: a match a second old reads a few characters
    # short of the block end, hence the small allowance)
    assert max(matched, key=matched.get) == "7" and matched["7"] >= boundary - 8 > max(
        v for g, v in matched.items() if g != "7"), matched
    # a client's view: ten identical answers
    seen = attack(known_text("client"), "3", {})
    assert len({json.dumps(v, sort_keys=True) for v in seen.values()}) == 1, seen
    assert set(seen["3"][0]) == PUBLIC_GEOLB_HEADERS


def test_forged_internal_headers_are_ignored(geo):
    """``x-geolb-*`` headers other than the documented client options are internal: a client that
    forges a hop count, an origin or a route gets an ordinary local answer."""
    from ray_geolb.serve.ingress import client_headers

    forged = {"x-geolb-hops": "1", "x-geolb-origin": "asia", "x-geolb-route": "forwarded",
              "x-geolb-region": "eu", "x-geolb-matched-prefix": "99999", "X-Geolb-Admin": "yes"}
    kept = client_headers({**forged, "x-geolb-max-wait-s": "5", "X-Session-Id": "s1", ADMIN_TOKEN_HEADER: TOKEN})
    assert kept == {"x-geolb-max-wait-s": "5", "x-session-id": "s1"}
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{geo}/us/v1/completions", json={"prompt": "forged headers " * 10, "max_tokens": 2},
                   headers=forged)
    assert r.status_code == 200, r.text
    g = geoh(r)
    assert g["origin"] == "us" and g.keys() == {"region", "route", "origin"}


# ---------------------------------------------------------------------------------------------- the LLMServer path
def test_overloaded_region_is_served_by_a_peers_llmserver(geo):
    """us is saturated (its LLMServer replica's two sequence slots busy): the next request is forwarded,
    and a peer's LLMServer answers it -- the response headers say where, the peer's own router counts
    the request it placed, and the two ingresses count the forward out and in."""
    async def run():
        await wait_idle(geo)
        async with httpx.AsyncClient(timeout=120, headers=ADMIN) as c:
            async def state(r):
                return (await c.get(f"{geo}/{r}/v1/geolb/state")).json()

            before = {r: await state(r) for r in REGIONS}
            fill = [asyncio.ensure_future(c.post(f"{geo}/us/v1/chat/completions", json=chat(f"fill us {i} " * 30, n=60),
                                                 headers={"x-allowed-regions": "us"})) for i in range(2)]
            deadline = time.time() + 20
            while (await state("us"))["local_available"] > 0:
                assert time.time() < deadline
                await asyncio.sleep(0.05)
            probe = await c.post(f"{geo}/us/v1/chat/completions", json=chat("overflow please " * 30, n=4))
            after = {r: await state(r) for r in REGIONS}
            fills = await asyncio.gather(*fill)
        return before, probe, after, fills

    before, probe, after, fills = asyncio.run(run())
    assert all(f.status_code == 200 for f in fills)
    assert probe.status_code == 200, probe.text
    g = geoh(probe)
    peer = g["region"]
    assert g["route"] == "forwarded" and g["origin"] == "us" and peer in ("eu", "asia"), g
    body = probe.json()  # the peer's LLMServer's own OpenAI response, passed through
    assert body["object"] == "chat.completion" and body["model"] == MODEL and body["usage"]["completion_tokens"] == 4
    assert g["replica"] and body["system_fingerprint"].endswith(g["replica"])  # the replica that answered
    assert after["us"]["counters"]["forwarded_out"] == before["us"]["counters"]["forwarded_out"] + 1
    assert after[peer]["counters"]["forwarded_in"] == before[peer]["counters"]["forwarded_in"] + 1
    assert after[peer]["router"]["counters"]["routed"] >= before[peer]["router"]["counters"]["routed"] + 1
    assert after[peer]["router"]["policy"] == "geoprefix"


# ---------------------------------------------------------------------------------------------- metrics
def scrape(port: int) -> dict:
    """``{(name, frozenset(labels)): value}`` of the ray_geolb samples on a node's /metrics."""
    import re
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(ray_geolb_\w+)\{(.*)\} ([0-9.eE+-]+|NaN)$", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples, name, **labels):
    """The sum of ``name``'s samples whose labels include ``labels`` (None if there is none)."""
    want = set(labels.items())
    vals = [v for (n, lab), v in samples.items() if n == name and want <= lab]
    return sum(vals) if vals else None


def test_prometheus_metrics_after_traffic(geo):
    """The router's and the ingress's metrics reach Ray's Prometheus endpoint on the us node with
    sensible values after traffic (exported at most once a second, scraped by Ray every few seconds)."""
    asyncio.run(wait_idle(geo))
    rs = asyncio.run(burst(geo, "us", [chat(f"metrics question {i} " + "with some context " * 20) for i in range(6)]))
    assert all(r.status_code == 200 for r in rs)
    deadline = time.time() + 60
    while True:
        s = scrape(METRICS_PORT)
        got = {
            "routed": value(s, "ray_geolb_router_decisions_total", region="us", route="routed"),
            "local": value(s, "ray_geolb_ingress_requests_total", region="us", route="local"),
            "latency": value(s, "ray_geolb_router_decision_seconds_count", region="us"),
            "rtt_eu": value(s, "ray_geolb_peer_rtt_seconds", region="us", peer="eu"),
            "hb_age": value(s, "ray_geolb_registry_heartbeat_age_seconds", region="us"),
            "nodes": value(s, "ray_geolb_router_index_nodes", region="us"),
            "forwards": value(s, "ray_geolb_forwards_total", src="us"),
        }
        if all(got[k] is not None for k in ("routed", "local", "latency", "rtt_eu", "hb_age", "nodes")) \
                and got["local"] >= 6:
            break
        assert time.time() < deadline, got
        time.sleep(2)
    assert got["routed"] >= 6  # each of them was routed by the policy
    assert got["latency"] >= 6
    assert 0 < got["rtt_eu"] < 5 and 0 <= got["hb_age"] < 10 and got["nodes"] >= 1
    assert got["forwards"] is None or got["forwards"] >= 1  # earlier tests forwarded us -> peers
    # pre-registered at 0: outcomes that may never have fired still have a series
    assert value(s, "ray_geolb_ingress_rejections_total", region="us", reason="forward_failed") is not None
    assert value(s, "ray_geolb_ingress_requests_total", region="us", route="error", reason="stream_failed") is not None
    bad = [k for k, v in s.items() if v != v or v < 0]  # NaN or negative
    assert not bad, bad[:5]


# ---------------------------------------------------------------------------------------------- a replica dies
def test_a_replica_dying_mid_stream_ends_the_stream_with_a_typed_error(geo):
    """Chaos: the model replica serving a stream is killed after the first tokens. The client's
    stream ends the way it can parse -- an error event, a chunk with finish_reason "error", then
    [DONE] -- promptly (not after the idle timeout), and the region serves again once Serve has
    replaced the replica. (Last in this module: it costs eu its replica for a while.)"""
    asyncio.run(wait_idle(geo))
    with httpx.Client(timeout=120) as c:
        body = chat("a long answer please " * 10, n=400, stream=True)
        with c.stream("POST", f"{geo}/eu/v1/chat/completions", json=body, headers=ADMIN) as r:
            assert r.status_code == 200
            replica = geoh(r)["replica"]
            lines = r.iter_lines()
            events = []
            for ln in lines:  # a few tokens first
                if ln.startswith("data: "):
                    events.append(ln[len("data: "):])
                    if len(events) >= 3:
                        break
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                     if a["name"].startswith("SERVE_REPLICA::geolb-eu#") and a["name"].endswith(replica)]
            assert len(names) == 1, (replica, names)
            t_kill = time.monotonic()
            ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
            for ln in lines:
                if ln.startswith("data: "):
                    events.append(ln[len("data: "):])
            ended_after = time.monotonic() - t_kill
    assert events[-1] == "[DONE]", events[-5:]
    tail = [json.loads(e) for e in events[-3:-1]]
    assert "error" in tail[0] and tail[0]["error"]["type"] == "stream_error", tail
    assert tail[1]["choices"][0]["finish_reason"] == "error", tail
    assert len(events) < 400  # it did not run to completion
    assert ended_after < 30, ended_after  # the death was seen, not waited out
    asyncio.run(wait_idle(geo, timeout=90))  # Serve replaced the replica: eu serves again
