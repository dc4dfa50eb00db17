"""Region outages and network partitions in the simulator, and the figures through them.

A run's ``SimConfig.faults`` lists :class:`Fault` windows ``[start_s, start_s + duration_s)`` of simulated time
(a run dict's ``sim.faults``: ``[{"kind": "outage", "region": "eu", "start_s": 60, "duration_s": 60}]``,
checked on entry by :func:`check_faults`, a bad one named). :class:`FaultModel` carries them out inside the
:class:`~ray_geolb.sim.simulator.Simulator`; nothing here changes a run without faults.

**Outage** of a region R: at ``start_s`` R's replicas and R's LB (its per-region LB, or a central LB -- or its
standby -- that sits there) crash. Every request in flight whose route touches R is lost (below); each replica
restarts at the end with an empty engine (cold prefix cache); the LB restarts with its router as it was (a
restarted Serve ingress reloads its snapshot) and an empty queue, and its heartbeats and RTT probes start again.
R's *clients* are not down: they are people, not machines.

**Partition** of a region P: P -- its LB, replicas and clients -- is cut off from every other region; inside P
and among the others everything works. Nothing crosses: requests, forwards, steals, replica reports, heartbeats
to a registry on the other side (and its tables back), RTT probes. Two regions partitioned at once are two
islands.

**A request's route** is its client's region, the LB it reached first, the LB holding it now (a forward or a
steal moves it) and, once dispatched, its replica's region. When a fault begins, every request in the system
(queued at an LB, on its way between two of them or to a replica, on an engine, or its answer on its way back)
whose route now touches a down region or crosses a cut is **lost**: it leaves the engine and the queue that
held it (the LB that dispatched it forgets it), counted ``fault_lost``, and its client sends it again
``retry_after_s`` later (the ingress's Retry-After) as a new attempt. Its TTFT and latency still count from
the first send; a request is served at most once, and ``requests_sent == requests_completed +
requests_rejected + in_flight_at_end`` still holds (a lost attempt is not an end).

**A call that cannot connect** fails at the caller one round trip after it was made, nothing having reached
the other side (counted ``fault_call_failures``): a per-region LB's forward to a peer LB that is down or
across a cut -- the peer is marked unreachable (``RegionRouter.mark_unreachable``) and its circuit opens
(it stays unavailable through the next peer tables for 1 s, doubling per failure up to 30 s, or until an RTT
probe reaches it: Serve's breaker, without its jitter), and the request is decided again, as the Serve
ingress does on ``ForwardFailed``; a central LB's
dispatch to a replica that is down or across a cut -- that replica leaves the LB's targets (as Serve's router
drops a replica whose call failed) and the request is decided again.

**The registry and the peer tables.** A heartbeat that cannot reach the registry's region (down, or across a
cut), or whose answer cannot come back, is lost and the LB ticks again one period later; the registry keeps
what it had. So a peer that stops heartbeating keeps its last figures, dated when it measured them, and
every router ignores it once they are ``peer_stale_s`` old (``TwoLayerConfig.peer_stale_s``, 2 s): forwards
to it stop; a cut-off region, and every region when the registry's own region fails, routes locally
(Serve's ``RegistryClient`` behaves the same: degraded, never stopped). With standby registries
(``RegionLayerSettings.registry_standbys``) each heartbeat also goes to each standby and every table that
comes back is applied, a peer's freshest state winning: the regions that still reach some registry keep
forwarding among themselves; the primary's link paces the ticks (a lost standby leg is just lost).

**Noticing a failure: one delay for every system, ``detect_s``** (default 10 s, per fault: an anycast or
DNS health check, e.g. a check every 5 s and two failures). Until ``start_s + detect_s`` clients keep sending
to the LB they used; one that cannot reach it (down, or across a cut) waits -- its tries fail -- until the
failover (counted ``fault_client_waits``). At ``start_s + detect_s`` (and again at ``end_s + detect_s``, the
failback) every client region's LB is chosen again: per-region and region-local systems send a client to its
own region's LB when it is up and reachable, else to the nearest reachable LB by RTT (its clients pay that
RTT; counted ``fault_failed_over``); a central system sends every client to its central LB when reachable,
else to its **standby** (a second central LB over every replica, in ``DeploymentSpec.standby()``'s region:
the region nearest the central one, fed replica reports all along but with no routing history of its own),
else nowhere (the client waits). At the same moments each central LB's targets become the replicas that are
up and that it can reach. Both sides of a cut with a central system may thus run an LB for a while
(split brain, as two health-checked sites would).

**A client (or an edge proxy) that fails over on a failed connect, ``connect_failover_s``** (per fault; None, the
default: none does). A client region whose send cannot reach its LB tries the next one ``connect_failover_s``
after that first failed send (a connect timeout, or an edge proxy's retry on connect failure), chosen as the
health check would choose it, and sends its waiting requests there (counted ``fault_connect_failovers``); the
health check's failover and failback still come at ``detect_s``. It applies to every system alike: a central
system's client goes to the standby, a per-region system's to the nearest reachable LB.

The figures (:func:`fault_report`, in every summary of a run with faults): per fault window, and within it
before and after ``detect_s``, and over the whole run, the requests sent (by first send), served, P99 TTFT
(unserved ones count as infinite) and per TTFT SLO the attainment (served within it / sent) and goodput
(served within it per second of the window); the same for the fault region's own clients.

:func:`peak_fault_run` turns a geo-diurnal run into the run of one region's outage (or partition) during that
region's peak hour, with an hour long enough that ``detect_s`` is a small part of it.

Message timing is simplified: reachability is checked when a request is sent (and, for what is in flight, when a
fault begins) and when a control message arrives; a message already on the wire when a cut begins is delivered.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from heapq import heapify
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ray_geolb.engine.factory import make_engine
from ray_geolb.percentile import percentile

from .events import (
    CALL_FAILED,
    CLIENT_DONE,
    FAULT,
    HEARTBEAT,
    LB_ARRIVE,
    LB_DONE,
    LB_TIMEOUT,
    PING_REPLY,
    REG_ARRIVE,
    REG_REPLY,
    REP_ARRIVE,
    RETRY,
    RTT_PROBE,
    STATS_DELIVER,
    STATS_MEASURE,
    STEAL_ANSWER,
    STEAL_ARRIVE,
    STEAL_OFFER,
    STEAL_SETTLE,
    STEP_END,
    STEP_WAKE,
)
from .region_lb import RegionLB

__all__ = ["DETECT_S", "FAULT_KINDS", "REPORT_SLOS", "Fault", "FaultError", "FaultModel", "check_faults",
           "fault_report", "peak_fault_run", "peak_hour", "window_figures"]

FAULT_KINDS = ("outage", "partition")
#: the default delay before clients and central LBs act on a failure (an anycast / DNS health check)
DETECT_S = 10.0
#: a peer LB a forward could not reach stays unavailable this long, doubling per failure up to the max, or until
#: an RTT probe reaches it (Serve's circuit breaker: ``serve/ingress/peers.py``, there with +-20 % jitter)
BREAKER_BACKOFF_S, BREAKER_MAX_S = 1.0, 30.0
#: the TTFT SLOs (s) every fault report gives attainment and goodput at
REPORT_SLOS = (0.3, 0.5, 1.0, 2.0)
#: an unserved request's TTFT in a percentile (reported as None: infinite)
_MISS = 1e9
#: a lost request: before its engine finished it (its LB forgets it at once) / after (its LB saw it finish)
LOST, LOST_DONE = 1, 2


class FaultError(ValueError):
    """A bad fault: the message names it (``faults[i].field``)."""


def _num(v: Any, where: str, *, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
            (positive and v == 0):
        raise FaultError(f"{where} must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
    return float(v)


#: a fault's fields, in :class:`Fault`'s order
_FIELDS = ("kind", "region", "start_s", "duration_s", "detect_s", "connect_failover_s")


def _checked(kind: Any, region: Any, start_s: Any, duration_s: Any, detect_s: Any, where: str,
             connect_failover_s: Any = None) -> tuple:
    if kind not in FAULT_KINDS:
        raise FaultError(f"{where}.kind must be one of {list(FAULT_KINDS)}, got {kind!r}")
    if not isinstance(region, str) or not region:
        raise FaultError(f"{where}.region must be a region name, got {region!r}")
    return (kind, region, _num(start_s, f"{where}.start_s"), _num(duration_s, f"{where}.duration_s", positive=True),
            _num(detect_s, f"{where}.detect_s"),
            None if connect_failover_s is None else _num(connect_failover_s, f"{where}.connect_failover_s"))


@dataclass(frozen=True)
class Fault:
    """One fault window: ``kind`` (outage / partition) of ``region`` over ``[start_s, start_s + duration_s)``,
    noticed after ``detect_s``; with ``connect_failover_s``, a client that cannot connect to its LB tries the next
    one that long after its first failed send (module docstring)."""

    kind: str
    region: str
    start_s: float
    duration_s: float
    detect_s: float = DETECT_S
    connect_failover_s: Optional[float] = None

    def __post_init__(self):
        for name, v in zip(_FIELDS, _checked(self.kind, self.region, self.start_s, self.duration_s, self.detect_s,
                                             "fault", self.connect_failover_s)):
            object.__setattr__(self, name, v)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def to_dict(self) -> Dict[str, Any]:
        d = {"kind": self.kind, "region": self.region, "start_s": self.start_s, "duration_s": self.duration_s,
             "detect_s": self.detect_s}
        if self.connect_failover_s is not None:
            d["connect_failover_s"] = self.connect_failover_s
        return d


def _one(item: Any, where: str) -> Fault:
    if isinstance(item, Fault):
        return item
    if not isinstance(item, dict):
        raise FaultError(f"{where} must be a dict {{kind, region, start_s, duration_s[, detect_s, "
                         f"connect_failover_s]}}, got {item!r}")
    extra = sorted(set(item) - set(_FIELDS))
    if extra:
        raise FaultError(f"{where}: unknown field(s) {extra}; a fault has {', '.join(_FIELDS)}")
    missing = [k for k in ("kind", "region", "start_s", "duration_s") if k not in item]
    if missing:
        raise FaultError(f"{where}: missing {missing}")
    return Fault(*_checked(item["kind"], item["region"], item["start_s"], item["duration_s"],
                           item.get("detect_s", DETECT_S), where, item.get("connect_failover_s")))


def check_faults(items: Any, *, duration_s: Optional[float] = None,
                 regions: Optional[Sequence[str]] = None) -> Tuple[Fault, ...]:
    """``items`` (dicts or :class:`Fault`) as Faults, or a :class:`FaultError` naming the first bad one: an
    unknown field or kind, a region not in ``regions``, a window outside ``[0, duration_s]``, a duration <= 0,
    two windows of the same region that overlap (one fault per region at a time)."""
    if items is None:
        return ()
    if isinstance(items, (dict, str)) or not isinstance(items, Iterable):
        raise FaultError(f"faults must be a list of faults, got {items!r}")
    out = tuple(_one(x, f"faults[{i}]") for i, x in enumerate(items))
    for i, f in enumerate(out):
        if regions is not None and f.region not in regions:
            raise FaultError(f"faults[{i}].region: unknown region {f.region!r}; the network's regions: "
                             f"{', '.join(regions)}")
        if duration_s is not None and f.end_s > duration_s:
            raise FaultError(f"faults[{i}]: its window [{f.start_s:g}, {f.end_s:g}) s is outside the run "
                             f"[0, {duration_s:g}) s (sim.duration_s)")
        for j in range(i):
            g = out[j]
            if g.region == f.region and f.start_s < g.end_s and g.start_s < f.end_s:
                raise FaultError(f"faults[{j}] and faults[{i}] overlap on region {f.region!r} "
                                 f"([{g.start_s:g}, {g.end_s:g}) and [{f.start_s:g}, {f.end_s:g}) s): one fault per "
                                 "region at a time")
    return out


class FaultModel:
    """The faults of one simulation (module docstring). The simulator calls :meth:`install` once before its
    loop, :meth:`client_lb` for every send, :meth:`on_sent` for every new request, :meth:`reaches` and
    :meth:`call_failed` before a forward or a dispatch, and :meth:`result` at the end."""

    def __init__(self, sim, faults: Sequence[Fault]):
        self.sim = sim
        net = sim.net
        self.faults = check_faults(faults, regions=net.regions)
        self.down: set = set()  # regions in an outage now
        self.cut: set = set()  # regions partitioned now
        self.parked: List[Any] = []  # requests waiting at their clients for the failover
        self.connecting: set = set()  # client regions whose connect failover (connect_failover_s) is due
        self.c = {"fault_lost": 0, "fault_client_waits": 0, "fault_failed_over": 0, "fault_call_failures": 0,
                  "fault_reroutes": 0}
        if any(f.connect_failover_s is not None for f in self.faults):
            self.c["fault_connect_failovers"] = 0
        #: (LB name, peer region) -> [open until, failures]: the circuits of peers a forward could not reach
        self.circuits: Dict[Tuple[str, str], List[float]] = {}
        dep = sim.dep
        self.central: List[Any] = []
        self.standby_region: Optional[str] = None
        if dep.lb_kind == "central":
            primary = sim.lbs[dep.central_region]
            self.central = [primary]
            self.standby_region = dep.standby()
            if self.standby_region is not None:
                self.central.append(sim.central_lb(self.standby_region, f"standby@{self.standby_region}"))
        self.all_lbs = list(sim.lbs.values()) + self.central[1:]
        # per fault: requests sent (first send) in the window, before / after detect_s, and by its region's clients
        self.sent = [[0, 0, 0, 0] for _ in self.faults]
        self.lost = [0 for _ in self.faults]
        self.normal = {r: self._choose(r) for r in net.regions}
        self.table = dict(self.normal)

    # ------------------------------------------------------------------ reachability
    def reaches(self, a: str, b: str) -> bool:
        """Whether a machine in region ``a`` can reach one in region ``b`` now (both up, same side of any cut)."""
        if a in self.down or b in self.down:
            return False
        cut = self.cut
        return a == b or (a not in cut and b not in cut)

    def client_reaches(self, client: str, region: str) -> bool:
        """Whether a client of region ``client`` can reach a machine in ``region`` now (clients never go down)."""
        if region in self.down:
            return False
        cut = self.cut
        return client == region or (client not in cut and region not in cut)

    def _choose(self, client: str):
        """The LB a client of ``client`` is sent to now (None: none it can reach); module docstring."""
        sim = self.sim
        if self.central:
            for lb in self.central:
                if not lb.down and self.client_reaches(client, lb.region):
                    return lb
            return None
        own = sim.lbs.get(client)
        if own is not None and not own.down and self.client_reaches(client, own.region):
            return own
        cands = [r for r, lb in sim.lbs.items() if not lb.down and self.client_reaches(client, r)]
        return sim.lbs[sim.net.nearest(client, cands)] if cands else None

    # ------------------------------------------------------------------ the simulator's hooks
    def install(self, handlers: tuple) -> tuple:
        """Schedule every fault's begin / end and the failover and failback decisions; return the event
        handlers with this model's guards (messages across a cut, events of what is down, lost requests) and
        its own events (``FAULT``, ``CALL_FAILED``)."""
        push = self.sim.push
        for f in self.faults:
            push(f.start_s, FAULT, self._begin, f)
            push(f.start_s + f.detect_s, FAULT, self._reroute, f)
            push(f.end_s, FAULT, self._end, f)
            push(f.end_s + f.detect_s, FAULT, self._reroute, f)
        h = list(handlers)
        for kind, guard in self._guards().items():
            h[kind] = _guarded(h[kind], guard)
        for kind, fn in ((FAULT, _call_a), (CALL_FAILED, self._on_call_failed)):
            while len(h) <= kind:
                h.append(None)
            h[kind] = fn
        return tuple(h)

    def on_sent(self, t: float, region: str) -> None:
        """A new request (first send) at ``t`` by a client of ``region``: counted in the windows it falls in."""
        for i, f in enumerate(self.faults):
            if f.start_s <= t < f.end_s:
                s = self.sent[i]
                s[0] += 1
                s[1 if t < f.start_s + f.detect_s else 2] += 1
                if region == f.region:
                    s[3] += 1

    def client_lb(self, req):
        """The LB ``req``'s client sends it to now, or None: it waits at its client for the next failover."""
        region = req.region
        lb = self.table[region]
        if lb is None or lb.down or not self.client_reaches(region, lb.region):
            self.parked.append(req)
            self.c["fault_client_waits"] += 1
            self._connect_failover_after(region)
            return None
        if lb is not self.normal[region]:
            self.c["fault_failed_over"] += 1
        return lb

    def _connect_failover_after(self, region: str) -> None:
        """A client of ``region`` could not connect to its LB: with a fault's ``connect_failover_s`` (the
        shortest of the faults on now), that client region tries the next LB that long after this first failed
        send (:meth:`_connect_failover`), instead of waiting for the health check's ``detect_s``."""
        if region in self.connecting:
            return
        now = self.sim.now
        waits = [f.connect_failover_s for f in self.faults
                 if f.connect_failover_s is not None and f.start_s <= now < f.end_s + f.detect_s]
        if waits:
            self.connecting.add(region)
            self.sim.push(now + min(waits), FAULT, self._connect_failover, region)

    def _connect_failover(self, region: str) -> None:
        """The connect failover of one client region: its LB chosen again as the health check would choose it
        (:meth:`_choose`), and its requests waiting at their clients sent there. If none is reachable they
        keep waiting (the next failed send tries again)."""
        self.connecting.discard(region)
        lb = self._choose(region)
        self.table[region] = lb
        if lb is None:
            return
        self.c["fault_connect_failovers"] += 1
        mine = [r for r in self.parked if r.region == region]
        self.parked = [r for r in self.parked if r.region != region]
        for req in mine:
            self.sim._to_lb(req)

    def call_failed(self, lb, req, target) -> None:
        """``lb``'s forward to peer LB ``target`` (or dispatch to replica ``target``) cannot connect: the LB
        learns it one round trip later (``_on_call_failed``); nothing reached the other side."""
        sim = self.sim
        self.c["fault_call_failures"] += 1
        sim.push(sim.now + 2.0 * sim.one_way(lb.region, target.region), CALL_FAILED, lb, (req, target))

    def open_circuits(self, lb) -> None:
        """After a peer table: the peers whose circuit is open stay unavailable (Serve: ``PeerMesh._on_table``)."""
        now = self.sim.now
        for (name, peer), (until, _n) in self.circuits.items():
            if name == lb.name and until > now:
                lb.router.mark_unreachable(peer)

    def result(self, counters: Dict[str, Any]) -> Dict[str, Any]:
        """Adds this model's counters to ``counters``; returns the raw record :func:`fault_report` reads."""
        counters.update(self.c)
        counters["lb_queue_at_end"] += sum(len(lb.queue) for lb in self.central[1:])
        windows = []
        for f, s, lost in zip(self.faults, self.sent, self.lost):
            windows.append({**f.to_dict(), "sent": s[0], "sent_detecting": s[1], "sent_after_detect": s[2],
                            "sent_region": s[3], "lost": lost})
        return {"windows": windows, "standby_region": self.standby_region}

    # ------------------------------------------------------------------ fault events
    def _begin(self, f: Fault) -> None:
        sim = self.sim
        if f.kind == "outage":
            self.down.add(f.region)
        else:
            self.cut.add(f.region)
        self._lose_broken()
        if f.kind == "outage":
            gone = set()  # ids of the machines that crash
            for lb in self.all_lbs:
                if lb.region == f.region:
                    lb.down = True
                    gone.add(id(lb))
            for rep in sim.replicas.values():
                if rep.region == f.region:
                    rep.down = True
                    rep.stepping = False
                    rep.engine = make_engine(sim.profile)  # what it held is gone; it restarts empty
                    gone.add(id(rep))
            heap = sim._heap  # the crashed machines' own events (steps, reports, timers, messages to them)
            heap[:] = [e for e in heap if id(e[3]) not in gone]
            heapify(heap)
        for lb in self.all_lbs:
            if not lb.down:
                lb.pump()

    def _end(self, f: Fault) -> None:
        sim = self.sim
        if f.kind == "partition":
            self.cut.discard(f.region)
            return
        self.down.discard(f.region)
        now = sim.now
        for lb in self.all_lbs:
            if lb.region == f.region:
                lb.down = False
                if lb.ingress and sim._forwarding:  # its registry link and RTT probes start again
                    sim.push(now, HEARTBEAT, lb)
                    sim.push(now, RTT_PROBE, lb, 0)
        for rep in sim.replicas.values():
            if rep.region == f.region:
                rep.down = False
                sim.push(now, STATS_MEASURE, rep)

    def _reroute(self, _f: Fault) -> None:
        """The failover / failback: clients' LBs and central LBs' targets chosen again (module docstring); the
        requests waiting at their clients are sent."""
        sim = self.sim
        self.c["fault_reroutes"] += 1
        self.table = {r: self._choose(r) for r in sim.net.regions}
        for lb in self.central:
            if lb.down:
                continue
            targets = [rid for rid, rep in sim.replicas.items() if self.reaches(lb.region, rep.region)]
            if targets != list(lb.policy.targets):
                lb.policy.set_targets(targets)
            lb.pump()
        parked, self.parked = self.parked, []
        for req in parked:
            sim._to_lb(req)

    def _on_call_failed(self, lb, item) -> None:
        req, target = item
        if not isinstance(target, RegionLB):  # a replica: its dispatch is forgotten, it leaves the targets
            lb.policy.on_complete(req.rid, target.id, self.sim.now, ok=False, req=req.rreq)
            if not lb.down:
                lb.policy.set_targets([t for t in lb.policy.targets if t != target.id])
        elif not lb.down:  # a peer LB: unavailable now, and its circuit opens
            key = (lb.name, target.region)
            n = self.circuits[key][1] + 1 if key in self.circuits else 1
            self.circuits[key] = [self.sim.now + min(BREAKER_MAX_S, BREAKER_BACKOFF_S * 2 ** (n - 1)), n]
            lb.router.mark_unreachable(target.region)
        if lb.down or req.lost:
            return
        lb.on_arrive(req)  # decided again, as a newcomer

    # ------------------------------------------------------------------ lost requests
    def _in_system(self) -> List[Any]:
        """Every request attempt in the system now: queued at an LB, on an engine, or in a message."""
        sim = self.sim
        seen: Dict[str, Any] = {}
        for lb in self.all_lbs:
            for rid, req in lb.queue.items():
                seen[rid] = req
        for rid, req in sim._reqs.items():
            seen[rid] = req
        for _t, _s, kind, a, b in sim._heap:
            req = b if kind in (LB_ARRIVE, REP_ARRIVE) else a if kind == CLIENT_DONE else \
                b[2] if kind == STEAL_ARRIVE else b[1] if kind == STEAL_SETTLE else \
                b[0] if kind == CALL_FAILED else None
            if req is not None:
                seen[req.rid] = req
        return [r for r in seen.values() if not r.lost]

    def _broken(self, req) -> bool:
        entry, at = req.entry, req.lb
        if entry is None:
            return False
        route = [entry.region] if at is entry or at is None else [entry.region, at.region]
        if req.replica is not None:
            route.append(req.replica.region)
        if not self.client_reaches(req.region, route[0]):
            return True
        return any(not self.reaches(a, b) for a, b in zip(route, route[1:])) or route[-1] in self.down

    def _lose_broken(self) -> None:
        for req in self._in_system():
            if self._broken(req):
                self._lose(req)

    def _lose(self, req) -> None:
        """``req`` is lost (module docstring): out of its queue and engine, forgotten by its LB, sent again by its
        client ``retry_after_s`` later as a new attempt."""
        sim = self.sim
        now = sim.now
        req.lost = LOST_DONE if req.t_fin is not None else LOST
        self.c["fault_lost"] += 1
        for i, f in enumerate(self.faults):
            if f.start_s <= now < f.end_s:
                self.lost[i] += 1
        at = req.lb
        if at is not None and req.rid in at.queue and at.queue[req.rid] is req:
            at.queue.remove(req.rid)
        if req.lost == LOST and req.replica is not None:
            req.serve_lb.policy.on_complete(req.rid, req.replica.id, now, ok=False, req=req.rreq)
            if not req.replica.down:
                req.replica.engine.abort(req.rid, now)
        for lb in self.all_lbs:  # a stolen request lost on its way: its victim stops counting it
            v = lb.victim
            if v is not None:
                for thief, d in list(v.in_flight.items()):
                    if req.rid in d:
                        v.settle(thief, req.rid, True)
        sim.push(now + sim.settings.retry_after_s, RETRY, sim.new_attempt(req))

    # ------------------------------------------------------------------ guards
    def _guards(self) -> Dict[int, Any]:
        """Per event kind, a guard ``(a, b) -> True`` that drops the event (module docstring)."""
        sim = self.sim
        reach = self.reaches

        def reg_leg(lb, item, there: bool) -> bool:
            if lb.down:
                return True
            where = item[2]  # the registry's region (the primary's or a standby's)
            a, b = (lb.region, where) if there else (where, lb.region)
            if reach(a, b):
                return False
            if where == sim.registry_region:  # lost: the primary's link ticks again (it paces the ticks)
                sim.push(max(item[1] + sim.settings.heartbeat_period_s, sim.now), HEARTBEAT, lb)
            return True

        def ping(lb, item) -> bool:
            if lb.down:
                return True
            if reach(lb.region, item[0]):
                self.circuits.pop((lb.name, item[0]), None)  # the peer answered: its circuit closes
                return False
            lb.next_probe(item[2])  # no answer: on to the next peer
            return True

        def arrive(where, req) -> bool:  # a request reaching a machine that is down is lost (never silently)
            if not req.lost and where.down:
                self._lose(req)
            return bool(req.lost)

        lb_down = _lb_down
        return {
            LB_ARRIVE: arrive,
            REP_ARRIVE: arrive,
            STEP_END: _rep_down, STEP_WAKE: _rep_down, STATS_MEASURE: _rep_down,
            LB_DONE: lambda lb, req: lb.down or req.lost == LOST,
            CLIENT_DONE: lambda req, _b: bool(req.lost),
            RETRY: lambda req, _b: bool(req.lost),
            STATS_DELIVER: lambda lb, item: lb.down or not reach(sim.replicas[item[0]].region, lb.region),
            HEARTBEAT: lb_down, RTT_PROBE: lb_down, LB_TIMEOUT: lb_down,
            REG_ARRIVE: lambda lb, item: reg_leg(lb, item, True),
            REG_REPLY: lambda lb, item: reg_leg(lb, item, False),
            PING_REPLY: ping,
            STEAL_OFFER: lambda lb, item: lb.down or not reach(item[0].region, lb.region),
            STEAL_ANSWER: lambda lb, item: lb.down or not reach(item[0], lb.region),
            STEAL_ARRIVE: lambda lb, item: arrive(lb, item[2]),
            STEAL_SETTLE: lambda lb, item: lb.down or bool(item[1].lost),
        }


