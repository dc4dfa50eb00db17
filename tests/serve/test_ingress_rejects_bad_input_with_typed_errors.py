"""Bad input gets a typed JSON error naming the problem before anything is routed or indexed, and a
failure while serving reaches the client (and, for a forwarded request, the origin) as a typed 500:
the body-size bound (413), JSON nesting (400, also beyond Python's recursion limit), a lone surrogate
(400), a prompt that cannot fit the model's context (400 context_length_exceeded), and a model that
raises. No cluster: ``parse_request`` and a ``RequestPath`` with its model call replaced."""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes import fake_router_view

from ray_geolb.serve.ingress import IngressConfig, RequestPath
from ray_geolb.serve.ingress.errors import GeoHTTPError
from ray_geolb.serve.ingress.openai import json_depth, parse_request

CFG = IngressConfig(region="us", registry=None, model_name="m", max_model_len=1000, max_body_bytes=64 * 1024,
                    max_json_depth=16)


def parse(body, cfg=CFG, kind="chat"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, {}, kind, cfg, origin="us", request_id="r")


def chat(content, **kw):
    return {"model": "m", "messages": [{"role": "user", "content": content}], **kw}


def status_of(body, **kw):
    with pytest.raises(GeoHTTPError) as e:
        parse(body, **kw)
    return e.value


def test_a_body_over_the_size_bound_is_413_before_parsing():
    e = status_of(b"{" + b" " * (64 * 1024) + b"}")
    assert e.status == 413 and e.type == "request_too_large" and "65538 bytes" in e.message


@pytest.mark.parametrize("depth", [17, 5000, 200_000])
def test_deep_json_is_400_even_past_the_recursion_limit(depth):
    raw = ("[" * depth + "]" * depth).encode()
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": ' + raw + b"}"
    if len(body) > CFG.max_body_bytes:
        cfg = CFG.model_copy(update={"max_body_bytes": len(body) + 1})
        e = status_of(body, cfg=cfg)
    else:
        e = status_of(body)
    assert e.status == 400 and "deep" in e.message


def test_json_depth_stops_early():
    deep = []
    cur = deep
    for _ in range(50_000):
        cur.append([])
        cur = cur[0]
    assert json_depth(deep, 10) == 11  # looked no deeper than the limit + 1
    assert json_depth({"a": [1, {"b": 2}]}, 10) == 3


def test_a_lone_surrogate_is_400():
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "bad \\ud800 text"}]}'
    e = status_of(raw)
    assert e.status == 400 and "Unicode" in e.message and e.param == "messages"


def test_a_prompt_that_cannot_fit_the_context_is_400_before_routing():
    e = status_of(chat("x" * 8 * 1000, max_tokens=16))  # >= 1,000 tokens at the most 8 chars per token
    assert e.status == 400 and e.type == "context_length_exceeded" and "context length 1000" in e.message
    assert parse(chat("x" * 4000, max_tokens=16)).text  # might fit: the engine decides
    assert parse(chat("x" * 8 * 1000), cfg=CFG.model_copy(update={"max_model_len": None})).text  # no bound known


def test_the_region_apps_know_the_emulated_models_context_length():
    from ray_geolb.engine.profiles import get_profile
    from ray_geolb.serve.app import EMULATED_DEFAULTS, build_region_apps

    apps = build_region_apps({"us": 1, "eu": 1})
    assert all(a.config["max_model_len"] == get_profile(EMULATED_DEFAULTS["profile"]).max_model_len for a in apps)
    apps = build_region_apps({"us": 1}, engine_overrides={"max_model_len": 2048}, registry=False)
    assert apps[0].config["max_model_len"] == 2048


class _FailingModel:
    async def complete(self, ctx, call_id=None):
        raise KeyError("the engine broke on: secret prompt text")


