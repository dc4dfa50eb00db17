"""SkyLB's two layers (Algorithm 1, HANDLEREQUEST): this region, or the best available peer.

A :class:`RegionRouter` is one region's load balancer. For each request it:

1. routes **locally** when the local policy finds an available replica (``LocalAvail ≠ ∅``);
2. otherwise **forwards** to an available peer region — one whose last heartbeat is fresh, reports
   at least one available replica and an LB queue no longer than ``tau`` — picked by the regional
   snapshot (longest prefix this region already forwarded there; ties by lower RTT), by a ring over
   regions (SkyLB-CH), or (``remote="cost"``) by the TTFT-cost selector of ``policy/remote.py``, which
   may also decide that holding the request here is cheaper than any forward. A forwarded request carries ``hops``; at ``max_hops`` it is never forwarded
   again (no ping-pong);
3. otherwise **holds** it in this LB's FCFS queue (the driver retries it when something frees).

Data residency: a request's ``allowed_regions`` (narrowed by ``TwoLayerConfig.tenant_regions`` for
its tenant) is enforced on both layers — a request may be held,
or rejected if no allowed region can ever take it, but never sent outside its set.

The peer table is fed by heartbeats (:meth:`update_peer`) and this region's own heartbeat is
:meth:`heartbeat`. A peer not heard from within ``peer_stale_s`` is treated as unavailable
("route locally, never forward blindly").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Hashable, Iterable, List, Literal, Optional

from pydantic import Field, field_validator

from .base import Policy, RouteRequest
from .config import PrefixIndexConfig, _Strict
from .hash_ring import HashRing
from .remote import CostSelector, CostSelectorConfig

__all__ = ["TwoLayerConfig", "PeerState", "RegionDecision", "RegionRouter"]

REGION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


class TwoLayerConfig(_Strict):
    region: str = Field(..., min_length=1, pattern=REGION_PATTERN, description="this LB's region name")
    tau: int = Field(2, ge=0, description="a peer whose LB queue is longer than this is unavailable")
    remote: Literal["prefix", "ring", "nearest", "cost"] = Field("prefix", description="how a peer is chosen ('cost': policy/remote.py)")
    max_hops: int = Field(1, ge=0, le=1, description="0 = region-local (never forward), 1 = SkyLB")
    peer_stale_s: float = Field(10.0, gt=0, description="a peer heartbeat older than this is ignored")
    snapshot: PrefixIndexConfig = PrefixIndexConfig(max_nodes=100_000)
    virtual_nodes: int = Field(256, ge=1)
    cost: CostSelectorConfig = Field(CostSelectorConfig(), description="the 'cost' selector's settings (remote='cost')")
    tenant_regions: Dict[str, FrozenSet[str]] = Field(default_factory=dict, description="tenant -> regions its requests may be served in")

    @field_validator("tenant_regions")
    @classmethod
    def _check_tenants(cls, v):
        import re

        for tenant, regions in v.items():
            if not regions:
                raise ValueError(f"tenant {tenant!r} has an empty region set (omit the tenant for 'any region')")
            for r in regions:
                if not re.match(REGION_PATTERN, r):
                    raise ValueError(f"tenant {tenant!r}: invalid region name {r!r}")
        return v


@dataclass
class PeerState:
    """One region's heartbeat, as the registry relays it."""

    region: str
    available_replicas: int
    queue_len: int
    timestamp: float
    rtt_s: Optional[float] = None
    extra: Dict = field(default_factory=dict)


@dataclass
class RegionDecision:
    kind: Literal["local", "forward", "hold", "reject"]
    target: Optional[Hashable] = None  # replica id (local) or region (forward)
    matched: int = 0
    reason: str = ""