def _lb_down(lb, _b) -> bool:
    return lb.down


def _rep_down(rep, _b) -> bool:
    return rep.down


def _call_a(fn, b) -> None:
    fn(b)


def _guarded(handler, guard):
    def run(a, b):
        if not guard(a, b):
            handler(a, b)
    return run


# ---------------------------------------------------------------------------------------- figures
def window_figures(rows: List[tuple], t0: float, t1: float, sent: int, slos: Sequence[float] = REPORT_SLOS,
                   region: Optional[str] = None) -> Dict[str, Any]:
    """Figures of the requests first sent in ``[t0, t1)`` (``sent`` of them; by clients of ``region`` if given),
    from the answered ``rows`` (``SimResult.requests``, and ``unfinished``: still decoding at the cut-off, their
    first token come): ``sent``, ``served``, ``p99_ttft_s`` (unserved ones
    infinite; None if it is), ``by_slo[f"{slo:g}"]``: ``attainment`` (served within the SLO / sent) and
    ``goodput_rps`` (served within it per second of the window)."""
    ttft = [r[1] for r in rows if t0 <= r[0] < t1 and (region is None or r[7] == region)]
    served = len(ttft)
    missed = max(0, sent - served)
    p99 = percentile(ttft + [_MISS] * missed, (99,))[0] if sent else None
    span = t1 - t0
    out: Dict[str, Any] = {"t0": t0, "t1": t1, "sent": sent, "served": served,
                           "p99_ttft_s": p99 if p99 is not None and p99 < _MISS / 2 else None, "by_slo": {}}
    for slo in slos:
        ok = sum(1 for x in ttft if x <= slo)
        out["by_slo"][f"{slo:g}"] = {"attainment": ok / sent if sent else None,
                                     "goodput_rps": ok / span if span > 0 else None}
    return out


