"""Cross-region work stealing (policy/region/steal.py): the thief's offers, the victim's pick, the wire form
of an offer, and exactly-once settling -- the one exchange the simulator's LB and the Serve ingress run."""

import pytest

from policy_cases import P, fill, region, rq
from ray_geolb.policy import PeerState
from ray_geolb.policy.hold_queue import HoldQueue
from ray_geolb.policy.region import GEOPREFIX_COST
from ray_geolb.policy.region.config import StealConfig
from ray_geolb.policy.region.prefix_summary import PrefixSummary
from ray_geolb.policy.region.steal import StealOffer, StealOfferError, Thief, Victim

ON = {"enabled": True}


def _thief_region(**steal):
    return region("us", remote="cost", cost=GEOPREFIX_COST, steal={**ON, **steal})


def test_stealing_is_off_by_default_and_the_router_owns_both_sides():
    assert region("us").thief is None and region("us").victim is None
    r = _thief_region()
    assert isinstance(r.thief, Thief) and isinstance(r.victim, Victim)


def test_a_thief_offers_only_while_its_own_queue_is_empty_and_it_has_free_slots():
    r = _thief_region()
    r.update_peer(PeerState("eu", 0, 5, 1.0, rtt_s=0.1))
    wait, tp = r.steal_price()
    assert r.thief.offers(r, 1.0, free_slots=2, queue_len=1, wait_s=wait, t_p_s=tp) == []  # own clients wait
    assert r.thief.offers(r, 1.0, free_slots=0, queue_len=0, wait_s=wait, t_p_s=tp) == []  # nothing free
    offers = r.thief.offers(r, 1.0, free_slots=2, queue_len=0, wait_s=wait, t_p_s=tp)
    assert [(p, o.slots, o.thief) for p, o in offers] == [("eu", 2, "us")]
    # one offer per peer at a time: the slots it holds are never offered twice
    assert r.thief.offers(r, 1.1, free_slots=2, queue_len=0, wait_s=wait, t_p_s=tp) == []


def test_offers_go_to_fresh_peers_with_held_requests_longest_queue_first():
    r = _thief_region()
    r.update_peer(PeerState("eu", 0, 1, 1.0))
    r.update_peer(PeerState("asia", 0, 4, 1.0))
    r.update_peer(PeerState("sa", 0, 9, -10.0))  # stale (peer_stale_s 2): not offered
    r.update_peer(PeerState("au", 2, 0, 1.0))  # nothing held: not offered
    offers = r.thief.offers(r, 1.0, 3, 0, 0.0, 1e-4)
    assert [(p, o.slots) for p, o in offers] == [("asia", 3)]  # the free slots go to the longest queue first


def test_an_offer_expires_and_a_late_stolen_request_is_refused():
    r = _thief_region(offer_ttl_s=0.5)
    r.update_peer(PeerState("eu", 0, 3, 1.0))
    (peer, offer), = r.thief.offers(r, 1.0, 2, 0, 0.0, 1e-4)
    assert r.thief.take("eu", offer.offer_id, 1.2)  # live, one slot used
    assert not r.thief.take("eu", offer.offer_id + 1, 1.2)  # not this offer
    assert not r.thief.take("eu", offer.offer_id, 1.6)  # expired
    assert r.thief.counts["taken"] == 1 and r.thief.counts["refused"] == 2
    r.thief.expire(1.6)
    assert r.thief.out == {}  # expired: the peer may be offered slots again
    assert len(r.thief.offers(r, 1.7, 2, 0, 0.0, 1e-4)) == 1


def test_a_hand_over_of_a_siblings_offer_is_taken_while_this_router_has_room():
    """Several routers in a region: the offer is the region's, so a hand-over that reaches the router that did
    not make it is taken there while it has free slots (its driver passes them), else refused."""
    sibling = _thief_region()  # this router made no offer
    assert not sibling.thief.take("eu", 7, 1.0)
    assert sibling.thief.take("eu", 7, 1.0, sibling_room=2)
    assert sibling.thief.counts["taken"] == 1 and sibling.thief.counts["taken_for_a_sibling"] == 1
    assert sibling.thief.counts["refused"] == 1 and sibling.thief.out == {}  # no offer of its own was used