def test_a_model_failure_is_a_typed_500_and_a_forwarded_one_is_not_a_dead_peer():
    ing = RequestPath(CFG.model_dump(), geo_router=lambda: None)
    ing.llm = _FailingModel()
    body = chat("hello")
    fmeta = {"hops": 1, "origin": "eu", "max_tokens": 16, "request_id": "f1", "stream": False}
    with pytest.raises(GeoHTTPError) as e:
        asyncio.run(ing.forwarded(body, fmeta, stream=False))
    err = e.value
    assert err.status == 500 and err.type == "server_error" and err.region == "us"
    assert "secret" not in err.message and "KeyError" in err.message  # the cause is named, the prompt is not
    # the origin maps it as the peer's answer (no retry, no 'unreachable'), not as ForwardFailed
    from ray_geolb.serve.ingress.errors import as_http_error

    assert as_http_error(err, "eu") is err


def test_a_stream_that_fails_midway_ends_with_an_error_event_a_finish_reason_and_done():
    from ray_geolb.serve.ingress.openai import sse_events

    async def source():
        yield 'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        yield ['data: {"choices": [{"index": 0, "delta": {"content": "b"}}]}\n\n']
        raise RuntimeError("replica died while holding: secret prompt text")

    async def collect():
        return [ev async for ev in sse_events(source(), debug=False, region="us")]

    events = asyncio.run(collect())
    assert len(events) == 5 and events[-1] == "data: [DONE]\n\n"
    err = json.loads(events[2][len("data: "):])["error"]
    assert err["type"] == "stream_error" and "RuntimeError" in err["message"] and "secret" not in err["message"]
    finish = json.loads(events[3][len("data: "):])
    assert finish["choices"][0]["finish_reason"] == "error"


def test_a_tenant_from_the_named_header_is_served_only_in_its_regions():
    """``tenant_regions`` works in Serve: the tenant comes from the header the operator names, its
    regions narrow the request's at this hop and travel with a forward."""
    cfg = IngressConfig(region="us", registry=None, model_name="m", peers={"eu": "geolb-eu"},
                        tenant_header="x-tenant-id",
                        two_layer={"remote": "prefix", "tenant_regions": {"acme": ["eu"]}})
    ctx = parse_request(json.dumps(chat("hi")).encode(), {"x-tenant-id": "acme"}, "chat", cfg, origin="us",
                        request_id="t1")
    assert ctx.tenant == "acme"
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: None)  # availability "router", no router yet
    d = ing.decide(ctx.route_request())
    assert d.kind != "local" and (d.kind, d.reason) == ("hold", "no_region_available")  # eu unheard: wait
    other = parse_request(json.dumps(chat("hi")).encode(), {"x-tenant-id": "globex"}, "chat", cfg, origin="us",
                          request_id="t2")
    assert ing.decide(other.route_request()).kind == "local"  # a tenant without a rule: anywhere
    from ray_geolb.serve.ingress.context import RequestContext

    fwd = RequestContext.from_wire(ctx.body, ctx.text, ctx.wire(0.0, d), stream=False)
    assert fwd.tenant == "acme" and fwd.hops == 1
    with pytest.raises(GeoHTTPError, match="x-tenant-id"):
        parse_request(json.dumps(chat("hi")).encode(), {"x-tenant-id": "a b"}, "chat", cfg, origin="us",
                      request_id="t3")
    untrusted = parse_request(json.dumps(chat("hi")).encode(), {"x-tenant-id": "acme"}, "chat", CFG, origin="us",
                              request_id="t4")
    assert untrusted.tenant is None  # no header named: no tenants


class _SilentModel:
    """A model whose stream never produces anything (a stuck replica)."""

    def __init__(self):
        self.cancelled = 0

    def stream(self, ctx, call_id=None):
        model = self

        class _Gen:
            def __aiter__(self):
                return self

            async def __anext__(self):
                await asyncio.sleep(3600)

            def cancel(self):
                model.cancelled += 1

        return _Gen()


