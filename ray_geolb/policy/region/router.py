"""SkyLB's two layers (Algorithm 1, HANDLEREQUEST): this region, or the best available peer.

A :class:`RegionRouter` is one region's load balancer. For each request it:

1. routes **locally** when the local policy finds an available replica (``LocalAvail ≠ ∅``);
2. otherwise **forwards** to an available peer region — one whose last heartbeat is fresh, reports
   at least one available replica and an LB queue no longer than ``tau`` — picked by the regional
   snapshot (longest prefix this region already forwarded there; ties by lower RTT), by a ring over
   regions (SkyLB-CH), or (``remote="cost"``) by the TTFT-cost selector, which may also decide that
   holding the request here is cheaper than any forward (one :class:`PeerSelector` per
   ``TwoLayerConfig.remote``, in :data:`PEER_SELECTORS`). A forwarded request carries ``hops``; at ``max_hops``
   it is never forwarded again (no ping-pong);
3. otherwise **holds** it in this LB's FCFS queue (the driver retries it when something frees).

Data residency: a request's ``allowed_regions`` (narrowed by ``TwoLayerConfig.tenant_regions`` for
its tenant) is enforced on both layers — a request may be held,
or rejected if no allowed region can ever take it, but never sent outside its set.

The peer table is fed by heartbeats (:meth:`update_peer`) and this region's own heartbeat is
:meth:`heartbeat`; with ``CostSelectorConfig.peer_summary`` it carries :meth:`prefix_summary`, a hash-only
Bloom filter of what this region's replicas were sent (``prefix_summary.py``), which peers keep in
``PeerState.prefix_summary``. A peer not heard from within ``peer_stale_s`` is treated as unavailable
("route locally, never forward blindly").

Who owns what: the router owns the peer table (a :class:`PeerState` changes only through its
methods: ``update_peer``, ``note_forward``, ``mark_unreachable``, ``remove_peer``), the regional
snapshot, the region ring and the one RTT estimate (``observe_rtt`` -> ``measured_rtt``); the 'cost'
selector owns what it alone reads (forwards sent since each heartbeat, the local drain rate). The
local layer is read through :class:`~ray_geolb.policy.region.local_layer.LocalLayer` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, Iterable, List, Literal, Optional, Tuple, Union

from ..base import RouteRequest
from ..hash_ring import HashRing
from ..prefix_index import PreparedText
from .config import TwoLayerConfig
from .cost_selector import CostSelector
from .estimators import RttTable
from .local_layer import LocalLayer
from .nearest_selector import NearestSelector
from .peer_selector import PeerSelector
from .prefix_selector import PrefixSelector
from .prefix_summary import PrefixSummary
from .ring_selector import RingSelector
from .steal import Thief, Victim

__all__ = ["PEER_SELECTORS", "PeerState", "RegionDecision", "RegionRouter"]

#: ``TwoLayerConfig.remote`` -> its peer selector, built from the router's config and RTT table
PEER_SELECTORS: Dict[str, Callable[[TwoLayerConfig, RttTable], PeerSelector]] = {
    "prefix": lambda config, rtt: PrefixSelector(),
    "ring": lambda config, rtt: RingSelector(),
    "nearest": lambda config, rtt: NearestSelector(),
    "cost": lambda config, rtt: CostSelector(config.cost, rtt=rtt, ttft_slo_s=config.ttft_slo_s),
}


@dataclass
class PeerState:
    """One region's heartbeat, as the registry relays it."""

    region: str
    available_replicas: int
    queue_len: int
    timestamp: float
    rtt_s: Optional[float] = None
    extra: Dict = field(default_factory=dict)
    #: forwards this LB counted in ``queue_len`` since the heartbeat (``RegionRouter.note_forward``)
    noted: int = 0
    #: the peer's hash-only summary of its replicas' prefixes (``RegionRouter.prefix_summary``; wire form:
    #: ``PrefixSummary.to_wire``), or None: the heartbeat carried none (the 'cost' selector then prices
    #: the peer's match from this LB's regional snapshot only)
    prefix_summary: Optional[PrefixSummary] = None

    @property
    def reported_queue_len(self) -> int:
        """The LB queue the peer's heartbeat reported (without this LB's noted forwards)."""
        return max(0, self.queue_len - self.noted)


@dataclass
class RegionDecision:
    kind: Literal["local", "forward", "hold", "reject"]
    target: Optional[Hashable] = None  # replica id (local) or region (forward)
    matched: int = 0
    reason: str = ""