class RegionRouter:
    """One region's load balancer: layer 1 over peer regions, layer 2 = the local ``Policy``."""

    def __init__(self, config, local: Policy, clock: Callable[[], float] = None):
        if isinstance(config, dict):
            config = TwoLayerConfig.model_validate(config)
        self.config: TwoLayerConfig = config
        self.region = config.region
        self.local = local
        self.peers: Dict[str, PeerState] = {}
        self.snapshot = config.snapshot.build(clock)
        self.ring = HashRing(virtual_nodes=config.virtual_nodes)
        self.selector: Optional[CostSelector] = CostSelector(config.cost) if config.remote == "cost" else None
        self.queue_len = 0
        self.queued_tokens: Optional[float] = None

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
        if self.peers.pop(region, None) is not None:
            self.ring.remove(region)
            self.snapshot.remove_target(region)
            if self.selector is not None:
                self.selector.forget(region)

    def observe_rtt(self, region: str, seconds: float) -> None:
        """A measured RTT sample to ``region`` (the 'cost' selector keeps an EWMA of them)."""
        if self.selector is not None:
            self.selector.observe_rtt(region, seconds)

    def set_queue(self, queue_len: int, queued_tokens: Optional[float] = None) -> None:
        """What waits at this LB *ahead of* the request about to be decided (requests, and their prompt
        tokens), for the 'cost' selector's stay cost (``queue_len`` is the slot wait's ``ahead``)."""
        self.queue_len = queue_len
        self.queued_tokens = queued_tokens

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
        out = []
        for r, s in self.peers.items():
            if allowed is not None and r not in allowed:
                continue
            if now - s.timestamp > cfg.peer_stale_s:
                continue
            if s.available_replicas >= 1 and s.queue_len <= cfg.tau:
                out.append(r)
        return out

    def heartbeat(self, queue_len: int, now: float, queued_tokens: Optional[float] = None) -> PeerState:
        self.queue_len = queue_len
        if queued_tokens is not None:
            self.queued_tokens = queued_tokens
        hb = PeerState(self.region, len(self.local.tracker.available), queue_len, now)
        if self.selector is not None or queued_tokens is not None:
            sel = self.selector or CostSelector()
            hb.extra = sel.heartbeat_extra(self, queued_tokens)
        return hb

    # ------------------------------------------------------------ decisions
    def decide(self, req: RouteRequest, now: float, candidates: Optional[Iterable[Hashable]] = None) -> RegionDecision:
        self._apply_tenant(req)
        allowed = req.allowed_regions
        if allowed is not None and not allowed:
            return RegionDecision("reject", reason=f"tenant {req.tenant!r}: no region satisfies both the request's and the tenant's allowed regions")
        local_ok = allowed is None or self.region in allowed
        if local_ok:
            d = self.local.choose(req, now, candidates)
            if d is not None:
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
        region, matched, reason = self._pick_peer(req, peers, now)
        if region is None:
            return RegionDecision("hold", reason=reason)
        return RegionDecision("forward", region, matched, reason)

    def _rtt(self, region: str) -> float:
        r = self.peers[region].rtt_s
        return r if r is not None else float("inf")

    def _pick_peer(self, req: RouteRequest, peers: List[str], now: float = 0.0):
        mode = self.config.remote
        if mode == "cost":
            return self.selector.select(self, req, peers, now)
        if mode == "ring":
            key = req.session_key or req.text[:256]
            return self.ring.next_available(key, set(peers)), 0, "ring"
        if mode == "prefix":
            best, matched = self.snapshot.longest(self._prepared(req), peers)
            if best:
                return min(best, key=lambda r: (self._rtt(r), r)), matched, "snapshot"
        return min(peers, key=lambda r: (self._rtt(r), r)), 0, "nearest"

    def _prepared(self, req: RouteRequest):
        return req.prepared_for(self.snapshot)

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

    def on_forward(self, req: RouteRequest, region: str, now: float) -> None:
        """Record a forward in the regional snapshot (SkyLB §4.1)."""
        self.snapshot.insert(self._prepared(req), region, now)
        if self.selector is not None:
            self.selector.on_forward(req, region, now)