def test_a_stream_with_no_first_token_is_a_typed_504_and_returns_its_slot():
    cfg = CFG.model_copy(update={"first_token_timeout_s": 0.2})
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: None)
    ing.llm = _SilentModel()
    body = chat("hello", stream=True)
    ctx = parse_request(json.dumps(body).encode(), {}, "chat", cfg, origin="us", request_id="s1")
    with pytest.raises(GeoHTTPError) as e:
        asyncio.run(ing.process(ctx))
    assert e.value.status == 504 and e.value.type == "stream_timeout" and "first_token_timeout_s" in e.value.message
    assert ing.llm.cancelled == 1 and ing.accounting()["local_unrouted"] == 0  # the replica told, the slot back


def test_a_stream_that_stalls_after_its_first_token_ends_with_a_typed_error():
    from ray_geolb.serve.ingress.openai import sse_events
    from ray_geolb.serve.ingress.streams import TokenStream

    closed = []

    async def stalls():
        yield 'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        await asyncio.sleep(3600)

    async def run():
        stream = TokenStream(stalls(), on_close=lambda: closed.append(1), idle_timeout_s=0.2, where="region us")
        return [ev async for ev in sse_events(stream, debug=False, region="us")]

    events = asyncio.run(run())
    assert closed == [1] and events[-1] == "data: [DONE]\n\n"
    err = json.loads(events[1][len("data: "):])["error"]
    assert "stream_idle_timeout_s" in err["message"]
    assert json.loads(events[2][len("data: "):])["choices"][0]["finish_reason"] == "error"


# ---------------------------------------------------------------------------------------------- bounds and 429s
def test_a_full_router_queue_is_429_like_a_full_ingress_queue_and_bounds_tokens_too():
    from fakes import offline_router, pending_request

    from ray_geolb.policy import RouteRequest
    from ray_geolb.serve.errors import RouterQueueFull
    from ray_geolb.serve.ingress.errors import as_http_error
    from ray_geolb.serve.request_book import Entry

    r = offline_router(region="us", queue_bound=None, queue_bound_tokens=500)
    held = RouteRequest(request_id="h0", text="y" * 4 * 600)  # 600 prompt tokens already waiting
    r.book.held[held.request_id] = Entry(held, None, 0.0)
    r._pending_requests_by_id = {"h0": 1}

    async def arrive():
        return await r._choose_replica_for_request(pending_request({"prompt": "new"}, "s1", "i1"))

    with pytest.raises(RouterQueueFull, match="queue_bound_tokens 500") as e:
        asyncio.run(arrive())
    err = as_http_error(e.value, "us")
    assert err.status == 429 and err.type == "router_queue_full" and err.retry_after_s == 1.0
    assert r.counters["queue_full"] == 1 and r.metrics.total("geolb_router_rejections_total", "queue_full") == 1
    with pytest.raises(ValueError, match="queue_bound_tokens"):
        offline_router(queue_bound_tokens=0)


def test_an_ingress_at_max_concurrent_answers_429():
    from types import SimpleNamespace

    from ray_geolb.serve.ingress.deployment import RegionIngress

    cls = RegionIngress.func_or_class
    noted = []
    fake = SimpleNamespace(_http_inflight=3, cfg=CFG.model_copy(update={"max_concurrent": 3}), region="us",
                           path=SimpleNamespace(note_rejection=noted.append))
    resp = asyncio.run(cls._http(fake, None, "chat"))
    body = json.loads(resp.body)
    assert resp.status_code == 429 and body["error"]["type"] == "too_many_requests"
    assert resp.headers["retry-after"] == "1" and fake._http_inflight == 3 and noted[0].status == 429