def test_an_answer_that_hands_nothing_closes_the_offer_and_slots_run_out():
    r = _thief_region()
    r.update_peer(PeerState("eu", 0, 3, 1.0))
    (_, o), = r.thief.offers(r, 1.0, 2, 0, 0.0, 1e-4)
    r.thief.answered("eu", o.offer_id, handed=0, queue_left=0)
    assert "eu" not in r.thief.out  # closed: its slots are free again
    r.update_peer(PeerState("eu", 0, 3, 1.05))  # (a newer heartbeat: see the next test)
    (_, o), = r.thief.offers(r, 1.1, 2, 0, 0.0, 1e-4)
    r.thief.answered("eu", o.offer_id, handed=1, queue_left=2)
    assert r.thief.take("eu", o.offer_id, 1.2) and not r.thief.take("eu", o.offer_id, 1.2)  # one handed, one taken


def test_a_peer_that_handed_nothing_gets_no_new_offer_until_its_next_heartbeat():
    r = _thief_region()
    r.update_peer(PeerState("eu", 0, 3, 1.0))
    (_, o), = r.thief.offers(r, 1.0, 2, 0, 0.0, 1e-4)
    r.thief.answered("eu", o.offer_id, handed=0, queue_left=3)  # nothing there worth moving here
    assert r.thief.offers(r, 1.1, 2, 0, 0.0, 1e-4) == []  # the same heartbeat: no offer again
    r.update_peer(PeerState("eu", 0, 3, 1.25))  # a newer heartbeat still shows a queue
    assert [p for p, _ in r.thief.offers(r, 1.3, 2, 0, 0.0, 1e-4)] == ["eu"]


def _offer(slots=4, thief="eu", wait_s=0.0, t_p_s=1e-4, summary=None, oid=7):
    return StealOffer(oid, thief, slots, wait_s, t_p_s, summary)


def test_the_victim_never_hands_over_a_request_the_thief_may_not_serve():
    v = Victim(StealConfig(**ON))
    held = [("a", rq(0, "x" * 400, allowed_regions={"us"})),  # residency excludes the thief
            ("b", rq(1, "x" * 400, hops=1)),  # already moved once: the hop limit
            ("c", rq(2, "x" * 400))]
    assert v.pick(_offer(), held, 0.1, lambda i, tok, req: 10.0, max_hops=1) == ["c"]


def test_the_victim_moves_a_request_only_when_the_thief_is_cheaper_by_the_margin():
    v = Victim(StealConfig(**ON, min_gain_s=0.5))
    held = [("a", rq(0, "x" * 4000)), ("b", rq(1, "x" * 4000))]
    # thief: RTT 0.1 + wait 0.2 + 1000 tokens x 0.1 ms = 0.4 s; here: 0.5 s (gain 0.1) and 2.0 s (gain 1.6)
    stay = {0: 0.5, 1: 2.0}
    assert v.pick(_offer(wait_s=0.2), held, 0.1, lambda i, tok, req: stay[i], max_hops=1) == ["b"]
    # None: the request may not stay here at all, so any offer is a gain
    assert v.pick(_offer(), held[:1], 0.1, lambda i, tok, req: None, max_hops=1) == ["a"]


def test_the_victim_passes_each_request_the_prompt_tokens_ahead_of_it():
    v = Victim(StealConfig(**ON))
    seen = []
    held = [(k, rq(i, "x" * 400 * (i + 1))) for i, k in enumerate("abc")]
    v.pick(_offer(slots=3), held, 0.1, lambda i, tok, req: seen.append((i, tok)) or 9.0, max_hops=1)
    assert seen == [(0, 0.0), (1, 100.0), (2, 300.0)]


