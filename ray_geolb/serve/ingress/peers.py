"""The ingress's link to its peer regions: :class:`PeerMesh`.

Background work only -- never on a request's path:

* the peer table: a :class:`~ray_geolb.serve.registry_client.RegistryClient` heartbeats this region's figures
  (:meth:`PeerMesh.heartbeat`) and hands back the registry's table, which becomes the
  :class:`~ray_geolb.policy.region.router.RegionRouter`'s ``PeerState``s (``update_peer``);
* RTT probes: every ``rtt_probe_period_s`` each peer ingress is pinged through the injected
  inter-region latency and the sample goes to ``RegionRouter.observe_rtt`` -- the region layer's one
  RTT estimate, reported to the registry with the heartbeat and read back as ``PeerState.rtt_s``;
* this region's hash-only prefix summary (``RegionRouter.prefix_summary``), with the heartbeat when it
  changed (and every ``SUMMARY_REFRESH_S``: ``SummarySendRule``, which the simulator sends by too); the peers'
  come back in the table as ``PeerState.prefix_summary``;
* with several ingress replicas in the region, their prefix inserts (``siblings.py``): this replica's with
  each heartbeat to the primary registry, the siblings' back with its table;
* the regional snapshot (SkyLB's record of what was forwarded where): mirrored to the registry by
  bounded deltas (``policy/region/snapshot_sync.py``: at most ``snapshot_max_rows`` rows per heartbeat) at most
  every ``snapshot_period_s`` after it changed, sent again whole (in chunks) when the registry does
  not acknowledge the version this ingress sent (it restarted, a heartbeat was lost), and reloaded
  from it once when this ingress restarts.

It also hands out the peers' ingress handles for forwards, and the :class:`LatencyInjector` of the
inter-region hops (and its injected faults, for chaos drills). A peer the ingress could not reach
(:meth:`PeerMesh.unreachable`) gets an open circuit: it stays unavailable past its next heartbeats
(the registry may still hear from a region this one cannot reach) until an RTT probe reaches it, or
its backoff (``BREAKER_BACKOFF_S``, doubling per failure up to ``BREAKER_MAX_S``, ±20% jitter) runs out.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any, Callable, Dict, List, Optional

from ray import serve

from ray_geolb.aio import within
from ray_geolb.policy.region import PeerState, RegionRouter
from ray_geolb.policy.region.heartbeat import heartbeat_message
from ray_geolb.policy.region.peer_table import peer_states_from_table
from ray_geolb.policy.region.prefix_summary import SummarySendRule
from ray_geolb.policy.region.snapshot_sync import SnapshotWriter
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.emulated import REGION_LABEL
from ray_geolb.serve.latency import LatencyInjector
from ray_geolb.serve.registry import standby_name
from ray_geolb.serve.registry_client import RegistryClient

from .config import INGRESS_DEPLOYMENT, IngressConfig
from .siblings import SiblingChannel

logger = logging.getLogger("ray.serve")

__all__ = ["PeerMesh"]

PING_TIMEOUT_S = 5.0
#: an unreachable peer's circuit stays open this long after its first failure, doubling per failure
BREAKER_BACKOFF_S = 1.0
BREAKER_MAX_S = 30.0


class PeerMesh:
    """Peer handles, RTT probes, heartbeats and the snapshot mirror of one region's ingress.

    ``router`` is the ingress's RegionRouter (the peer table, the RTT estimate and the snapshot are
    its state; the mesh changes them only through its methods). ``local_report()`` returns this
    region's heartbeat figures: ``available_replicas``, ``queue_len`` and the cost selector's
    ``extra`` (may be empty). ``on_peers_changed()`` is called after each new peer table."""

    def __init__(self, cfg: IngressConfig, source: str, router: RegionRouter, local_report: Callable[[], dict],
                 on_peers_changed: Callable[[], None], clock: Callable[[], float] = policy_now,
                 siblings: Optional[SiblingChannel] = None):
        self.cfg = cfg
        #: the region's other ingress replicas' prefix inserts, through the registry (``siblings.py``)
        self.siblings = siblings
        self.region = cfg.region
        self.source = source
        self.router = router
        self._local_report = local_report
        self._on_peers_changed = on_peers_changed
        self._clock = clock
        self.latency = LatencyInjector.from_spec(cfg.latency)
        self.registry: Optional[RegistryClient] = None
        self.snapshot_loaded = False
        self._handles: Dict[str, Any] = {}
        self._snapshot_dirty = False
        self._snapshot_sent_at = 0.0
        self.snapshot_writer = SnapshotWriter(cfg.snapshot_max_rows)
        self._summary_rule = SummarySendRule()  # which heartbeats carry this region's prefix summary
        self.summary_skipped = 0  # heartbeats sent without the summary: its build met a changing index
        self._tasks: List[asyncio.Task] = []
        self._open_until: Dict[str, float] = {}  # peer -> monotonic time its circuit closes again
        self._failures: Dict[str, int] = {}
        for peer in cfg.peers:  # known but unheard: unavailable until a heartbeat says otherwise
            router.update_peer(PeerState(peer, 0, 0, float("-inf")))

    def start(self) -> None:
        """Start the registry link and the RTT probes (on the running event loop)."""
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        if cfg.registry is not None:
            r = cfg.registry
            standbys = [(standby_name(r.name, where), {REGION_LABEL: where} if r.pin_standbys else None)
                        for where in r.standbys]
            self.registry = RegistryClient(self.region, self.source, self.heartbeat, self._on_table,
                                           name=r.name, namespace=r.namespace, period_s=r.period_s,
                                           timeout_s=r.timeout_s, registry_config=r.config, clock=self._clock,
                                           standbys=standbys, on_standby_table=self._on_standby_table)
            self.registry.start()
            self._tasks.append(loop.create_task(self._load_snapshot()))
        if cfg.peers:
            self._tasks.append(loop.create_task(self._probe_loop()))

    # ------------------------------------------------------------ peers
    def handle(self, region: str):
        """The ingress handle of peer ``region`` (created once; KeyError for an unknown region)."""
        h = self._handles.get(region)
        if h is None:
            h = serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name=self.cfg.peers[region],
                                            _check_exists=False)
            self._handles[region] = h
        return h

    def unreachable(self, region: str) -> None:
        """A forward could not reach ``region``: unavailable now, and its circuit opens (module docstring)."""
        n = self._failures.get(region, 0) + 1
        self._failures[region] = n
        backoff = min(BREAKER_MAX_S, BREAKER_BACKOFF_S * 2 ** (n - 1))
        self._open_until[region] = time.monotonic() + backoff * random.uniform(0.8, 1.2)  # jitter: no herd
        self.router.mark_unreachable(region)  # PeerState changes only through RegionRouter

    def reachable(self, region: str) -> None:
        """``region`` answered (a probe): its circuit closes."""
        if self._open_until.pop(region, None) is not None:
            self._failures.pop(region, None)
            self._on_peers_changed()

    def circuit_open(self, region: str) -> bool:
        until = self._open_until.get(region)
        return until is not None and time.monotonic() < until

    def snapshot_changed(self) -> None:
        """The regional snapshot changed (a forward): mirror it with a coming heartbeat."""
        self._snapshot_dirty = True

    def status(self) -> Optional[dict]:
        """The registry link's status, or None without a registry."""
        return None if self.registry is None else self.registry.status()

    # ------------------------------------------------------------ registry
    def heartbeat(self) -> dict:
        """This region's heartbeat: its figures, its measured RTTs, and its snapshot when due."""
        rep = self._local_report()
        now = self._clock()
        hb = heartbeat_message(self.region, self.source, rep["available_replicas"], rep["queue_len"],
                               self.router.measured_rtts(), extra=rep.get("extra"),
                               prefix_summary=self._summary_rule.wire(self._prefix_summary(), now))
        w = self.snapshot_writer
        if w.pending or (self._snapshot_dirty and now - self._snapshot_sent_at >= self.cfg.snapshot_period_s):
            delta = w.delta(self.router.snapshot.snapshot())
            if delta is not None:
                hb["snapshot_delta"] = delta
            self._snapshot_sent_at = now
            self._snapshot_dirty = False
        if self.siblings is not None:
            hb.update(self.siblings.outgoing() or {})
        return hb

    def _prefix_summary(self):
        """This region's prefix summary (``RegionRouter.prefix_summary``: GeoPrefix's cost selector
        publishes one), or None. It is rebuilt when the index's change mark moved, from the prefix
        index the router's snapshot names -- the one structure the router shares rather than copies
        (``serve/router_snapshot.py``). A build that meets the router changing the index fails once:
        counted (``summary_skipped``), logged, and this heartbeat goes without it; no retry."""
        try:
            return self.router.prefix_summary()
        except (RuntimeError, KeyError, IndexError) as e:  # the index changed under the walk
            self.summary_skipped += 1
            logger.debug("region %s: prefix summary skipped this heartbeat: %r", self.region, e)
            return None

    def _apply_peers(self, table: dict, made_at: float) -> None:
        """Every peer's state in ``table``; one older than what the router holds (from another registry)
        is ignored by ``RegionRouter.update_peer``."""
        for ps in peer_states_from_table(table, made_at, self.region):
            if ps.region in self.cfg.peers:
                self.router.update_peer(ps)
                if self.circuit_open(ps.region):
                    self.router.mark_unreachable(ps.region)

    def _on_standby_table(self, table: dict, made_at: float) -> None:
        """A standby registry's table: its peers only (the snapshot is the primary's business)."""
        self._apply_peers(table, made_at)
        self._on_peers_changed()

    def _on_table(self, table: dict, made_at: float) -> None:
        self._apply_peers(table, made_at)
        w = self.snapshot_writer
        w.acknowledge((table.get("snapshot_acks") or {}).get(self.source))
        if self.siblings is not None:
            self.siblings.incoming((table.get("sibling_inserts") or {}).get(self.source))
        if not w.in_sync() and (w.version or self.router.snapshot.num_nodes):
            self._snapshot_dirty = True  # the registry does not hold what we sent (restarted, lost a delta)
        self._on_peers_changed()

    async def _load_snapshot(self) -> None:
        """A restarted ingress reloads its regional snapshot from the registry (once)."""
        for _ in range(40):
            snap = await self.registry.fetch_snapshot(self.region)
            if snap is not None:
                if self.router.snapshot.num_nodes == 0:
                    try:
                        self.router.snapshot.load_snapshot(snap)
                        self.snapshot_loaded = True
                    except (ValueError, KeyError, TypeError) as e:
                        logger.warning("ignoring registry snapshot for %s: %s", self.region, e)
                return
            if self.registry.connected:
                return  # reachable, nothing stored
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------ RTT probes
    async def _probe_loop(self) -> None:
        while True:
            for peer in list(self.cfg.peers):
                try:
                    await self._probe(peer)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - a peer that does not answer simply has no RTT
                    pass
            await asyncio.sleep(self.cfg.rtt_probe_period_s)

    async def _probe(self, peer: str) -> None:
        """One RTT sample to ``peer`` (through the injected latency), fed to ``RegionRouter.observe_rtt``."""
        if peer not in self._handles:  # warm-up call: the first one pays handle setup
            await within(self.handle(peer).ping.remote(), PING_TIMEOUT_S)
        t0 = time.monotonic()  # a duration: the process's monotonic clock
        await self.latency.hop(self.region, peer)
        await within(self.handle(peer).ping.remote(), PING_TIMEOUT_S)
        await self.latency.hop(peer, self.region)
        self.router.observe_rtt(peer, time.monotonic() - t0)
        self.reachable(peer)