def test_a_peer_that_answers_429_is_skipped_and_the_request_goes_elsewhere():
    from ray_geolb.policy import ReplicaStats, build_policy
    from ray_geolb.policy.region import PeerState
    from ray_geolb.serve.clock import policy_now

    geo = build_policy("geoprefix", targets=["r1"])
    geo.on_stats("r1", ReplicaStats(num_waiting=3, num_running=4, timestamp=policy_now(), max_num_seqs=4))

    fake = fake_router_view(geo)
    cfg = IngressConfig(region="us", registry=None, model_name="m", peers={"eu": "geolb-eu", "asia": "geolb-asia"},
                        two_layer={"remote": "nearest"})
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: fake)
    for peer, rtt in (("eu", 0.05), ("asia", 0.15)):
        ing.router.update_peer(PeerState(peer, 2, 0, policy_now()))
        ing.router.observe_rtt(peer, rtt)
    tried = []

    async def forward(ctx, rreq, d, wait_ms):  # the first peer tried is full, the next one serves
        tried.append(d.target)
        if len(tried) == 1:
            raise GeoHTTPError(429, f"region {d.target}: queue full", type_="queue_full", region=d.target)
        return {"region": d.target}, {"ok": True}

    ing._forward = forward
    ctx = parse_request(json.dumps(chat("hi")).encode(), {}, "chat", cfg, origin="us", request_id="p1")
    meta, out = asyncio.run(ing.process(ctx))
    assert len(tried) == 2 and set(tried) == {"eu", "asia"} and meta["region"] == tried[1] and out == {"ok": True}
    assert tried[0] not in ing.available_peers()  # unavailable until its next heartbeat (it answered: not down)


# -------------------------------------------------------------------------------------- one deadline per request
class _SlowModel:
    """A replica that never answers a non-streamed request; counts the calls cancelled."""

    def __init__(self):
        self.cancelled = 0

    async def complete(self, ctx, call_id=None):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def test_the_deadline_comes_from_config_or_the_clients_shorter_header():
    """The ingress's own deadline keeps DEADLINE_RESERVE_S (at most a quarter) of the client's for the
    time it cannot see (the proxy before the handler, the way back)."""
    import time

    from ray_geolb.serve.ingress.deadlines import DEADLINE_RESERVE_S

    ctx = parse(chat("hi"))
    assert 299.9 - DEADLINE_RESERVE_S < ctx.remaining_s() <= 300 - DEADLINE_RESERVE_S  # request_timeout_s
    short = parse_request(json.dumps(chat("hi")).encode(), {"x-geolb-timeout-s": "2.5"}, "chat", CFG,
                          origin="us", request_id="r")
    kept = 2.5 - min(DEADLINE_RESERVE_S, 2.5 / 4)
    assert kept - 0.1 < short.deadline - time.monotonic() <= kept
    longer = parse_request(json.dumps(chat("hi")).encode(), {"x-geolb-timeout-s": "9999"}, "chat", CFG,
                           origin="us", request_id="r")
    assert longer.remaining_s() <= 300  # a client can shorten the deadline, never lengthen it
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(GeoHTTPError) as e:
            parse_request(json.dumps(chat("hi")).encode(), {"x-geolb-timeout-s": bad}, "chat", CFG,
                          origin="us", request_id="r")
        assert e.value.status == 400 and e.value.param == "x-geolb-timeout-s"


def test_the_deadline_travels_with_a_forward_as_the_time_left():
    from ray_geolb.policy.region import RegionDecision
    from ray_geolb.serve.ingress.context import RequestContext
    from ray_geolb.serve.ingress.deadlines import reserve_for

    ctx = parse_request(json.dumps(chat("hi")).encode(), {"x-geolb-timeout-s": "5"}, "chat", CFG,
                        origin="us", request_id="r")
    kept = 5 - reserve_for(5)  # the origin's reserve is taken once, there: the peer gets the time left
    fmeta = ctx.wire(0.0, RegionDecision("forward", "eu", 0, "test"))
    assert kept - 0.1 < fmeta["deadline_in_s"] <= kept
    there = RequestContext.from_wire(ctx.body, ctx.text, fmeta, stream=False)
    assert kept - 0.2 < there.remaining_s() <= kept
    capped = RequestContext.from_wire(ctx.body, ctx.text, fmeta, stream=False, max_timeout_s=1.0)
    assert capped.remaining_s() <= 1.0  # the peer's own request_timeout_s bounds it too
    legacy = RequestContext.from_wire(ctx.body, ctx.text, {k: v for k, v in fmeta.items() if k != "deadline_in_s"},
                                      stream=False)
    assert legacy.deadline is None