def fault_report(result, slos: Sequence[float] = REPORT_SLOS) -> Optional[Dict[str, Any]]:
    """Attainment and goodput through each fault of a run (module docstring), or None for a run without faults.
    ``{"run": figures over the whole run, "windows": [per fault: its fields, "lost", "all": figures of the
    window, "detecting" / "after_detect": before / after detect_s, "region_clients": the fault region's
    clients]}``;
    figures: ``sent``, ``served``, ``p99_ttft_s`` (None: infinite), ``by_slo[slo]``: ``attainment`` and
    ``goodput_rps``. The whole run's goodput is per second of ``duration_s``."""
    raw = getattr(result, "faults", None)
    if not raw:
        return None
    rows = result.answered()[0]  # by their first token
    dur = float(result.config["duration_s"])
    out: Dict[str, Any] = {"slos": list(slos), "standby_region": raw["standby_region"],
                           "run": window_figures(rows, 0.0, dur, result.counters["requests_sent"], slos), "windows": []}
    for w in raw["windows"]:
        t0, t1, td = w["start_s"], w["start_s"] + w["duration_s"], min(w["start_s"] + w["detect_s"],
                                                                         w["start_s"] + w["duration_s"])
        d = {k: w[k] for k in ("kind", "region", "start_s", "duration_s", "detect_s", "lost")}
        d["all"] = window_figures(rows, t0, t1, w["sent"], slos)
        d["detecting"] = window_figures(rows, t0, td, w["sent_detecting"], slos)
        d["after_detect"] = window_figures(rows, td, t1, w["sent_after_detect"], slos)
        d["region_clients"] = window_figures(rows, t0, t1, w["sent_region"], slos, region=w["region"])
        out["windows"].append(d)
    return out


