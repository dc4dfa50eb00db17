"""``remote="cost"``: the TTFT-cost peer selector of GORGO and GeoPrefix (:class:`CostSelector`).

When the local layer has no available replica (and, with ``forward_before_saturation``, also when it
has one) this selector prices, per request, the expected TTFT of staying in this region's queue
against forwarding to each available peer (RTT + residual prefill at the peer's match + its queue),
and picks the cheapest. ``GORGO_COST`` and ``GEOPREFIX_COST`` (``region/config.py``) are its two
presets. The formulas, each term's source and why it is there: ``docs/design.md`` section 7.
"""

from __future__ import annotations

import math
import zlib
from bisect import bisect_left
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from ..matching import discounted_hits, through_reply
from ..ttft_model import TtftModel
from .config import CostSelectorConfig
from .estimators import DrainRate, RttTable
from .peer_selector import PeerSelector, Selection
from .slo_guard import SloGuard

__all__ = ["CostSelector"]


class CostSelector(PeerSelector):
    """TTFT-cost choice among staying and the available peers (see the module docstring).

    Besides ``select`` it keeps state the router feeds: the forwards sent to each peer since its
    heartbeat (``on_forward``) and the local drain rate (``on_local_complete``). ``rtt`` is the
    router's RTT table when the router built it (read through ``router.measured_rtt``; the router
    alone feeds and forgets it), None for a stand-alone selector."""

    def __init__(self, config: Optional[CostSelectorConfig] = None, rtt: Optional[RttTable] = None,
                 ttft_slo_s: Optional[float] = None):
        if isinstance(config, dict):
            config = CostSelectorConfig.model_validate(config)
        self.config = config or CostSelectorConfig()
        self.rtt = rtt
        self.ttft = TtftModel(self.config.ttft)  # used when the local policy has no TTFT model
        self._fwd: Dict[str, Deque[Tuple[float, int]]] = {}
        self.drain = DrainRate(self.config.drain_window_s, self.config.drain_min_samples)
        self.last_costs: Dict[Optional[str], float] = {}
        self.last_rtts: Dict[str, float] = {}  # the RTTs the last peer comparison used
        self.last_inflight: Dict[str, float] = {}  # the peers' in-flight per replica it priced (w_shared)
        self.last_slot_wait_s = 0.0  # the slot-wait term (before q̂) of the last stay cost
        self.last_own_stay_s = 0.0  # the last stay's own TTFT part: queue ahead per replica + residual prefill
        self._engaged: set = set()  # peers forwarded to before saturation (forward_before_saturation's hysteresis)
        self.presaturation_forwards = 0
        self.last_home: Optional[str] = None  # the home peer of the last priced request (home_key_chars)
        #: the TTFT-SLO guard on forwards before saturation (``TwoLayerConfig.ttft_slo_s``), None: off
        self.slo_guard: Optional[SloGuard] = (SloGuard(ttft_slo_s) if ttft_slo_s is not None
                                              and self.config.forward_before_saturation else None)

    # ------------------------------------------------------------ inputs
    def on_forward(self, req, region: str, now: float) -> None:
        q = self._fwd.get(region)
        if q is None:
            q = self._fwd[region] = deque(maxlen=4096)
        q.append((now, req.prompt_tokens))

    def on_local_complete(self, now: float) -> None:
        """A request this LB dispatched to a local replica left it (the drain-rate estimate)."""
        self.drain.observe(now)

    def forget(self, region: str) -> None:
        self._fwd.pop(region, None)
        self._engaged.discard(region)

    # ------------------------------------------------------------ estimates
    def local_t_p(self, router) -> float:
        tp = router.local.region_t_p()  # the local policy's pooled t_p, its floor applied
        return float(tp) if tp is not None else self.ttft.t_p()

    def _mean_prompt(self, router, req) -> float:
        m = router.local.mean_prompt_tokens
        return float(m) if m else float(req.prompt_tokens)

    def rtt_of(self, router, region: str) -> float:
        """The router's measured RTT (EWMA), else the heartbeat's, else ``unknown_rtt_s``."""
        v = router.measured_rtt(region)
        if v is None:
            v = router.heartbeat_rtt(region)
            if v is None:
                v = self.config.unknown_rtt_s
        return v

    def peer_t_p(self, router, region: str) -> float:
        p = router.peers.get(region)
        v = p.extra.get("t_p_s") if p is not None and p.extra else None
        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            return float(v)
        return self.local_t_p(router)

    def local_queue_tokens(self, router, req) -> float:
        """Prompt tokens ahead of a new request here: this LB's queue plus the local engines' backlog. With
        ``n`` routers sharing the replicas (``Policy.headroom_share``), this LB's queue drains at ``1/n`` of
        the region's rate, so it weighs ``n`` times in the region's backlog (the engines' is whole)."""
        mean = self._mean_prompt(router, req)
        q = router.queued_tokens if router.queued_tokens is not None else router.queue_len * mean
        n = router.local.tracker.share[1]  # the policy's LoadTracker, or the ingress's TrackerView
        return (q * n if n > 1 else q) + self.engine_queued_tokens(router, mean)

    @staticmethod
    def engine_queued_tokens(router, mean: float, reported_share: float = 1.0) -> float:
        """Prefill tokens queued at the local engines (the policy's estimate per replica; without one,
        reported waiting + unseen dispatches at the ``mean`` prompt). ``reported_share`` scales the part
        the engines reported (their waiting count at ``mean`` tokens; this router's own unseen
        dispatches stay whole): a heartbeat counts ``1/n`` of it when ``n`` routers share the replicas,
        since the registry adds a region's sources up."""
        local = router.local
        tracker = local.tracker
        q = 0.0
        for t in local.targets:
            v = local.queued_tokens(t)
            if v is not None and reported_share == 1.0:
                q += v  # the stay price's case: the policy's estimate as it is
                continue
            s = tracker.stats(t)
            waiting = (s.num_waiting if s is not None else 0) * mean
            if v is None:
                v = waiting + tracker.unseen(t) * mean
            q += v - (1.0 - reported_share) * waiting
        return q

    def local_cost(self, router, req, now: float, shared: bool = True) -> Optional[float]:
        """Estimated TTFT of holding the request here; None if staying is not an option. ``shared=False``
        leaves the in-flight term out (when the peers' heartbeats carry no in-flight count, so that
        both sides of the comparison are priced alike)."""
        if not self._may_stay(router, req):
            return None
        return self._stay_cost(router, req, now, shared, self.local_hit(router, req, now))

    @staticmethod
    def _may_stay(router, req) -> bool:
        allowed = req.allowed_regions
        return (allowed is None or router.region in allowed) and len(router.local.targets) > 0

    def _stay_cost(self, router, req, now: float, shared: bool, hit: float) -> float:
        """:meth:`local_cost` once staying is allowed, at the local match ``hit`` (tokens) the caller
        computed (one index match per decision: the home rule reads it too)."""
        cfg = self.config
        local = router.local
        n = len(local.targets)
        tp = self.local_t_p(router)
        wait = tp * self.local_queue_tokens(router, req) / n
        residual = tp * max(0.0, req.prompt_tokens - hit)
        self.last_own_stay_s = wait + residual  # this request's own TTFT part (the SLO guard's estimate)
        c = cfg.w_prefill * residual + cfg.q_hat * wait
        if cfg.w_shared and shared:
            c += cfg.w_shared * residual * self.shared_scale(router, req) * self.region_inflight(router) / n
        w = self.slot_wait_s(router, now) if cfg.stay_slot_wait and not local.tracker.available else 0.0
        self.last_slot_wait_s = w
        return c + cfg.q_hat * w if w else c

    def shared_scale(self, router, req) -> float:
        """The in-flight term's scale for ``req`` (``shared_size``), the same on every side of one comparison:
        ``mean prompt / prompt`` bounded by 1 from above ('at_most_mean'), from below ('at_least_mean') or not
        at all ('mean'); 1 for 'prompt'."""
        size = self.config.shared_size
        if size == "prompt":
            return 1.0
        r = self._mean_prompt(router, req) / max(1, req.prompt_tokens)
        if size == "at_most_mean":
            return r if r < 1.0 else 1.0
        if size == "at_least_mean":
            return r if r > 1.0 else 1.0
        return r

    def slot_wait_s(self, router, now: float) -> float:
        """Expected wait for a local engine slot of a request with ``router.queue_len`` requests ahead of
        it at this LB: ``(ahead + 1) / drain_rate`` (0 while the rate is unknown)."""
        rate = self.drain.rate(now)
        return (max(0, router.queue_len) + 1) / rate if rate else 0.0

    @staticmethod
    def _inflight(router) -> int:
        out = router.local.tracker.outstanding
        return sum(out(t) for t in router.local.targets)

    @classmethod
    def region_inflight(cls, router) -> int:
        """The region's requests in flight at its replicas, as staying prices them. One router: its own count.
        With ``n`` routers sharing the replicas (``Policy.headroom_share``): what each replica last reported
        running and waiting (every router's requests), plus the dispatches since that report, this router's
        times ``n`` (requests reach the routers evenly). A heartbeat reports this router's own count: the
        registry adds a region's sources up."""
        n = router.local.tracker.share[1]  # the policy's LoadTracker, or the ingress's TrackerView
        if n == 1:
            return cls._inflight(router)
        tracker = router.local.tracker
        total = 0
        for t in router.local.targets:
            s = tracker.stats(t)
            seen = (s.num_running + s.num_waiting) if s is not None else 0
            total += seen + n * tracker.unseen(t)
        return total

    def remote_wait(self, router, req, region: str, now: float) -> float:
        cfg = self.config
        p = router.peers[region]
        tp = self.peer_t_p(router, region)
        ex = p.extra or {}
        qtok = ex.get("queued_tokens")
        q = (float(qtok) if isinstance(qtok, (int, float)) and qtok >= 0
             else (p.queue_len if cfg.forwards_cap_peers else p.reported_queue_len) * self._mean_prompt(router, req))
        sent = self._unseen_forwards(router, region)
        q += sum(sent[max(0, p.available_replicas):])
        reps = ex.get("replicas")
        r = reps if isinstance(reps, int) and reps > 0 else max(1, p.available_replicas)
        stale = 1.0
        if cfg.staleness_scale_s is not None:
            stale += max(0.0, now - p.timestamp) / cfg.staleness_scale_s
        return tp * q * stale / r

    def unreflected_since(self, router, region: str) -> float:
        """The forwards to ``region`` sent after this time may be missing from its state: the state's
        ``timestamp`` is when the peer measured it (the registry dates a heartbeat by the delay it
        declares, and the reader subtracts its own leg back: ``policy/region/registry_state.py``), and a forward counts
        there only once it has arrived, half an RTT after it was sent. Without it a burst's forwards
        drop out of the price at the peer's next heartbeat although that heartbeat was measured before
        they arrived: the LB then saw an idle far peer and sent it a second burst (``network-hard``,
        t = 0.3 s)."""
        return router.peers[region].timestamp - 0.5 * self.rtt_of(router, region)

    def _unseen_forwards(self, router, region: str) -> List[int]:
        """Prompt tokens of the forwards to ``region`` its state cannot have seen (sent after
        :meth:`unreflected_since`), oldest first. The forwards are kept in the order they were sent, so
        the walk goes from the newest back and stops at the first one the state has seen: a decision
        reads only the recent ones, not the whole history (up to 4,096 per peer)."""
        q = self._fwd.get(region)
        if not q:
            return []
        since = self.unreflected_since(router, region)
        out = []
        for t, tok in reversed(q):
            if t <= since:
                break
            out.append(tok)
        out.reverse()
        return out

    def peer_inflight(self, router, region: str) -> float:
        """Requests in flight per replica at ``region``: its heartbeat's count plus what this LB forwarded
        there that the heartbeat cannot have seen (:meth:`unreflected_since`), over its replica count (0
        if the heartbeat carries no count)."""
        p = router.peers[region]
        ex = p.extra or {}
        n = ex.get("inflight")
        if not isinstance(n, (int, float)) or n < 0:
            return 0.0
        n = float(n) + len(self._unseen_forwards(router, region))
        reps = ex.get("replicas")
        return n / (reps if isinstance(reps, int) and reps > 0 else max(1, p.available_replicas))

    def peer_costs(self, router, req, peers: List[str], now: float, local_hit: Optional[float] = None):
        """(peer -> cost, raw matches, discounted matches). ``local_hit``: this region's best match in
        tokens if the caller has it (the home rule needs it; computed here otherwise)."""
        cfg = self.config
        snap = router.snapshot
        prep = req.prepared_for(snap)
        raw = snap.match(prep, peers)
        if router.local.infers_replies:
            through_reply(raw, prep, req.reply_span)
        hits = discounted_hits(raw, req.prompt_tokens, cfg.chars_per_token, cfg.min_match_chars,
                               cfg.match_half_life_s, snap, prep, now)
        if cfg.peer_summary:
            self._summary_hits(router, req, peers, prep, raw, hits)
        self.last_home = None
        if cfg.home_key_chars is not None:
            home = self._home(router, req, peers, prep, hits, now, local_hit)
            if home is not None and home != router.region:
                self.last_home = home
                raw[home] = prep.length
                hits[home] = float(req.prompt_tokens)
        costs = {}
        rtts = self.last_rtts = {}
        inflight = self.last_inflight = {}
        scale = self.shared_scale(router, req) if cfg.w_shared else 1.0
        for r in peers:
            tp = self.peer_t_p(router, r)
            residual = tp * max(0.0, req.prompt_tokens - hits.get(r, 0.0))
            rtt = rtts[r] = self.rtt_of(router, r)
            c = cfg.w_rtt * rtt + cfg.w_prefill * residual
            if cfg.remote_queue:
                c += cfg.q_hat * self.remote_wait(router, req, r, now)
            if cfg.w_shared:
                n = inflight[r] = self.peer_inflight(router, r)
                c += cfg.w_shared * residual * scale * n
            costs[r] = c
        return costs, raw, hits

    def _home(self, router, req, peers: List[str], prep, hits: dict, now: float,
              local: Optional[float] = None) -> Optional[str]:
        """The home region of a long prompt no region is known to hold to the key's depth
        (``home_key_chars``), else None."""
        cfg = self.config
        depth = cfg.home_key_chars
        known = depth / cfg.chars_per_token  # a match this long holds the key: the prompt is not new
        if prep.length < depth or any(v >= known for v in hits.values()):
            return None
        if local is None:
            local = self.local_hit(router, req, now)
        if local >= known:
            return None
        # this region must know no more of the prompt than every peer does: what is known is then a
        # preamble every region was sent (a shared system prompt), and the long rest is new. A longer
        # local match is this region's own earlier traffic (a conversation's history): it decides.
        # Nor may a peer know more than every other region (``home_needs_common_preamble``): that peer was
        # sent the prompt's history, and its match decides.
        if peers:
            peer_known = [hits.get(p, 0.0) for p in peers]
            most = max(local, *peer_known) if cfg.home_needs_common_preamble else local
            if most > 1.25 * min(local, *peer_known) + cfg.min_match_chars / cfg.chars_per_token:
                return None
        i = bisect_left(prep.ends, depth)
        if i >= len(prep.keys):
            return None
        key = prep.keys[i]
        allowed = req.allowed_regions
        regions = [r for r in router.peers if allowed is None or r in allowed] + [router.region]
        home = max(regions, key=lambda r: zlib.crc32(f"{key}:{r}".encode()))
        return home if home == router.region or home in peers else None

    def local_hit(self, router, req, now: float) -> float:
        """The best local match of ``req`` in tokens (min length and age rules applied), 0 without an index."""
        cfg = self.config
        index = router.local.index
        if index is None:
            return 0.0
        p = req.prepared_for(index)
        match = index.match(p, router.local.targets)
        if router.local.infers_replies:
            through_reply(match, p, req.reply_span)
        hits = discounted_hits(match, req.prompt_tokens, cfg.chars_per_token,
                               cfg.min_match_chars, cfg.match_half_life_s, index, p, now)
        return max(hits.values(), default=0.0)

    def _summary_hits(self, router, req, peers: List[str], prep, raw: dict, hits: dict) -> None:
        """Raise each peer's match to what its heartbeat's prefix summary says its replicas hold
        (``PeerState.prefix_summary``; no age discount: the summary is as old as the heartbeat), when
        longer than the snapshot's (``min_match_chars`` applies). Updates ``raw`` / ``hits`` in place."""
        cfg = self.config
        snap = router.snapshot
        fl = float(req.prompt_tokens)
        floor = max(1, cfg.min_match_chars)
        for r in peers:
            s = router.peers[r].prefix_summary
            if s is None:
                continue
            chars = s.match(req, prep if s.same_geometry(snap) else None)
            if chars < floor or chars <= raw.get(r, 0):
                continue
            raw[r] = chars
            x = chars / cfg.chars_per_token
            hits[r] = max(hits.get(r, 0.0), x if x < fl else fl)

    # ------------------------------------------------------------ decision
    def select(self, router, req, peers: List[str], now: float) -> Selection:
        """(region, matched chars, reason), or (None, 0, reason) to hold the request here."""
        hit = self.local_hit(router, req, now) if self.config.stay_local and self._may_stay(router, req) else None
        costs, raw, hits = self.peer_costs(router, req, peers, now, hit)
        best = min(costs, key=lambda r: (costs[r], self.rtt_of(router, r), r))
        stay = self._stay_cost(router, req, now, self._peers_report_inflight(router, peers), hit) \
            if hit is not None else None
        self.last_costs = dict(costs)
        self.last_costs[None] = stay if stay is not None else math.inf
        if stay is not None and stay <= costs[best]:
            return None, 0, "stay_cheaper"
        return best, raw.get(best, 0) if best in hits else 0, "cost"

    @staticmethod
    def _peers_report_inflight(router, peers: List[str]) -> bool:
        """Every peer's heartbeat carries its in-flight count: staying is then priced with its own
        in-flight term too (``local_cost``'s ``shared``), so both sides are priced alike."""
        return all(isinstance((router.peers[r].extra or {}).get("inflight"), (int, float)) for r in peers)

    def costs_before_saturation(self, router, req, peers: List[str], now: float):
        """(stay cost or None, peer -> cost, raw matches, discounted matches); no state changes."""
        if not self._may_stay(router, req):
            return None, {}, {}, {}
        hit = self.local_hit(router, req, now)
        stay = self._stay_cost(router, req, now, self._peers_report_inflight(router, peers), hit)
        costs, raw, hits = self.peer_costs(router, req, peers, now, hit)
        return stay, costs, raw, hits

    def own_stay_s(self, router, req, now: float) -> float:
        """This request's own expected TTFT if it stays while a local replica is available (what the SLO
        guard scales): the queue ahead per replica plus its residual prefill, at the region's ``t_p``;
        no in-flight term (that prices other requests' slowdown, not this one's TTFT)."""
        self._stay_cost(router, req, now, False, self.local_hit(router, req, now))
        return self.last_own_stay_s

    def peer_own_s(self, router, req, region: str, hits: dict, now: float) -> float:
        """The request's own expected TTFT at ``region`` after arriving there (no RTT): its queue per replica
        plus the residual prefill at its match, at the peer's ``t_p``; no in-flight term."""
        tp = self.peer_t_p(router, region)
        hit = 0.0 if region == self.last_home else hits.get(region, 0.0)  # a home is priced as holding it, yet does not
        return tp * max(0.0, req.prompt_tokens - hit) + self.remote_wait(router, req, region, now)

    def select_before_saturation(self, router, req, peers: List[str], now: float) -> Selection:
        """A local replica is available (``forward_before_saturation``): forward only when the best peer's
        expected TTFT is below staying's by the margin. Staying prices the local expected TTFT (queued tokens
        ahead over the replicas, residual prefill at the best local match, its slowdown of the batch);
        a peer its RTT plus its expected TTFT (its queue, the forwards since its heartbeat, its match).
        Hysteresis (a Schmitt trigger per peer): a peer is engaged when the saving exceeds
        ``forward_margin_s`` and released when it falls below ``forward_hysteresis`` × the margin, so a
        region does not flip between forwarding and staying on every request. Ties stay local. With the
        TTFT-SLO guard (``ttft_slo_s``), a forward so chosen is not made when staying is expected to meet the
        SLO and the forward to miss it (``region/slo_guard.py``); every stay here is noted for its calibration."""
        cfg = self.config
        stay, costs, raw, hits = self.costs_before_saturation(router, req, peers, now)
        if stay is None:  # staying is not allowed (residency): the saturated path decides
            return None, 0, "local_available"
        guard = self.slo_guard
        own = self.last_own_stay_s if guard is not None else None  # priced by costs_before_saturation
        best = min(costs, key=lambda r: (costs[r], self.rtt_of(router, r), r))
        saving = stay - costs[best]
        engaged = self._engaged
        for r in list(engaged):  # release peers whose saving fell below the lower threshold
            if r not in costs or stay - costs[r] < cfg.forward_hysteresis * cfg.forward_margin_s:
                engaged.discard(r)
        self.last_costs = dict(costs)
        self.last_costs[None] = stay
        if saving > 0 and (saving > cfg.forward_margin_s or best in engaged or best == self.last_home):
            if own is not None and guard.meets(own) and not guard.meets_after(
                    self.peer_own_s(router, req, best, hits, now), self.rtt_of(router, best)):
                guard.note_stay(req.request_id, own)  # staying meets the SLO, the forward would miss it
                guard.kept += 1
                return None, 0, "slo_kept_local"
            engaged.add(best)
            self.presaturation_forwards += 1
            return best, raw.get(best, 0) if best in hits else 0, "cost_before_saturation"
        if own is not None:
            guard.note_stay(req.request_id, own)
        return None, 0, "local_available"

    def heartbeat_extra(self, router, queued_tokens: Optional[float]) -> dict:
        """What peers price this region by. ``queued_tokens``: this LB's queue (the caller's figure)
        plus the local engines' backlog, the same tokens :meth:`local_queue_tokens` prices staying by,
        so a peer's forward and a local stay see one queue. (The LB queue alone hid a backlog SP-P
        had just pushed into the engines: a far region that had taken a burst reported 0 queued
        tokens and was sent a second one.) With ``n`` ingress routers sharing the region's replicas
        (``LoadTracker.share``) each reports ``1/n`` of the engines' reported waiting, as the registry
        sums its sources."""
        local = router.local
        ex = {"replicas": len(local.targets), "t_p_s": self.local_t_p(router),
              "inflight": self._inflight(router)}
        if queued_tokens is not None:
            mean = float(local.mean_prompt_tokens or 0.0)
            n = local.tracker.share[1]
            ex["queued_tokens"] = float(queued_tokens) + self.engine_queued_tokens(router, mean, 1.0 / max(1, n))
        return ex