def test_a_local_call_past_the_deadline_is_504_cancelled_and_returns_its_slot():
    ing = RequestPath(CFG.model_dump(), geo_router=lambda: None)
    ing.llm = _SlowModel()
    ctx = parse_request(json.dumps(chat("hi")).encode(), {"x-geolb-timeout-s": "0.3"}, "chat", CFG,
                        origin="us", request_id="d1")
    with pytest.raises(GeoHTTPError) as e:
        asyncio.run(ing.process(ctx))
    assert e.value.status == 504 and e.value.type == "deadline_exceeded" and "x-geolb-timeout-s" in e.value.message
    assert ing.llm.cancelled == 1 and ing.accounting()["local_unrouted"] == 0
    assert ing.counters["deadline_exceeded"] == 1


def test_a_forwarded_request_keeps_the_origins_deadline_at_the_peer():
    ing = RequestPath(CFG.model_dump(), geo_router=lambda: None)
    ing.llm = _SlowModel()
    fmeta = {"hops": 1, "origin": "eu", "max_tokens": 16, "request_id": "f2", "stream": False, "deadline_in_s": 0.3}
    with pytest.raises(GeoHTTPError) as e:
        asyncio.run(asyncio.wait_for(ing.forwarded(chat("hi"), fmeta, stream=False), 10))
    assert e.value.status == 504 and e.value.type == "deadline_exceeded" and ing.llm.cancelled == 1


def test_a_forward_that_times_out_is_504_and_never_sent_to_a_second_region():
    """A peer that was sent the request and did not answer in time may still be serving it: the
    origin cancels it there and answers 504 rather than retry elsewhere (nothing is served twice),
    and does not mark a slow peer unreachable."""
    from types import SimpleNamespace

    from ray_geolb.policy import ReplicaStats, build_policy
    from ray_geolb.policy.region import PeerState
    from ray_geolb.serve.clock import policy_now

    geo = build_policy("geoprefix", targets=["r1"])
    geo.on_stats("r1", ReplicaStats(num_waiting=3, num_running=4, timestamp=policy_now(), max_num_seqs=4))
    fake = fake_router_view(geo)
    cfg = IngressConfig(region="us", registry=None, model_name="m", peers={"eu": "geolb-eu", "asia": "geolb-asia"},
                        two_layer={"remote": "nearest"}, latency={"scale": 0.0})
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: fake)
    for peer, rtt in (("eu", 0.05), ("asia", 0.15)):
        ing.router.update_peer(PeerState(peer, 2, 0, policy_now()))
        ing.router.observe_rtt(peer, rtt)
    sent = []

    class _Silent:
        def __init__(self, peer):
            self.peer = peer
            self.cancelled = 0

        def __await__(self):
            return asyncio.sleep(3600).__await__()

        def cancel(self):
            self.cancelled += 1

    def handle(peer):
        def remote(body, fmeta):
            sent.append((peer, fmeta, _Silent(peer)))
            return sent[-1][2]

        return SimpleNamespace(forwarded=SimpleNamespace(remote=remote))

    ing.peers.handle = handle
    # 1 s: long enough to reach the forward on a loaded machine, short next to the peers' 2-s staleness
    ctx = parse_request(json.dumps(chat("hi")).encode(), {"x-geolb-timeout-s": "1"}, "chat", cfg,
                        origin="us", request_id="t1")
    with pytest.raises(GeoHTTPError) as e:
        asyncio.run(ing.process(ctx))
    assert e.value.status == 504 and e.value.type == "deadline_exceeded"
    assert len(sent) == 1 and sent[0][2].cancelled == 1  # one region only, told to stop
    assert 0 < sent[0][1]["deadline_in_s"] <= 1
    # slow is not down: no open circuit (availability itself also ages with the peer's heartbeat, which
    # this test does not send, so it is not what to check on a slow machine)
    assert not ing.peers.circuit_open(sent[0][0])