# ---------------------------------------------------------------------------------------- runs
def peak_hour(rates: Dict[str, Sequence[float]], region: str) -> int:
    """The UTC hour of ``region``'s peak in ``{region: 24 hourly rates}`` (the first, if tied)."""
    xs = list(rates[region])
    return max(range(len(xs)), key=lambda h: (xs[h], -h))


def peak_fault_run(run: Dict[str, Any], region: str, kind: str = "outage", *, hour_s: float = 60.0,
                   context_h: int = 1, detect_s: float = DETECT_S, tail_s: float = 20.0,
                   connect_failover_s: Optional[float] = None) -> Dict[str, Any]:
    """A copy of ``run`` (a geo-diurnal run dict: its workload's ``kw`` has ``curves``) that simulates only
    ``region``'s peak hour and ``context_h`` hours either side (clipped to the day), each hour ``hour_s``
    simulated seconds (``day_s = 24 * hour_s``), then ``tail_s``, with ``kind`` (outage / partition) of
    ``region`` over the whole peak hour, noticed after ``detect_s`` (and with ``connect_failover_s``, a client
    that cannot connect tries the next LB that much later). The same run without the fault is
    ``run_with_faults(result, [])``-equivalent: drop ``sim.faults``."""
    run = copy.deepcopy(run)
    kw = run["workload"]["kw"]
    if "curves" not in kw or region not in kw["curves"]:
        raise FaultError(f"peak_fault_run: the run's workload has no demand curve for region {region!r}")
    h = peak_hour(kw["curves"], region)
    h0, h1 = max(0, h - context_h), min(24, h + 1 + context_h)
    kw["day_s"] = 24.0 * hour_s
    kw["hours"] = [h0, h1]
    run["sim"]["duration_s"] = (h1 - h0) * hour_s + tail_s
    fault = {"kind": kind, "region": region, "start_s": (h - h0) * hour_s, "duration_s": hour_s, "detect_s": detect_s}
    if connect_failover_s is not None:
        fault["connect_failover_s"] = connect_failover_s
    run["sim"]["faults"] = [fault]
    return run