def test_prefix_matches_come_first_then_the_oldest_within_the_slots_and_the_in_flight_cap():
    r = _thief_region()
    r.local.on_dispatch(rq(90, P + "tail"), "us-0", 1.0)  # the thief's replicas hold P
    summary = r.prefix_summary()
    v = Victim(StealConfig(**ON, max_in_flight=3))
    held = [("old", rq(0, "q" * 2048)), ("mid", rq(1, "r" * 2048)), ("hit", rq(2, P + "other question"))]
    pick = v.pick(_offer(slots=2, summary=summary), held, 0.1, lambda i, tok, req: 9.0, max_hops=1,
                  min_match_chars=256)
    assert pick == ["hit", "old"]
    for k in pick:
        v.sent("eu", k, 0)
    # two in flight to eu: only one more may go, however many slots the next offer has
    assert v.pick(_offer(slots=5, oid=8), held[1:2], 0.1, lambda i, tok, req: 9.0, max_hops=1) == ["mid"]


def test_exactly_once_a_refused_request_goes_back_to_its_place_and_a_taken_one_is_forgotten():
    v = Victim(StealConfig(**ON))
    q = HoldQueue(lambda req: req.prompt_tokens)
    for i in range(4):
        q.append(f"r{i}", rq(i, "x" * 400))
    picked = v.pick(_offer(slots=2), [(k, req) for k, req in q.items()], 0.1, lambda i, tok, req: 9.0, max_hops=1)
    assert picked == ["r0", "r1"]
    moved = {}
    for k in picked:  # leave the queue before being sent
        v.sent("eu", k, q.place(k))
        moved[k] = q.remove(k)
    assert list(q) == ["r2", "r3"] and v.outstanding() == 2
    assert v.settle("eu", "r0", taken=True) is None  # taken: served there, never here
    place = v.settle("eu", "r1", taken=False)  # refused: back where it stood, ahead of later arrivals
    assert q.restore("r1", moved["r1"], place) and list(q) == ["r1", "r2", "r3"]
    assert not q.restore("r1", moved["r1"], place)  # never queued twice
    assert v.outstanding() == 0 and v.in_flight == {}
    assert v.counts == {"offers_seen": 1, "handed": 2, "taken": 1, "returned": 1}


def test_an_offer_round_trips_on_the_wire_and_a_bad_one_names_its_field():
    summary = PrefixSummary.from_keys([1, 2, 3], 64, 0.0)
    o = _offer(summary=summary)
    back = StealOffer.from_wire(o.to_wire())
    assert (back.offer_id, back.thief, back.slots, back.wait_s, back.t_p_s) == (7, "eu", 4, 0.0, 1e-4)
    assert back.summary is not None and all(k in back.summary for k in (1, 2, 3))
    good = o.to_wire()
    for bad, field in (({**good, "slots": 0}, "offer.slots"), ({**good, "slots": True}, "offer.slots"),
                       ({**good, "wait_s": float("nan")}, "offer.wait_s"), ({**good, "t_p_s": -1}, "offer.t_p_s"),
                       ({**good, "offer_id": "7"}, "offer.offer_id"), ({**good, "thief": ""}, "offer.thief"),
                       ({**good, "summary": {"bits": 3}}, "offer.summary"), ({**good, "extra": 1}, "offer"),
                       ([1, 2], "offer")):
        with pytest.raises(StealOfferError) as e:
            StealOffer.from_wire(bad)
        assert e.value.field == field and field in str(e.value) or field == "offer"


def test_a_thief_prices_its_offer_from_its_engines_queue():
    r = _thief_region()
    wait0, tp = r.steal_price()
    assert wait0 == 0.0 and tp > 0
    fill(r)  # both replicas report a waiting request
    wait1, _ = r.steal_price()
    assert wait1 > wait0