def test_a_stream_whose_consumer_stops_asking_closes_itself_and_returns_its_slot():
    """A peer relaying a stream to an origin that died stays suspended at its ``yield`` for good: the
    stream notices that nobody asked for the next token within the idle timeout and closes itself."""
    from ray_geolb.serve.ingress.streams import TokenStream

    closed, cancelled = [], []

    class _Source:
        def __init__(self):
            self.i = 0

        def __aiter__(self):
            return self

        async def __anext__(self):
            self.i += 1
            return f"tok{self.i}"

        def cancel(self):
            cancelled.append(1)

    async def run():
        stream = TokenStream(_Source(), on_close=lambda: closed.append(1), idle_timeout_s=0.2, where="region us")
        assert await stream.__anext__() == "tok1"
        await asyncio.sleep(0.05)
        assert await stream.__anext__() == "tok2"  # a consumer that keeps asking keeps its stream
        await asyncio.sleep(0.4)  # ... then stops asking (suspended at a yield nobody resumes)
        return stream

    stream = asyncio.run(run())
    assert closed == [1] and cancelled == [1] and stream.consumer_gone


# ---------------------------------------------------------------------------------------------- one rule
def test_both_token_fields_are_checked_and_the_effective_value_is_written_to_both():
    e = status_of(chat("hi", max_tokens=4, max_completion_tokens=40))
    assert e.status == 400 and e.param == "max_completion_tokens" and "disagree" in e.message
    e = status_of(chat("hi", max_completion_tokens=20000))  # the limit holds whichever field carries it
    assert e.status == 400 and e.param == "max_completion_tokens" and "exceeds the limit 8192" in e.message
    e = status_of(chat("hi", max_completion_tokens=0))
    assert e.status == 400 and e.param == "max_completion_tokens"
    for body, want in ((chat("hi", max_completion_tokens=40), 40), (chat("hi", max_tokens=7), 7),
                       (chat("hi", max_tokens=9, max_completion_tokens=9), 9), (chat("hi"), CFG.default_max_tokens),
                       (chat("hi", max_tokens=None, max_completion_tokens=5), 5)):
        ctx = parse(body)
        assert ctx.max_tokens == want and ctx.body["max_tokens"] == want == ctx.body["max_completion_tokens"]
        assert ctx.route_request().output_tokens_hint == want  # the router's price sees it too
    ctx = parse({"model": "m", "prompt": "hi", "max_completion_tokens": 6}, kind="completion")
    assert ctx.max_tokens == 6 and ctx.body["max_tokens"] == 6 and "max_completion_tokens" not in ctx.body
    # the context check uses the effective value, whichever field carries it
    e = status_of(chat("x" * 7000, max_completion_tokens=200))  # >= 875 prompt tokens + 200 > 1000
    assert e.status == 400 and e.type == "context_length_exceeded" and "200 output" in e.message


@pytest.mark.parametrize("n", [2, 0, -1, "2", 1.5, True, [1]])
def test_n_other_than_one_is_a_typed_400(n):
    e = status_of(chat("hi", n=n))
    assert e.status == 400 and e.param == "n"
    assert status_of(chat("hi", best_of=3)).param == "best_of"


def test_n_of_one_or_null_is_served_as_one_sequence():
    assert parse(chat("hi", n=1)).max_tokens == CFG.default_max_tokens
    assert parse(chat("hi", n=None)).text


def test_the_protocol_objects_take_the_normalised_body_and_the_emulated_engine_never_exceeds_it():
    from ray_geolb.serve.ingress.model_client import ModelClient
    from ray_geolb.serve.llm_server import output_limit

    mc = ModelClient(None, "us")
    req = mc._request(parse(chat("hi", max_completion_tokens=40)), "call-1")
    assert req.max_tokens == 40 == req.max_completion_tokens and req.request_id == "call-1"
    req = mc._request(parse({"model": "m", "prompt": "hi", "max_tokens": 3}, kind="completion"))
    assert req.max_tokens == 3
    # a direct caller that sends disagreeing fields gets the smaller; n > 1 is refused
    assert output_limit({"max_tokens": 4, "max_completion_tokens": 40}) == 4
    assert output_limit({"max_completion_tokens": 40}) == 40 and output_limit({}) is None
    with pytest.raises(ValueError, match="n=2"):
        output_limit({"n": 2})