class RegionRouter:
    """One region's load balancer: layer 1 over peer regions, layer 2 = the local layer (a ``Policy``, or
    anything that implements :class:`~ray_geolb.policy.region.local_layer.LocalLayer`)."""

    def __init__(self, config, local: LocalLayer, clock: Callable[[], float] = None):
        if isinstance(config, dict):
            config = TwoLayerConfig.model_validate(config)
        self.config: TwoLayerConfig = config
        self.region = config.region
        self.local = local
        self.peers: Dict[str, PeerState] = {}
        self.snapshot = config.snapshot.build(clock)
        self.ring = HashRing(virtual_nodes=config.virtual_nodes)
        self.rtt = RttTable(config.cost.rtt_alpha)  # the one measured-RTT estimate (observe_rtt)
        self.peer_selector: PeerSelector = PEER_SELECTORS[config.remote](config, self.rtt)
        #: the 'cost' selector (it keeps state the router feeds); None with SkyLB's stateless selectors
        self.selector: Optional[CostSelector] = (self.peer_selector if isinstance(self.peer_selector, CostSelector)
                                                 else None)
        self.queue_len = 0
        self.queued_tokens: Optional[float] = None
        self._summary: Optional[PrefixSummary] = None
        self._summary_mark = None
        #: cross-region work stealing (``config.steal``; steal.py): this region's offers out (as a thief)
        #: and the requests it handed over (as a victim); None when stealing is off
        self.thief: Optional[Thief] = Thief(config.steal, self.region) if config.steal.enabled else None
        self.victim: Optional[Victim] = Victim(config.steal) if config.steal.enabled else None
        #: several routers in this region: each forward's hash-only row goes here for the siblings (a
        #: ``sibling_inserts.SiblingOutbox``, set by the driver); None: none is kept
        self.sibling_outbox = None

    # ------------------------------------------------------------ peer table
    def update_peer(self, state: PeerState) -> None:
        if state.region == self.region:
            return
        old = self.peers.get(state.region)
        if old is not None and state.timestamp < old.timestamp:
            return
        if old is None:
            self.ring.add(state.region)
        if state.rtt_s is None and old is not None:
            state.rtt_s = old.rtt_s
        self.peers[state.region] = state

    def remove_peer(self, region: str) -> None:
        if self.thief is not None:
            self.thief.forget(region)
        if self.peers.pop(region, None) is not None:
            self.ring.remove(region)
            self.snapshot.remove_target(region)
            self.rtt.forget(region)
            if self.selector is not None:
                self.selector.forget(region)

    def note_forward(self, region: str) -> None:
        """Count one forward in ``region``'s LB queue until its next heartbeat replaces the entry
        (optimistic; the Serve ingress calls it after each forward so that a burst stops going to a
        peer after ~tau forwards per heartbeat period instead of herding there). With the 'cost'
        selector and ``CostSelectorConfig.forwards_cap_peers=False`` the count does not enter the
        peer's availability: that selector already prices each forward since the heartbeat (its
        ``on_forward``), and counting it twice capped its forwards at tau + 1 per table."""
        ps = self.peers.get(region)
        if ps is not None:
            ps.queue_len += 1
            ps.noted += 1

    def mark_unreachable(self, region: str) -> None:
        """A forward to ``region`` failed: no available replica there until its next heartbeat."""
        ps = self.peers.get(region)
        if ps is not None:
            ps.available_replicas = 0

    # ------------------------------------------------------------ RTT
    def observe_rtt(self, region: str, seconds: float) -> float:
        """A measured RTT sample to ``region`` (a probe): updates and returns the EWMA
        (``TwoLayerConfig.cost.rtt_alpha``). The simulator's probes ride on its heartbeats; the Serve
        ingress pings every peer. The heartbeat's ``PeerState.rtt_s`` is left as the heartbeat said."""
        return self.rtt.observe(region, seconds)

    def measured_rtt(self, region: str) -> Optional[float]:
        """This router's RTT estimate to ``region`` from ``observe_rtt`` samples (None: never measured).
        The 'cost' selector prefers it to the heartbeat's."""
        return self.rtt.get(region)

    def measured_rtts(self) -> Dict[str, float]:
        """Every measured estimate, region -> seconds (a copy; the ingress reports it to the registry)."""
        return self.rtt.as_dict()

    def heartbeat_rtt(self, region: str) -> Optional[float]:
        """The RTT the peer table holds for ``region`` (``PeerState.rtt_s``, from its heartbeat; None:
        unknown). SkyLB's selectors (prefix, nearest) read this one."""
        p = self.peers.get(region)
        return p.rtt_s if p is not None else None

    def set_queue(self, queue_len: int, queued_tokens: Optional[float] = None) -> None:
        """What waits at this LB *ahead of* the request about to be decided (requests, and their prompt
        tokens), for the 'cost' selector's stay cost (``queue_len`` is the slot wait's ``ahead``)."""
        self.queue_len = queue_len
        self.queued_tokens = queued_tokens

    def allowed_regions_of(self, req: RouteRequest):
        """The regions ``req`` may be served in here: its own ``allowed_regions`` narrowed by its
        tenant's (``tenant_regions``); None = any. Applies the narrowing to ``req`` (idempotent), as
        :meth:`decide` does -- callers that decide without it (a fallback) use this."""
        self._apply_tenant(req)
        return req.allowed_regions

    def _apply_tenant(self, req: RouteRequest) -> None:
        """Narrow ``req.allowed_regions`` by its tenant's regions (idempotent; may become empty)."""
        regions = self.config.tenant_regions.get(req.tenant) if req.tenant is not None else None
        if regions is not None:
            req.allowed_regions = frozenset(regions if req.allowed_regions is None else req.allowed_regions & regions)

    def available_peers(self, now: float, req: Optional[RouteRequest] = None) -> List[str]:
        cfg = self.config
        if req is not None:
            self._apply_tenant(req)
        allowed = req.allowed_regions if req is not None else None
        # the 'cost' selector may price the forwards since each heartbeat itself (CostSelectorConfig.forwards_cap_peers)
        own = self.selector is not None and not self.selector.config.forwards_cap_peers
        out = []
        for r, s in self.peers.items():
            if allowed is not None and r not in allowed:
                continue
            if now - s.timestamp > cfg.peer_stale_s:
                continue
            if s.available_replicas >= 1 and (s.reported_queue_len if own else s.queue_len) <= cfg.tau:
                out.append(r)
        return out

    def prefix_summary(self) -> Optional[PrefixSummary]:
        """This region's hash-only prefix summary for its heartbeat (``PrefixSummary.build`` over the local
        layer's prefix index, at ``CostSelectorConfig.summary_max_keys`` / ``summary_bits_per_key``), or None:
        the 'cost' selector does not publish one (``peer_summary`` off) or the local policy has no index.
        Rebuilt only when the index changed since the last call. Send ``summary.to_wire()``; a peer parses
        it with ``PrefixSummary.from_wire`` into ``PeerState.prefix_summary``."""
        sel = self.selector
        if sel is None or not sel.config.peer_summary:
            return None
        index = self.local.index
        if index is None:
            return None
        mark = (id(index), index.change_mark())
        if self._summary is None or mark != self._summary_mark:
            cfg = sel.config
            self._summary = PrefixSummary.build(index, cfg.summary_max_keys, cfg.summary_bits_per_key)
            self._summary_mark = mark
        return self._summary

    def heartbeat(self, queue_len: int, now: float, queued_tokens: Optional[float] = None) -> PeerState:
        self.queue_len = queue_len
        if queued_tokens is not None:
            self.queued_tokens = queued_tokens
        hb = PeerState(self.region, len(self.local.tracker.available), queue_len, now)
        if self.selector is not None or queued_tokens is not None:
            sel = self.selector or CostSelector()
            hb.extra = sel.heartbeat_extra(self, queued_tokens)
        hb.prefix_summary = self.prefix_summary()
        return hb

    # ------------------------------------------------------------ work stealing (steal.py)
    def steal_price(self) -> Tuple[float, float]:
        """What a steal offer from this region says a moved request costs here: ``(wait_s, t_p_s)`` -- the
        local engines' queued prefill spread over the replicas, and the price per uncached prompt token
        (the 'cost' selector's estimates; a default one without it)."""
        sel = self.selector or CostSelector()
        tp = sel.local_t_p(self)
        n = max(1, len(self.local.targets))
        mean = self.local.mean_prompt_tokens or 1024.0
        return tp * sel.engine_queued_tokens(self, float(mean)) / n, tp

    def steal_rtt(self, region: str) -> float:
        """The RTT a steal to or from ``region`` pays (measured, else the heartbeat's, else a default)."""
        return (self.selector or CostSelector()).rtt_of(self, region)

    def stay_cost(self, req: RouteRequest, now: float) -> Optional[float]:
        """A held request's expected TTFT here with :meth:`set_queue`'s requests ahead of it (None: it may
        not stay here) -- what a victim weighs a steal against."""
        return (self.selector or CostSelector()).local_cost(self, req, now)

    def chars_per_token(self) -> float:
        return self.selector.config.chars_per_token if self.selector is not None else 4.0

    def min_match_chars(self) -> int:
        """The shortest prefix match (bytes) the 'cost' selector counts (1 without it)."""
        return max(1, self.selector.config.min_match_chars) if self.selector is not None else 1

    # ------------------------------------------------------------ decisions
    def decide(self, req: RouteRequest, now: float, candidates: Optional[Iterable[Hashable]] = None) -> RegionDecision:
        self._apply_tenant(req)
        allowed = req.allowed_regions
        if allowed is not None and not allowed:
            return RegionDecision("reject", reason=f"tenant {req.tenant!r}: no region satisfies both the request's "
                                                   f"and the tenant's allowed regions")
        local_ok = allowed is None or self.region in allowed
        if local_ok:
            d = self.local.choose(req, now, candidates)
            if d is not None:
                sel = self.selector
                if (sel is not None and sel.config.forward_before_saturation and req.hops < self.config.max_hops
                        and self.peers):
                    peers = self.available_peers(now, req)
                    if peers:
                        region, matched, reason = sel.select_before_saturation(self, req, peers, now)
                        if region is not None:
                            return RegionDecision("forward", region, matched, reason)
                return RegionDecision("local", d.target, d.matched, d.reason)
        if req.hops >= self.config.max_hops:
            if local_ok:
                return RegionDecision("hold", reason="local_full")
            return RegionDecision("reject", reason=f"region {self.region} not allowed and hop limit reached")
        peers = self.available_peers(now, req)
        if not peers:
            if not local_ok and allowed is not None and not (set(self.peers) & allowed):
                return RegionDecision("reject", reason=f"no known region in allowed_regions {sorted(allowed)}")
            return RegionDecision("hold", reason="no_region_available")
        region, matched, reason = self.peer_selector.select(self, req, peers, now)
        if region is None:
            return RegionDecision("hold", reason=reason)
        return RegionDecision("forward", region, matched, reason)

    # ------------------------------------------------------------ events
    def on_dispatch(self, req: RouteRequest, target: Hashable, now: float) -> None:
        self.local.on_dispatch(req, target, now)

    def on_local_complete(self, now: float) -> None:
        """A request this LB dispatched to one of its local replicas left it (finished, failed or
        cancelled): feeds the 'cost' selector's local drain rate (``CostSelectorConfig.stay_slot_wait``).
        The simulator calls it at every completion its LB sees, the Serve ingress when a local request
        returns. O(1) amortised, memory-bounded; a no-op without the 'cost' selector."""
        if self.selector is not None:
            self.selector.on_local_complete(now)

    def observe_local_ttft(self, request_id: str, ttft_s: float, waited_s: float = 0.0) -> None:
        """A request this LB served here reached its first token ``ttft_s`` after its dispatch, as this LB
        saw it, having waited ``waited_s`` at this LB before: calibrates the TTFT-SLO guard
        (``region/slo_guard.py``: its stays' bins, and the region's own tail since arrival). The simulator
        calls it from its LB, the Serve ingress at a local stream's first token. A no-op without a guard."""
        if self.selector is not None and self.selector.slo_guard is not None:
            self.selector.slo_guard.observe(request_id, ttft_s)
            self.selector.slo_guard.observe_region(ttft_s + waited_s)

    def on_forward(self, req: RouteRequest, region: str, now: float) -> None:
        """Record a forward in the regional snapshot (SkyLB §4.1), and for the sibling routers
        (``sibling_outbox``) when this region has several."""
        p = self.snapshot.insert(req.prepared_for(self.snapshot), region, now)
        if self.selector is not None:
            self.selector.on_forward(req, region, now)
        if self.sibling_outbox is not None:
            self.sibling_outbox.add("f", region, p)

    def learn_sibling_forward(self, req: Union[RouteRequest, PreparedText], region: str, now: float) -> None:
        """A sibling router of this region (another ingress replica) forwarded ``req`` (a request, or its prompt
        as the snapshot's ``PreparedText``: a row of ``sibling_inserts.py``) to ``region``: record it in the
        regional snapshot as if this router had (no forward accounting: the sibling did the forward)."""
        self.snapshot.insert(req if isinstance(req, PreparedText) else req.prepared_for(self.snapshot), region, now)
