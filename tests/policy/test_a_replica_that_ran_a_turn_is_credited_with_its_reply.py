"""A chat's next turn carries the reply its previous turn got back to the router. The replica that ran that turn
decoded the reply after it and cached it, so GeoPrefix credits a replica its index knows holds the whole
previous turn with the reply too (``canonical.reply_span``, ``matching.through_reply``). That is what a sibling
router needs: it heard of the turn's dispatch, but the reply the serving router learned at completion has not
reached it yet. The systems modelled on other routers match only what they sent."""

import pytest

from policy_cases import rq
from ray_geolb.policy import ReplicaStats, build_policy
from ray_geolb.policy.canonical import PromptFormatError, canonical_text, reply_span, text_with_reply
from ray_geolb.policy.matching import through_reply
from ray_geolb.policy.prefix_index import PrefixIndex


def _turns(first_chars=100, reply_chars=600):
    first = {"messages": [{"role": "user", "content": ("Plan a week in the Alps. " * 40)[:first_chars]}]}
    reply = ("Day one: Zermatt, the Gornergrat. " * 40)[:reply_chars]
    second = {"messages": first["messages"] + [{"role": "assistant", "content": reply},
                                               {"role": "user", "content": "And day two?"}]}
    return first, reply, second


def test_the_span_is_the_last_reply_a_chat_carries_back_in_bytes():
    first, reply, second = _turns()
    start, end = reply_span(second)
    text = canonical_text(second).encode()
    assert start == len(canonical_text(first).encode())
    assert text[:end] == text_with_reply(first, reply).encode()
    # bytes, not characters: the unit of a prefix index's match
    umlaut = {"messages": [{"role": "user", "content": "Grüezi " * 10}, {"role": "assistant", "content": "ä" * 9},
                           {"role": "user", "content": "ok"}]}
    s, e = reply_span(umlaut)
    assert canonical_text(umlaut).encode()[s:e] == "<|assistant|>\nääääääääää\n".replace("ä", "", 1).encode()
    # tools come first in the canonical text, so they move the span
    tools = {**second, "tools": [{"type": "function", "function": {"name": "weather"}}]}
    assert reply_span(tools)[0] == start + len(canonical_text(tools)) - len(canonical_text(second))
    # the caller's canonical text gives the same span (only the messages from the reply on are read again)
    for chat in (second, umlaut, tools):
        assert reply_span(chat, canonical_text(chat)) == reply_span(chat)
    # the last reply, when several
    third = {"messages": second["messages"] + [{"role": "assistant", "content": "Saas-Fee."},
                                               {"role": "user", "content": "Day three?"}]}
    assert reply_span(third)[0] == len(canonical_text({"messages": third["messages"][:3]}).encode())


@pytest.mark.parametrize("request_", [
    "a plain prompt", b"bytes", {"prompt": "a completion"}, {"messages": [{"role": "user", "content": "hi"}]},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a prefill to continue"}]},
])
def test_no_span_where_no_reply_comes_back(request_):
    assert reply_span(request_) is None


def test_a_malformed_chat_is_named_as_canonical_text_names_it():
    with pytest.raises(PromptFormatError, match="role"):
        reply_span({"messages": [{"content": "no role"}, {"role": "assistant", "content": "x"},
                                 {"role": "user", "content": "y"}]})


def test_only_a_match_that_covers_the_whole_previous_turn_is_raised():
    index = PrefixIndex(block_chars=64, growth=0.0)
    first, reply, second = _turns(first_chars=300)
    prepared = index.prepare(canonical_text(second))
    start, end = span = reply_span(second)
    last_block = max(e for e in prepared.ends if e <= start)
    match = {"ran-it": last_block, "shares-a-preamble": last_block - 64, "learned-the-reply": end + 64}
    assert through_reply(dict(match), prepared, span) == {"ran-it": end, "shares-a-preamble": last_block - 64,
                                                          "learned-the-reply": end + 64}
    assert through_reply(dict(match), prepared, None) == match
    # a previous turn shorter than one block says nothing: every replica would "cover" it
    tiny = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply},
                         {"role": "user", "content": "more"}]}
    assert through_reply({"a": 0}, index.prepare(canonical_text(tiny)), reply_span(tiny)) == {"a": 0}


def _sibling_heard_first_turn(name, **config):
    """A router that heard of a sibling's dispatch of a short first turn to r0, and has one request of its own in
    flight there: where does the conversation's next turn go?"""
    first, _, second = _turns()
    assert len(canonical_text(first)) < 256  # shorter than GeoPrefix's min_match_chars alone
    p = build_policy({"name": name, **config}, targets=["r0", "r1"])
    for t in ("r0", "r1"):
        p.on_stats(t, ReplicaStats(max_num_seqs=64, timestamp=0.0))
    p.learn_sibling_dispatch(rq(1, canonical_text(first)), "r0", 1.0)
    p.on_dispatch(rq(2, "an unrelated request " * 20), "r0", 1.5)
    nxt = rq(3, canonical_text(second), reply_span=reply_span(second))
    return p.choose(nxt, 2.0).target


def test_geoprefix_sends_the_next_turn_where_a_sibling_sent_the_last_one():
    assert _sibling_heard_first_turn("geoprefix") == "r0"
    # without the inference the short turn is no match, and the load decides
    assert _sibling_heard_first_turn("geoprefix", infer_replies=False) == "r1"
    assert _sibling_heard_first_turn("gorgo") == "r1"  # a system modelled on another router: what it sent only