# ---------------------------------------------------------------------------------------------- no 500
def test_a_surrogate_in_model_is_a_404_rendered_as_valid_utf8_json():
    raw = b'{"model": "m\\ud800x", "messages": [{"role": "user", "content": "hi"}]}'
    e = status_of(raw)
    assert e.status == 404 and e.param == "model"
    resp = e.response()
    body = json.loads(resp.body.decode("utf-8"))  # it encoded: no bare 500
    assert "\\ud800" in body["error"]["message"] and resp.headers["content-type"] == "application/json"
    e = status_of(json.dumps(chat("hi", model=["m"])).encode())
    assert e.status == 400 and e.param == "model"


def test_every_error_message_is_encodable_and_bounded():
    from ray_geolb.serve.ingress.errors import MAX_MESSAGE_CHARS

    e = GeoHTTPError(400, "x\udc80" * 5000, param="p\ud800")
    body = json.loads(e.response().body.decode("utf-8"))
    assert len(body["error"]["message"]) <= MAX_MESSAGE_CHARS * 6 + 3 and body["error"]["param"] == "p\\ud800"


@pytest.mark.parametrize("where", ["max_tokens", "temperature", "messages"])
def test_a_5000_digit_integer_is_a_400_without_a_logged_traceback(where, caplog):
    big = "9" * 5000
    raw = {"max_tokens": f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": {big}}}',
           "temperature": f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "temperature": {big}}}',
           "messages": f'{{"model": "m", "messages": [{big}]}}'}[where].encode()
    e = status_of(raw)
    assert e.status == 400 and "4300 digits" in e.message
    assert not [r for r in caplog.records if r.exc_info]


def test_duplicate_keys_take_the_last_value_and_it_is_the_one_checked():
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "max_tokens": 99999}'
    e = status_of(raw)
    assert e.status == 400 and e.param == "max_tokens" and "99999" in e.message
    raw = b'{"model": "m", "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    assert parse(raw).max_tokens == 4


# ---------------------------------------------------------------------------------------------- size first
def _request(body_chunks, headers):
    from starlette.requests import Request

    chunks = list(body_chunks)
    sent = {"n": 0}

    async def receive():
        i = sent["n"]
        sent["n"] += 1
        if i < len(chunks):
            return {"type": "http.request", "body": chunks[i], "more_body": i < len(chunks) - 1}
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(k.encode(), v.encode())
                                                                         for k, v in headers.items()]}
    return Request(scope, receive), sent


def test_a_content_length_over_the_bound_is_413_before_reading_anything():
    from ray_geolb.serve.ingress.openai import read_body

    req, sent = _request([b"x" * 1000] * 100, {"content-length": str(50 * 1024 * 1024)})
    with pytest.raises(GeoHTTPError) as e:
        asyncio.run(read_body(req, 64 * 1024))
    assert e.value.status == 413 and e.value.type == "request_too_large" and sent["n"] == 0  # nothing read
    req, _ = _request([b"{}"], {"content-length": "12abc"})
    with pytest.raises(GeoHTTPError) as e:
        asyncio.run(read_body(req, 64 * 1024))
    assert e.value.status == 400 and e.value.param == "content-length"


def test_a_body_without_content_length_is_read_with_a_running_cap():
    from ray_geolb.serve.ingress.openai import read_body

    req, sent = _request([b"x" * 10_000] * 1000, {})  # 10 MB, chunked
    with pytest.raises(GeoHTTPError) as e:
        asyncio.run(read_body(req, 64 * 1024))
    assert e.value.status == 413 and sent["n"] == 7  # stopped at the first chunk past 64 KiB
    req, _ = _request([b'{"a":', b" 1}"], {})
    assert asyncio.run(read_body(req, 64 * 1024)) == b'{"a": 1}'


