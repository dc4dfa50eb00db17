"""A finished request's reply reaches the prefix index of the router that placed it (no Ray cluster here; the
whole path over HTTP is in ``test_three_regions_over_http.py``): the ingress reads the reply from a
non-streamed response or from a stream's events at its end (``serve/ingress/replies.py``), a stream that is
cut or fails teaches nothing, and ``Policy.learn_reply`` records prompt + reply for GeoPrefix only (the
systems modelled on other routers index what they send)."""

import asyncio
import json

from ray_geolb.policy import build_policy
from ray_geolb.policy.canonical import canonical_text, text_with_reply
from ray_geolb.policy.region.sibling_inserts import SiblingOutbox
from ray_geolb.serve.ingress import IngressConfig
from ray_geolb.serve.ingress.openai import parse_request
from ray_geolb.serve.ingress.replies import MAX_REPLY_CHARS, ReplyCollector, reply_of_events, reply_of_response
from ray_geolb.serve.ingress.streams import TokenStream


def _sse(chunk: dict) -> str:
    return "data: " + json.dumps(chunk) + "\n\n"


def _chat_events(parts, extra=()):
    evs = [_sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                                       "content": ""}}]})]
    evs += [_sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": p}}]})
            for p in parts]
    evs += list(extra)
    return evs + ["data: [DONE]\n\n"]


def test_a_non_streamed_reply_is_read_from_its_one_choice():
    assert reply_of_response({"choices": [{"message": {"role": "assistant", "content": "Paris."}}]}, "chat") == "Paris."
    assert reply_of_response({"choices": [{"text": " lived a king"}]}, "completion") == " lived a king"
    assert reply_of_response({"choices": [{"text": "a"}, {"text": "b"}]}, "completion") is None  # n = 2
    assert reply_of_response({"error": {"message": "x"}}, "chat") is None


def test_a_streamed_reply_is_its_deltas_and_anything_else_teaches_nothing():
    usage = _sse({"object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": 2}})
    assert reply_of_events(_chat_events(["The ", "Alps."], [usage]), "chat") == "The Alps."
    comp = [_sse({"choices": [{"index": 0, "text": t}]}) for t in ("once", " upon")] + ["data: [DONE]\n\n"]
    assert reply_of_events(comp, "completion") == "once upon"
    assert reply_of_events(_chat_events(["a"], [_sse({"error": {"message": "boom"}})]), "chat") is None
    two = _sse({"choices": [{"index": 1, "delta": {"content": "other"}}]})
    assert reply_of_events(_chat_events(["a"], [two]), "chat") is None
    assert reply_of_events(["data: {not json\n\n"], "chat") is None


def test_a_collector_hands_the_reply_once_and_nothing_past_its_bound_or_after_an_error():
    got = []
    c = ReplyCollector("chat", got.append)
    for ev in _chat_events(["one ", "two"]):
        c.add(ev)
    c.finish()
    c.finish()
    assert got == ["one two"]
    big = ReplyCollector("chat", got.append)
    big.add(_chat_events(["x" * (MAX_REPLY_CHARS + 1)]))  # a batch of events, as a Ray stream may yield
    big.finish()
    bad = ReplyCollector("chat", got.append)
    bad.add(object())  # an ErrorResponse mid-stream
    bad.finish()
    assert got == ["one two"] and big.over and bad.over


async def _events(items):
    for it in items:
        await asyncio.sleep(0)
        yield it


def test_a_stream_tells_its_watcher_its_end_only_when_the_source_ended():
    async def run(cut: bool):
        got, closed = [], []
        s = TokenStream(_events(_chat_events(["a", "b"])), on_close=lambda: closed.append(1),
                        watch=ReplyCollector("chat", got.append))
        n = 0
        async for _ in s:
            n += 1
            if cut and n == 2:  # the client left after two events
                await s.aclose()
                break
        return got, closed

    assert asyncio.run(run(False)) == (["ab"], [1])
    assert asyncio.run(run(True)) == ([], [1])


