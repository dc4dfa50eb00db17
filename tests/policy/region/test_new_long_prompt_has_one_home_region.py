"""A long prompt that no region is known to hold has one home region, the same in every region without
any message (``CostSelectorConfig.home_key_chars``, GeoPrefix): the highest rendezvous hash of the prompt's
prefix key at that depth over the regions. So a new shared context that arrives in several regions at once
is prefilled in one place, and the requests that follow find it there."""

from __future__ import annotations

import pytest

from policy_cases import P, region, rq
from ray_geolb.policy import PeerState
from ray_geolb.policy.region import GEOPREFIX_COST, GORGO_COST

REGIONS = ("us", "eu", "asia")
DEPTH = GEOPREFIX_COST.home_key_chars


def _doc(i: int) -> str:
    """A long context of its own (distinct from its first block on), longer than the key depth."""
    return f"document {i}: " + P * 5


def _router(name, cost=GEOPREFIX_COST, available=REGIONS, queue=0):
    r = region(name, remote="cost", cost=cost, targets=(f"{name}-0", f"{name}-1"))
    for peer in REGIONS:
        if peer != name:
            reps = 2 if peer in available else 0
            r.update_peer(PeerState(peer, reps, queue, 1.0, rtt_s=0.1,
                                    extra={"replicas": 2, "t_p_s": 0.001, "inflight": 0, "queued_tokens": 0.0}))
    r.set_queue(0, 0.0)
    return r


def _where(name, text, i=0, **kw):
    """Where region ``name`` sends ``text``: its own name (served here) or the peer it forwards to."""
    d = _router(name, **kw).decide(rq(i, text), 1.0)
    return name if d.kind == "local" else d.target


def test_every_region_sends_a_new_long_prompt_to_the_same_home():
    homes = set()
    for i in range(12):
        text = _doc(i) + f" question {i}"
        assert len(text.encode()) >= DEPTH
        where = {name: _where(name, text, i) for name in REGIONS}
        assert len(set(where.values())) == 1, (i, where)  # one place, decided without a message
        homes.add(where["us"])
    assert homes == set(REGIONS)  # and the homes of different contexts spread over the regions


def test_the_home_forward_is_priced_as_a_hit_and_needs_no_margin():
    text = next(_doc(i) for i in range(50) if _where("us", _doc(i), i) == "eu")
    margin = 60.0  # far more than the prefill the home's (virtual) hit saves
    r = _router("us", cost=GEOPREFIX_COST.model_copy(update={"forward_margin_s": margin}))
    d = r.decide(rq(0, text), 1.0)
    assert d.kind == "forward" and d.target == "eu" and d.reason == "cost_before_saturation"
    costs = r.selector.last_costs
    assert 0 < costs[None] - costs["eu"] < margin
    assert costs["eu"] < 0.1 + 0.01  # RTT, and no prefill: priced as if eu held the prompt
    assert r.selector.last_home == "eu"


def test_short_prompts_known_prefixes_and_other_systems_have_no_home():
    text = next(_doc(i) for i in range(50) if _where("us", _doc(i), i) == "eu")
    # shorter than the key depth: no home, stays local
    short = text[: DEPTH // 2]
    assert _where("us", short) == "us"
    # a region already holds the prefix to the key's depth (here: this region's index): the match decides
    r = _router("us")
    r.local.on_dispatch(rq(98, text + " earlier question"), "us-0", 0.5)
    r.local.on_complete("r98", "us-0", 0.9)
    d = r.decide(rq(99, text + " later question"), 1.0)
    assert d.kind == "local" and d.target == "us-0" and r.selector.last_home is None
    # GORGO's selector has no home rule
    assert _where("us", text, cost=GORGO_COST.model_copy(update={"forward_before_saturation": True})) == "us"
    # nor does GeoPrefix with the rule off
    assert _where("us", text, cost=GEOPREFIX_COST.model_copy(update={"home_key_chars": None})) == "us"


@pytest.mark.parametrize("case", ["home unavailable", "home not allowed"])
def test_no_home_forward_where_the_home_cannot_take_it(case):
    text = next(_doc(i) for i in range(50) if _where("us", _doc(i), i) == "eu")
    if case == "home unavailable":  # the registry says eu has no free replica: no other home is made up
        r = _router("us", available=("asia",))
        req = rq(0, text)
    else:  # residency: the tenant's data may not leave us and asia, so eu is never a candidate
        r = _router("us")
        req = rq(0, text, allowed_regions=frozenset({"us", "asia"}))
    d = r.decide(req, 1.0)
    assert d.kind == "local" or d.target != "eu"
    assert r.selector.last_home != "eu"


def _summary_of(name, text):
    """The prefix summary region ``name`` publishes after sending ``text`` to one of its replicas."""
    peer = region(name, remote="cost", cost=GEOPREFIX_COST, targets=(f"{name}-0", f"{name}-1"))
    peer.on_dispatch(rq(97, text), f"{name}-0", 0.5)
    return peer.heartbeat(0, 0.5, queued_tokens=0.0).prefix_summary


def test_a_conversation_follows_its_history_a_shared_preamble_does_not_stop_the_home():
    preamble = "You are a helpful assistant for the documents below. " * 20  # ~1,000 bytes
    text = next(preamble + _doc(i) for i in range(50) if _where("us", preamble + _doc(i), i) == "eu")
    # a conversation: this region served its earlier turn (the preamble), no peer holds it -> no home
    r = _router("us")
    r.local.on_dispatch(rq(96, preamble), "us-0", 0.5)
    r.local.on_complete("r96", "us-0", 0.6)
    d = r.decide(rq(0, text), 1.0)
    assert d.kind == "local" and r.selector.last_home is None
    # the same preamble is known in every region (a shared system prompt): the long rest is new -> home
    r = _router("us")
    r.local.on_dispatch(rq(96, preamble), "us-0", 0.5)
    r.local.on_complete("r96", "us-0", 0.6)
    for name in ("eu", "asia"):
        p = r.peers[name]
        p.prefix_summary = _summary_of(name, preamble)
        r.update_peer(p)
    d = r.decide(rq(1, text), 1.0)
    assert r.selector.last_home == "eu" and d.kind == "forward" and d.target == "eu"


@pytest.mark.parametrize("common_preamble", [True, False])
def test_a_peer_that_holds_the_prompts_history_outbids_the_home(common_preamble):
    history = "Earlier turns of this conversation, sent to one region only. " * 20  # ~1,200 bytes
    cost = GEOPREFIX_COST.model_copy(update={"home_needs_common_preamble": common_preamble})
    text = next(history + _doc(i) for i in range(50) if _where("us", history + _doc(i), i, cost=cost) == "eu")
    # asia served the conversation's earlier turns; neither this region (us) nor the home (eu) knows any of it
    r = _router("us", cost=cost)
    p = r.peers["asia"]
    p.prefix_summary = _summary_of("asia", history)
    r.update_peer(p)
    d = r.decide(rq(0, text), 1.0)
    if common_preamble:  # asia's match decides: no home, and eu is not priced as holding the prompt
        assert r.selector.last_home is None
        assert not (d.kind == "forward" and d.target == "eu")
    else:  # before: the home, priced as holding the whole prompt, outbid the peer holding its history
        assert r.selector.last_home == "eu" and d.kind == "forward" and d.target == "eu"