# ---------------------------------------------------------------------------------------------- smaller
def test_the_deadline_runs_from_arrival_not_from_parsing():
    import time

    from ray_geolb.serve.ingress.deadlines import reserve_for

    arrived = time.monotonic() - 2.0  # e.g. two seconds spent reading a slow body
    ctx = parse_request(json.dumps(chat("hi")).encode(), {"x-geolb-timeout-s": "5"}, "chat", CFG, origin="us",
                        request_id="r", arrived=arrived)
    assert 2.9 - reserve_for(5) < ctx.remaining_s() <= 3.0 - reserve_for(5)


class _DiesOnceModel:
    """A replica that dies (Ray's ActorDiedError) before its first token, then one that answers."""

    def __init__(self):
        self.calls = []

    async def complete(self, ctx, call_id=None):
        from ray.exceptions import ActorDiedError

        self.calls.append(call_id)
        if len(self.calls) == 1:
            raise ActorDiedError()
        return {"ok": True}


def test_a_replica_that_dies_before_the_first_token_is_retried_once_on_another_call():
    ing = RequestPath(CFG.model_dump(), geo_router=lambda: None)
    ing.llm = _DiesOnceModel()
    ctx = parse(chat("hi"))
    meta, out = asyncio.run(ing.process(ctx))
    assert out == {"ok": True} and len(ing.llm.calls) == 2 and ing.llm.calls[0] != ing.llm.calls[1]
    assert ing.counters["local_retries"] == 1 and ing.accounting()["local_unrouted"] == 0

    class _AlwaysDies(_DiesOnceModel):
        async def complete(self, ctx, call_id=None):
            from ray.exceptions import ActorDiedError

            self.calls.append(call_id)
            raise ActorDiedError()

    ing.llm = _AlwaysDies()
    with pytest.raises(Exception) as e:
        asyncio.run(ing.process(parse(chat("hi"))))
    assert type(e.value).__name__ == "ActorDiedError" and len(ing.llm.calls) == 2  # once more, not forever
    assert ing.accounting()["local_unrouted"] == 0


def test_a_failed_forwarded_stream_names_the_region_that_failed_and_is_counted():
    from ray_geolb.serve.ingress.openai import completion_response

    async def fails():
        yield 'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        raise RuntimeError("the peer's replica died")

    class _Out:
        def __init__(self):
            self.gen = fails()

        def __aiter__(self):
            return self.gen

        async def aclose(self):
            await self.gen.aclose()

    counted = []
    resp = completion_response({"region": "eu", "route": "forwarded", "origin": "us"}, _Out(), True, False,
                               region="us", on_error=lambda: counted.append(1))

    async def body():
        return [ev async for ev in resp.body_iterator]

    events = asyncio.run(body())
    err = json.loads(events[1][len("data: "):])["error"]
    assert "region eu" in err["message"] and "region us" not in err["message"] and counted == [1]


def test_errors_are_counted_as_route_error_and_counters_start_at_zero():
    cfg = CFG.model_copy(update={"peers": {"eu": "geolb-eu"}})
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: None)
    zero = set(ing.metrics._zero)
    assert ("geolb_ingress_requests_total", ("error", "stream_failed")) in zero
    assert ("geolb_ingress_rejections_total", ("queue_full",)) in zero
    assert ("geolb_forwards_total", ("us", "eu")) in zero
    ing.llm = _FailingModel()
    with pytest.raises(KeyError):
        asyncio.run(ing.process(parse(chat("hi"))))
    ing.server_error(KeyError("x"))  # what the HTTP handler answers the client with
    ing.note_error("stream_failed")
    assert ing.metrics.total("geolb_ingress_requests_total", "error", "server_error") == 1
    assert ing.metrics.total("geolb_ingress_requests_total", "error", "stream_failed") == 1
    assert ing.counters["stream_errors"] == 1
    ing.metrics.flush()  # no Ray worker here: counts kept, nothing exported, nothing raised
    assert ing.metrics.total("geolb_ingress_requests_total", "error") == 2