def test_a_watcher_that_fails_never_breaks_the_stream():
    class Broken:
        def add(self, item):
            raise RuntimeError("watcher bug")

        def finish(self):
            raise AssertionError("a broken watcher is dropped")

    async def run():
        return [x async for x in TokenStream(_events(["data: a\n\n", "data: b\n\n"]), watch=Broken())]

    assert asyncio.run(run()) == ["data: a\n\n", "data: b\n\n"]


def _conversation():
    first = {"messages": [{"role": "user", "content": "Plan a week in the Alps. " * 4}]}
    reply = "Day one: Zermatt. " * 20
    second = {"messages": first["messages"] + [{"role": "assistant", "content": reply},
                                               {"role": "user", "content": "And day two?"}]}
    return first, reply, second


def test_geoprefix_matches_a_next_turn_past_the_reply_and_other_systems_do_not_learn_it():
    first, reply, second = _conversation()
    full = text_with_reply(first, reply)
    assert canonical_text(second).startswith(full) and len(full) > len(canonical_text(first)) + 300
    for name, learns in (("geoprefix", True), ("skylb", False), ("sglang", False)):
        p = build_policy(name)
        p.set_targets(["r0", "r1"])
        p.index.insert(canonical_text(first), "r0", 1.0)
        before = p.index.match(canonical_text(second)).get("r0", 0)
        assert p.learn_reply(full, "r0", 2.0) is learns
        assert p.learn_reply(full, "not-a-replica", 2.0) is False
        after = p.index.match(canonical_text(second)).get("r0", 0)
        assert (after > before + 300) if learns else (after == before), (name, before, after)


def test_a_learned_reply_goes_to_the_sibling_routers_as_a_hash_row():
    first, reply, _ = _conversation()
    p = build_policy("geoprefix")
    p.set_targets(["r0"])
    p.sibling_outbox = SiblingOutbox()
    assert p.learn_reply(text_with_reply(first, reply), "r0", 1.0)
    (row,) = p.sibling_outbox.take()
    assert row[0] == "d" and row[1] == "r0" and row[2] == len(text_with_reply(first, reply))
    assert b"Zermatt" not in row[3] and isinstance(row[3], bytes)  # packed block hashes only


def test_handing_a_reply_over_never_fails_the_answered_request():
    from collections import deque

    from ray_geolb.serve.ingress.replies import hand_reply

    class ClosingRouter:  # the router's loop has gone away: scheduling its publish raises
        reply_inbox = deque()

        def publish_soon_threadsafe(self):
            raise RuntimeError("Event loop is closed")

    first, reply, _ = _conversation()
    assert hand_reply(ClosingRouter(), first, reply, "r0") is False
    assert hand_reply(ClosingRouter(), {"prompt": [1, 2, 3]}, "tokens", "r0") is False  # no text to extend
    assert hand_reply(None, first, reply, "r0") is False and hand_reply(ClosingRouter(), first, None, "r0") is False


def test_the_ingress_marks_where_the_reply_a_next_turn_carries_back_lies():
    """A router that has not learned the reply yet (a sibling's) still needs to know where it lies in the next
    turn: the ingress's RouteRequest carries it (``reply_span``), in bytes of the canonical text."""
    first, reply, second = _conversation()
    cfg = IngressConfig(region="us", registry=None, model_name="m")
    ctx = parse_request(json.dumps({"model": "m", **second}).encode(), {}, "chat", cfg, origin="us", request_id="r")
    start, end = ctx.route_request().reply_span
    assert ctx.text.encode()[:end] == text_with_reply(first, reply).encode()
    assert start == len(canonical_text(first).encode())
    one = parse_request(json.dumps({"model": "m", **first}).encode(), {}, "chat", cfg, origin="us", request_id="r")
    assert one.route_request().reply_span is None
