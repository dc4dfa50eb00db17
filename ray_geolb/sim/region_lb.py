"""One simulated load balancer: :class:`RegionLB`, a region's LB (or a central one) in virtual time.

It is the simulator's driver of the region layer, as the Serve ingress is Serve's: a
:class:`~ray_geolb.policy.region.router.RegionRouter` around a local policy, an FCFS
:class:`~ray_geolb.policy.hold_queue.HoldQueue`, and the region layer's one queue rule
(:class:`~ray_geolb.policy.region.queue_rule.QueueRule`: go / wait / refuse), which the ingress's
``AdmissionQueue`` runs too. A per-region LB is deployed as the ingress (``DeploymentSpec.settings``:
``max_queue``, ``max_wait_s``, ``forward_past_queue``); a central LB keeps a strict, unbounded FCFS queue.

Its methods handle the LB's events (``sim/events.py``: the event's ``a`` is the LB): a request arriving,
its wait limit, a completion seen by the LB, a replica report delivered, a heartbeat tick (the message
is :func:`~ray_geolb.policy.region.heartbeat.heartbeat_message`, as Serve's ``PeerMesh.heartbeat``) and
RTT probes. The simulator (``sim`` below) owns the clock, the event heap, the replicas, the registry and
the clients; the LB reaches them through ``sim.now``, ``sim.push``, ``sim.one_way``, ``sim.count``,
``sim.refuse`` (a refusal: the client retries) and ``sim.reject`` (a rejection: its program goes on).

A region may have several LBs (``DeploymentSpec.ingress_replicas``: its ingress replicas' routers): each
has a share of the local replicas' headroom; whatever reaches the region (``sim.lb_of``: a client's request,
a peer's forward, a steal offer or hand-over) reaches one of them. With ``sibling_inserts_s`` they learn
each other's dispatches and forwards through ``sim.sibling_logs``; with ``sibling_headroom`` they lend each
other unused slots (docs/design.md section 8).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Protocol

from ray_geolb.policy.hold_queue import HoldQueue
from ray_geolb.policy.region.heartbeat import heartbeat_message
from ray_geolb.policy.region.peer_table import peer_states_from_table
from ray_geolb.policy.region.prefix_summary import SummarySendRule
from ray_geolb.policy.region.queue_rule import GO, REFUSE, QueueRule, Verdict
from ray_geolb.policy.region.registry_state import registry_leg
from ray_geolb.policy.region.router import RegionDecision, RegionRouter
from ray_geolb.policy.region.sibling_inserts import SiblingOutbox, learn_rows, take_rows

from .events import (
    HEARTBEAT,
    LB_ARRIVE,
    LB_TIMEOUT,
    PING_REPLY,
    REG_ARRIVE,
    REG_REPLY,
    REP_ARRIVE,
    RTT_PROBE,
    STEAL_ANSWER,
    STEAL_ARRIVE,
    STEAL_OFFER,
    STEAL_SETTLE,
)

__all__ = ["LBDriver", "RegionLB"]


class LBDriver(Protocol):
    """What a :class:`RegionLB` needs from the simulation that drives it (``sim/simulator.py``'s
    ``Simulator``): the virtual clock and event heap, the network's one-way delays, the counters and the
    region layer's settings, the other LBs and the replicas, and where a refused or rejected request
    goes. Written here so the LB does not import the simulator (no import circle)."""

    now: float
    settings: Any
    c: Dict[str, Any]
    trace: Any
    lbs: Dict[str, "RegionLB"]
    region_lbs: Dict[str, List["RegionLB"]]
    #: region -> its routers' prefix inserts in order, (visible at, router, request, target or peer region,
    #: forward?); empty unless they share them (DeploymentSpec.sibling_inserts_s)
    sibling_logs: Dict[str, list]
    dep: Any
    replicas: Dict[str, Any]
    registry_region: Optional[str]
    registries: Dict[str, Any]
    #: region outages and partitions (``sim/faults.py``'s ``FaultModel``), or None
    faults: Any

    def push(self, t: float, kind: int, a=None, b=None) -> None: ...

    def one_way(self, a: str, b: str) -> float: ...

    def count(self, key: str) -> None: ...

    def refuse(self, req, reason: str) -> None: ...

    def reject(self, req, reason: str) -> None: ...

    def lb_of(self, region: str) -> "RegionLB": ...


def _prompt_tokens(req) -> int:
    return req.prompt


class RegionLB:
    """One LB of a simulation (see the module docstring). ``ingress``: deployed as the Serve ingress
    (per-region and region-local LBs); False: a central LB."""

    __slots__ = ("sim", "name", "region", "router", "queue", "peers", "policy", "ingress", "rule", "reg_delay",
                 "summary_rule", "thief", "victim", "down", "log_pos", "sibling_cursor")

    def __init__(self, sim: LBDriver, name: str, region: str, router: RegionRouter, ingress: bool = False):
        self.sim = sim
        self.name = name
        self.region = region
        self.router: RegionRouter = router
        self.policy = router.local
        self.queue: HoldQueue = HoldQueue(_prompt_tokens)  # FCFS, by request id, with the prompt-token sum
        self.peers: List["RegionLB"] = []
        self.ingress = ingress
        st = sim.settings
        #: go / wait / refuse: the ingress's bounds, or a central LB's strict, unbounded FCFS
        self.rule = QueueRule(st.max_queue, st.max_wait_s, st.forward_past_queue) if ingress else \
            QueueRule(forward_past_queue=False)
        #: per registry region, half its last round trip there: the one-way delay the heartbeats to that
        #: registry declare (RegistryClient.delay_s)
        self.reg_delay: Dict[str, float] = {}
        #: which of its heartbeats carry its prefix summary (Serve: PeerMesh.heartbeat, the same rule)
        self.summary_rule = SummarySendRule()
        #: cross-region work stealing (TwoLayerConfig.steal; policy/region/steal.py): the router's, per-region LBs only
        self.thief = router.thief if ingress else None
        self.victim = router.victim if ingress else None
        #: in a region outage (sim/faults.py)
        self.down = False
        #: how far it has read its region's shared log of sibling inserts (``sim.sibling_logs``)
        self.log_pos = 0
        #: the registry's cursor of its siblings' rows (``share_sibling_inserts``; Serve: SiblingChannel.cursor)
        self.sibling_cursor = None
        if ingress and sim.dep.share_sibling_inserts and sim.dep.ingress_replicas > 1:  # as Serve's SiblingChannel
            router.sibling_outbox, self.policy.sibling_outbox = SiblingOutbox(), SiblingOutbox()

    # ------------------------------------------------------------------ the queue
    def on_arrive(self, req) -> None:
        """A request reaches this LB. As the ingress (``AdmissionQueue.admit``): the head is decided first,
        then the newcomer, with every waiting request ahead of it; the rule says go, wait or refuse. A
        central LB (and ``forward_past_queue`` off, behind waiting requests): it joins without a decision."""
        req.t_lb = self.sim.now
        q = self.queue
        if not self.ingress:  # a central LB: strict FCFS, unbounded
            q.append(req.rid, req)
            self.pump()
            return
        rule = self.rule
        if not rule.decides_newcomer(len(q)):
            self._enqueue(req, rule.admit(None, len(q)))
            self.pump()
            return
        self.pump()  # the head first (Serve re-decides it every poll_s)
        d = self._decide(req, len(q), q.tokens)
        v = rule.admit(d, len(q))
        if v.action == GO:
            self._apply(req, d)
        else:
            self._enqueue(req, v)

    def _decide(self, req, ahead: int, ahead_tokens: int) -> RegionDecision:
        """The region layer's decision for ``req`` with ``ahead`` requests (``ahead_tokens`` prompt tokens)
        waiting before it here -- the cost selector's ``Q_lb`` and the slot wait's ``ahead``."""
        router = self.router
        now = self.sim.now
        log = self.sim.sibling_logs.get(self.region)
        if log is not None:
            self._learn_from_siblings(log, now)
        if not self.policy.tracker.available and self.sim.dep.sibling_headroom:
            self._borrow_from_siblings()
        router.set_queue(ahead, float(ahead_tokens))
        return router.decide(req.rreq, now)

    def _borrow_from_siblings(self) -> None:
        """One load view per region, its upper bound (``DeploymentSpec.sibling_headroom``): with no free local
        slot, take one unused slot of each local replica that a sibling router still holds."""
        mine = self.policy.tracker
        for sib in self.sim.region_lbs[self.region]:
            if sib is not self:
                theirs = sib.policy.tracker
                for target in list(theirs.available):
                    if target not in mine.available and theirs.lend_slot(target, mine):
                        self.sim.count("slot_borrowed_from_a_sibling_router")

    def _tell_siblings(self, req, target: str, forward: bool) -> None:
        """With shared inserts (``sibling_inserts_s``): this router's dispatch to ``target`` (or forward to that
        region) reaches its siblings that much later, through the region's log."""
        sim = self.sim
        log = sim.sibling_logs.get(self.region)
        if log is not None:
            log.append((sim.now + sim.dep.sibling_inserts_s, self, req.rreq, target, forward))

    def _learn_from_siblings(self, log: list, now: float) -> None:
        """Several routers per region sharing one affinity view (``DeploymentSpec.sibling_inserts_s``): the
        inserts the siblings made that have reached this router by ``now`` go into its prefix index (a local
        dispatch) or its regional snapshot (a forward); read before each decision, so the same as applying
        each when it arrives."""
        i, policy, router = self.log_pos, self.policy, self.router
        while i < len(log) and log[i][0] <= now:
            t, origin, rreq, target, forward = log[i]
            if origin is not self:
                if forward:  # a forward: the regional snapshot (which region it went to)
                    router.learn_sibling_forward(rreq, target, t)
                else:
                    policy.learn_sibling_dispatch(rreq, target, t)
            i += 1
        self.log_pos = i

    def _enqueue(self, req, v: Verdict) -> None:
        """``req`` waits here (FCFS) or, refused by the rule (the ingress's 429), goes back to its client."""
        sim = self.sim
        if v.action == REFUSE:
            sim.refuse(req, v.reason)
            return
        self.queue.append(req.rid, req)
        self._held(req, v.reason)
        limit = self.rule.wait_limit()
        if limit is not None:  # the ingress's wait limit (its 503)
            sim.push(sim.now + limit, LB_TIMEOUT, self, (req, req.t_lb))

    def _held(self, req, reason: str) -> None:
        sim = self.sim
        if sim.trace is not None:
            sim.trace("hold", {"lb": self.name, "req": req.rid, "t": sim.now, "reason": reason})
        if not req.held:
            req.held = True
            sim.c["lb_holds"] += 1

    def pump(self, everyone: bool = False) -> None:
        """Decide the head of the queue (nothing ahead of it) until one waits. ``everyone`` (a new peer
        table: Serve's ``kick_all``): then the other waiting requests too, each with the requests still
        ahead of it; the rule lets them go to a peer (or be rejected), not take a local slot."""
        q = self.queue
        if not q:
            return
        rule = self.rule
        while q:
            rid, req = q.head()
            d = self._decide(req, 0, 0)
            v = rule.again(d, True)
            if v.action != GO:
                self._held(req, v.reason)
                break
            q.pop_head()
            self._apply(req, d)
        if everyone and len(q) > 1 and rule.forward_past_queue and self.router.available_peers(self.sim.now):
            # (no peer available: nothing behind the head can change from hold to forward)
            ahead = ahead_tokens = 0
            for i, (rid, req) in enumerate(list(q.items())):
                if i > 0:
                    d = self._decide(req, ahead, ahead_tokens)
                    if rule.again(d, False).action == GO:
                        q.remove(rid)
                        self._apply(req, d)
                        continue
                ahead += 1
                ahead_tokens += req.prompt

    def _apply(self, req, d: RegionDecision) -> None:
        """Carry out a local / forward / reject decision for ``req`` (no longer in the queue)."""
        sim = self.sim
        now = sim.now
        router = self.router
        trace = sim.trace
        kind = d.kind
        req.lb_wait += now - req.t_lb
        if kind == "local":
            rep = sim.replicas[d.target]
            if trace is not None:
                trace("local", {"lb": self.name, "req": req.rid, "t": now, "target": d.target,
                                "policy": self.policy, "hops": req.rreq.hops})
            router.on_dispatch(req.rreq, d.target, now)
            self._tell_siblings(req, d.target, False)
            sim.count(f"local:{d.reason or 'local'}")
            if sim.faults is not None and not sim.faults.reaches(self.region, rep.region):
                sim.faults.call_failed(self, req, rep)  # a replica down or across a cut: nothing reaches it
                return
            req.serve_lb = self
            req.replica = rep
            req.t_disp = now
            delay = sim.one_way(self.region, rep.region)
            req.path += delay
            if rep.region != req.region:
                req.cross = True
            sim.push(now + delay, REP_ARRIVE, rep, req)
        elif kind == "forward":
            peer = sim.lb_of(d.target)  # one of the peer region's routers
            if trace is not None:
                trace("forward", {"lb": self.name, "req": req.rid, "t": now, "target": d.target,
                                  "local_available": len(self.policy.tracker.available),
                                  "ahead": router.queue_len, "queued": len(self.queue)})
            router.on_forward(req.rreq, d.target, now)
            self._tell_siblings(req, d.target, True)
            if sim.settings.note_forwards:  # one more in the peer's queue until its next heartbeat
                router.note_forward(d.target)
            sim.c["forwards"] += 1
            sim.count(f"forward:{d.reason}")
            if sim.faults is not None and (peer.down or not sim.faults.reaches(self.region, peer.region)):
                sim.faults.call_failed(self, req, peer)  # the peer down or across a cut: nothing reaches it
                return
            req.rreq.hops += 1
            req.cross = True
            delay = sim.one_way(self.region, peer.region)
            req.path += delay
            req.lb = peer
            sim.push(now + delay, LB_ARRIVE, peer, req)
        else:  # reject
            sim.reject(req, d.reason)

    def on_timeout(self, item) -> None:
        """The ingress's wait limit: a request still waiting here ``max_wait_s`` after it arrived is refused."""
        req, t_lb = item
        q = self.queue
        if req.rid not in q or q[req.rid] is not req or req.t_lb != t_lb:
            return  # it left the queue (served, forwarded, refused)
        sim = self.sim
        v = self.rule.timed_out(t_lb + self.rule.wait_limit() - sim.now)  # this event is at that deadline
        if v.action != REFUSE:
            return
        was_head = q.is_head(req.rid)
        q.remove(req.rid)
        req.lb_wait += sim.now - req.t_lb
        sim.refuse(req, v.reason)
        if was_head:
            self.pump()

    # ------------------------------------------------------------------ what the LB hears
    def on_first_token(self, req) -> None:
        """A request this LB dispatched produced its first token (now, at the engine): its TTFT since
        dispatch as this LB sees it (one replica->LB delay later) calibrates the region layer's TTFT-SLO
        guard, as a stream's first token does at the Serve ingress."""
        sim = self.sim
        t = sim.now + sim.one_way(req.replica.region, self.region)
        self.router.observe_local_ttft(req.rid, t - req.t_disp, req.t_disp - req.t_lb)

    def on_done(self, req) -> None:
        """A request this LB dispatched completed (seen one replica->LB delay after the engine finished)."""
        sim = self.sim
        # TTFT as this LB sees it: the first token reaches it one replica->LB delay after the engine
        # produced it; minus when it dispatched the request (feeds the online t_p regression)
        ttft = None
        if req.t_first is not None:
            ttft = req.t_first + sim.one_way(req.replica.region, self.region) - req.t_disp
        self.policy.on_complete(req.rid, req.replica.id, sim.now, ok=True, req=req.rreq)
        if req.reply_text is not None:  # the reply the engine cached, as the Serve ingress hands it to its router
            self.policy.learn_reply(req.reply_text, req.replica.id, sim.now)
        if ttft is not None and req.eng_uncached is not None:
            # as in Serve, where the replicas report (tokens the engine prefilled, TTFT): the router's own
            # estimate at dispatch misses what the replica cached without it (the replies of earlier turns)
            self.policy.observe_ttft(req.replica.id, req.eng_uncached, ttft)
        self.router.on_local_complete(sim.now)  # the 'cost' selector's local drain rate (stay_slot_wait)
        self.pump()
        self.offer_slots()

    def on_stats(self, item) -> None:
        """A replica's report reaches this LB."""
        rid, st = item
        self.policy.on_stats(rid, st)
        sim = self.sim
        if sim.trace is not None:
            sim.trace("stats", {"lb": self.name, "target": rid, "t": sim.now, "stats": st})
        self.pump()

    # ------------------------------------------------------------------ work stealing (policy/region/steal.py)
    def offer_slots(self) -> None:
        """As a thief: offer this LB's free local slots to the peers whose table shows held requests (after
        each peer table and each local completion; nothing while its own requests wait)."""
        thief = self.thief
        if thief is None:
            return
        sim = self.sim
        router = self.router
        offers = thief.offers(router, sim.now, len(self.policy.tracker.available), len(self.queue),
                              *router.steal_price())
        c = sim.c
        for peer, offer in offers:
            size = len(json.dumps(offer.to_wire(), separators=(",", ":")))  # its wire size, as Serve sends it
            c["steal_offers"] = c.get("steal_offers", 0) + 1
            c["steal_offer_bytes"] = c.get("steal_offer_bytes", 0) + size
            c["steal_offer_bytes_max"] = max(c.get("steal_offer_bytes_max", 0), size)
            victim_lb = sim.lb_of(peer)  # a call to the peer's ingress reaches one of its routers
            sim.push(sim.now + sim.one_way(self.region, victim_lb.region), STEAL_OFFER, victim_lb, (self, offer))

    def on_steal_offer(self, item) -> None:
        """As a victim: a peer's offer arrives. The picked requests leave the queue first, then travel to
        the thief (``hops`` + 1, like a forward); the answer tells the thief how many and what is left."""
        thief_lb, offer = item
        sim = self.sim
        now = sim.now
        q = self.queue
        victim = self.victim
        keys = []
        if victim is not None and q:
            router = self.router
            keys = victim.pick(offer, ((rid, r.rreq) for rid, r in q.items()), router.steal_rtt(offer.thief),
                               self._stay_cost(now),
                               router.config.max_hops, router.chars_per_token(), router.min_match_chars())
        delay = sim.one_way(self.region, thief_lb.region)
        for rid in keys:
            place = q.place(rid)
            req = q.remove(rid)
            victim.sent(offer.thief, rid, (place, req.rreq.hops, req.cross, req.path))
            req.lb_wait += now - req.t_lb
            req.rreq.hops += 1
            req.cross = True
            req.path += delay
            # each hand-over is a call to the thief region's ingress: it reaches one of its routers, maybe not the
            # one that made the offer (which then refuses it); the answer is the offer call's reply, to the offerer
            to = req.lb = sim.lb_of(thief_lb.region)
            sim.c["steals_handed"] = sim.c.get("steals_handed", 0) + 1
            sim.push(now + delay, STEAL_ARRIVE, to, (self, offer.offer_id, req, thief_lb))
        sim.push(now + delay, STEAL_ANSWER, thief_lb, (self.region, offer.offer_id, len(keys), len(q)))
        if keys:
            self.pump()

    def _stay_cost(self, now: float):
        """``stay_cost_s(i, tokens, req)`` for :meth:`Victim.pick`: the request's expected TTFT here with
        ``i`` held requests (``tokens`` prompt tokens) ahead of it (the 'cost' selector's stay price)."""
        router = self.router

        def cost(i: int, tokens: float, req):
            router.set_queue(i, tokens)
            return router.stay_cost(req, now)
        return cost

    def on_steal_answer(self, item) -> None:
        """As a thief: the victim's answer to an offer (how many it handed over, how many it still holds)."""
        victim_region, offer_id, handed, left = item
        self.thief.answered(victim_region, offer_id, handed, left)
        if not handed:
            self.offer_slots()

    def on_stolen(self, item) -> None:
        """As a thief: a stolen request arrives. Taken: decided like a forwarded request (it can move no
        further); refused (its offer expired or used): it goes back to its victim with the answer."""
        victim_lb, offer_id, req, offerer = item
        sim = self.sim
        room = 0
        if offerer is not self and sim.dep.region_wide_offers and not self.queue:  # as Serve: the region's offer
            room = len(self.policy.tracker.available)
        taken = self.thief is not None and self.thief.take(victim_lb.region, offer_id, sim.now, sibling_room=room)
        if offerer is not self:  # a sibling router's offer (several per region)
            sim.count("steal_taken_at_a_sibling_router" if taken else "steal_refused_at_a_sibling_router")
        back = sim.one_way(self.region, victim_lb.region)
        sim.push(sim.now + back, STEAL_SETTLE, victim_lb, (self.region, req, taken))
        if taken:
            sim.c["steals_taken"] = sim.c.get("steals_taken", 0) + 1
            self.on_arrive(req)
        else:
            sim.c["steals_refused"] = sim.c.get("steals_refused", 0) + 1

    def on_steal_settle(self, item) -> None:
        """As a victim: the thief's answer for one handed request; a refused one is put back at its place."""
        thief_region, req, taken = item
        st = self.victim.settle(thief_region, req.rid, taken)
        if taken or st is None:
            return
        place, hops, cross, path = st
        req.rreq.hops, req.cross, req.path = hops, cross, path
        req.lb = self
        sim = self.sim
        req.t_lb = sim.now
        self.queue.restore(req.rid, req, place)
        limit = self.rule.wait_limit()
        if limit is not None:  # its wait limit starts again here (as for any request that reaches this LB)
            sim.push(sim.now + limit, LB_TIMEOUT, self, (req, req.t_lb))
        self.pump()

    # ------------------------------------------------------------------ registry link and RTT probes
    def on_heartbeat(self, _b=None) -> None:
        """One tick of the LB's registry link (Serve: ``RegistryClient.tick``): its heartbeat -- the
        figures ``RequestPath.local_report`` sends, and its measured RTTs -- travels to the registry
        (``on_reg_arrive``), which answers with the peer table; the next tick is one
        period after this one began, or when the primary registry's answer arrives if that is later. With
        standby registries the same heartbeat goes to each (``on_reg_reply`` applies every table)."""
        sim = self.sim
        now = sim.now
        c = sim.c
        c["heartbeats"] += 1
        router = self.router
        ps = router.heartbeat(len(self.queue), now, queued_tokens=float(self.queue.tokens))
        rtts = router.measured_rtts()
        summary = self.summary_rule.wire(ps.prefix_summary, now)  # as PeerMesh.heartbeat
        primary = sim.registry_region
        hb = heartbeat_message(self.region, self.name, ps.available_replicas, ps.queue_len, rtts,
                               extra=ps.extra, prefix_summary=summary, delay_s=self.reg_delay.get(primary))
        if summary is not None:
            size = len(json.dumps(summary, separators=(",", ":")))
            c["prefix_summaries"] = c.get("prefix_summaries", 0) + 1
            c["prefix_summary_bytes"] = c.get("prefix_summary_bytes", 0) + size
            c["prefix_summary_bytes_max"] = max(c.get("prefix_summary_bytes_max", 0), size)
        if router.sibling_outbox is not None:  # several routers sharing inserts (share_sibling_inserts)
            hb.update(sibling_cursor=self.sibling_cursor,
                      sibling_inserts=take_rows(router.sibling_outbox, self.policy.sibling_outbox))
        for where in sim.registries:  # the primary, then any standbys: one heartbeat, sent to each
            msg = hb
            if where != primary:  # with the one-way delay to that registry, and what the primary alone reads
                msg = {k: v for k, v in hb.items() if k not in ("delay_s", "sibling_cursor", "sibling_inserts")}
                if where in self.reg_delay:
                    msg["delay_s"] = self.reg_delay[where]
            sim.push(now + sim.one_way(self.region, where), REG_ARRIVE, self, (msg, now, where))

    def on_reg_arrive(self, item) -> None:
        """The heartbeat reaches a registry (item: heartbeat, tick time, the registry's region), which
        applies it (a prefix summary in it replaces the region's last one) and answers with the peer table
        (its ``prefix_summaries`` included), on the same legs and delays as the heartbeat."""
        sim = self.sim
        hb, t0, where = item
        table = sim.registries[where].heartbeat_batch([hb])
        if "errors" in table:
            raise RuntimeError(f"registry refused {self.name}'s heartbeat: {table['errors']}")
        sim.push(sim.now + sim.one_way(where, self.region), REG_REPLY, self, (table, t0, where))

    def on_reg_reply(self, item) -> None:
        """A peer table reaches the LB (Serve: ``PeerMesh._on_table``): every peer's state, its age as
        the registry saw it, the RTT this region measured to it (else the peer's), its prefix summary if
        the registry holds one -- a state older than the one the router holds (from another registry) is
        ignored; then every waiting request is decided again (``kick_all``). The primary's reply paces
        the next tick."""
        sim = self.sim
        table, t0, where = item
        now = sim.now
        router = self.router
        delay = self.reg_delay[where] = registry_leg(now - t0)  # as RegistryClient.tick
        for ps in peer_states_from_table(table, now - delay, self.region):
            if ps.region in router.peers:
                router.update_peer(ps)
        if sim.faults is not None:  # a peer whose forward failed stays unavailable while its circuit is open
            sim.faults.open_circuits(self)
        if sim.trace is not None:
            sim.trace("peers", {"lb": self.name, "t": now, "peers": {r: (p.available_replicas, p.queue_len, p.timestamp)
                                                                     for r, p in router.peers.items()}})
        self.pump(everyone=True)
        self.offer_slots()
        reply = (table.get("sibling_inserts") or {}).get(self.name)
        if reply is not None and where == sim.registry_region:
            self.sibling_cursor = reply["cursor"]
            learned, unusable = learn_rows(reply["rows"], router, now)
            sim.c["sibling_rows_learned"] = sim.c.get("sibling_rows_learned", 0) + learned
            sim.c["sibling_rows_unusable"] = sim.c.get("sibling_rows_unusable", 0) + unusable
        if where == sim.registry_region:
            sim.push(max(t0 + sim.settings.heartbeat_period_s, now), HEARTBEAT, self)

    def on_rtt_probe(self, idx: int) -> None:
        """RTT probes (Serve: ``PeerMesh._probe_loop``): each peer pinged in turn, the sample fed to
        ``RegionRouter.observe_rtt`` when the reply is back, then a pause of ``rtt_probe_period_s``."""
        sim = self.sim
        peer = self.peers[idx]
        sim.push(sim.now + 2.0 * sim.one_way(self.region, peer.region), PING_REPLY, self, (peer.region, sim.now, idx))

    def on_ping_reply(self, item) -> None:
        region, sent, idx = item
        self.router.observe_rtt(region, self.sim.now - sent)
        self.next_probe(idx)

    def next_probe(self, idx: int) -> None:
        """After the probe of peer ``idx`` (answered, or lost to a fault): the next peer, or the pause."""
        sim = self.sim
        if idx + 1 < len(self.peers):
            self.on_rtt_probe(idx + 1)
        else:
            sim.push(sim.now + sim.settings.rtt_probe_period_s, RTT_PROBE, self, 0)
