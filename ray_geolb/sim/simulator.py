"""Discrete-event multi-region simulator that drives the shipped policy core in virtual time.

One event heap of ``(time, seq, kind, a, b)``; ``seq`` is a global counter, so ties are broken by
scheduling order and a run is a pure function of (workload, deployment, config): no wall clock, no
Python ``hash()`` of strings, no dependence on set iteration order. Same seed -> byte-identical JSON.

What is simulated
-----------------
* **Replicas**: one :class:`~ray_geolb.engine.engine.EngineModel` each. A replica with work is stepped
  at ``max(now, engine.next_ready_time())``; a step's results (first tokens -> TTFT, finished
  requests -> completion) are applied at ``now + duration`` and the next step starts right then.
  One event per engine step, never per token.
* **Stats reach the LB late** (Ray Serve: the controller polls ``record_routing_stats`` every
  ``request_routing_stats_period_s`` +-10 % and broadcasts): every ``stats_period_s`` (jittered by
  ``stats_jitter`` from the seeded RNG, random initial phase) each replica's ``engine.stats()`` is
  measured and delivered to its LB(s) ``stats_lag_s`` + one-way network delay later as a
  :class:`~ray_geolb.policy.availability.ReplicaStats` whose ``timestamp`` is the measurement time.
* **Load balancers**: each LB is a :class:`~ray_geolb.policy.region.router.RegionRouter` around a local
  policy built by :func:`~ray_geolb.policy.factory.build_policy`. Each LB has a strict FCFS queue: the
  head is decided (local / forward / hold / reject); on *hold* nothing behind it may overtake. The
  queue is retried whenever something changes at that LB (arrival, stats delivery, completion seen
  by the LB, heartbeat received). A central LB is a RegionRouter with ``max_hops=0`` whose local
  policy sees every replica of every region.
* **Heartbeats** between per-region LBs every ``heartbeat_s``, delivered after the one-way delay,
  carrying (available replicas, LB queue length, send time, RTT) and the router's ``extra``
  (queued prompt tokens at the LB, replica count, its learned t_p). Each heartbeat also carries an
  **RTT probe**: the reply returns one RTT later and the sender calls ``RegionRouter.observe_rtt``
  with the measured sample (the router's one RTT estimate, an EWMA the 'cost' selector reads).
* **Feedback to the policies**: before deciding its head request an LB calls
  ``router.set_queue(0, 0.0)`` (FCFS: nothing is queued ahead of the head); on completion
  the serving LB calls ``policy.on_complete(..., ttft_s=...)`` with the TTFT *as the LB sees it*
  (first token at the replica + replica->LB delay - dispatch time), so the online t_p regression
  learns, and ``router.on_local_complete(now)`` (the 'cost' selector's local drain rate). A central
  LB with ``DeploymentSpec.rtt_aware`` (GORGO-proxy) gets
  ``policy.rtt_of_target(target, req)`` = RTT(client, LB) + RTT(LB, replica's region).
* **Network**: client -> its LB -> (peer LB) -> replica, each hop paying the one-way delay of
  :class:`~ray_geolb.engine.network.RegionNetwork`; tokens come back along the same path, so TTFT and
  end-to-end latency include every hop twice. The LB that dispatched a request learns of its
  completion one replica->LB delay after the engine finished it.
* **Clients**: closed loop (each client runs one program at a time, a program's calls respect
  ``depends_on``, independent calls - ToT siblings - are sent concurrently; think time between
  programs) or open loop (program arrivals at given times, lazily consumed).

Ending a run
------------
No new program starts at or after ``duration_s`` (nor after ``max_programs`` programs). With
``drain=False`` (default) the run is **cut off** at ``duration_s`` (or earlier if everything is
done); with ``drain=True`` the requests in flight are completed. Only requests whose response
reached the client are counted (throughput, latencies); ``in_flight_at_end`` counts the rest, so
``requests_sent == requests_completed + requests_rejected + in_flight_at_end``.

A request too long for the engine (``prompt + output > max_model_len``, more KV blocks than the
cache, or, on an SGLang engine, a prompt plus its output reservation larger than the cache:
:func:`~ray_geolb.engine.engine.request_fits`) is *rejected at the client* and counted in
``requests_rejected`` (never silently dropped); its program continues as if it had been answered.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ray_geolb.engine.admission import request_fits
from ray_geolb.engine.engine import EngineRequest
from ray_geolb.engine.factory import make_engine
from ray_geolb.engine.profiles import get_profile
from ray_geolb.engine.tokens import prompt_blocks
from ray_geolb.policy.availability import ReplicaStats
from ray_geolb.policy.base import RouteRequest
from ray_geolb.policy.factory import parse_policy_config, policy_class
from ray_geolb.policy.hold_queue import HoldQueue
from ray_geolb.policy.region.config import TwoLayerConfig
from ray_geolb.policy.region.router import PeerState, RegionRouter

from .deploy import DeploymentSpec
from .observe import IdealPrefixCache, LoadSampler

__all__ = ["SimConfig", "Simulator", "SimResult", "simulate"]

# event kinds
_LB_ARRIVE, _REP_ARRIVE, _STEP_END, _STEP_WAKE, _LB_DONE, _CLIENT_DONE = 0, 1, 2, 3, 4, 5
_STATS_MEASURE, _STATS_DELIVER, _HEARTBEAT, _HB_DELIVER, _PROG_START, _OPEN_ARRIVAL, _SAMPLE, _PING_REPLY = (
    6, 7, 8, 9, 10, 11, 12, 13)

_BLOCK_CACHE_MAX = 4096


@dataclass
class SimConfig:
    duration_s: float = 120.0
    seed: int = 0
    max_programs: Optional[int] = None
    drain: bool = False
    sample_period_s: float = 0.5
    chars_per_token: float = 4.0
    keep_requests: bool = True  # keep per-request records (needed by metrics; the big bench turns it off)

    def __post_init__(self):
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s!r}")
        if self.max_programs is not None and self.max_programs < 1:
            raise ValueError(f"max_programs must be >= 1, got {self.max_programs!r}")
        if not self.sample_period_s > 0:
            raise ValueError(f"sample_period_s must be > 0, got {self.sample_period_s!r}")


class _Replica:
    __slots__ = ("id", "region", "engine", "stepping", "lbs", "zero_steps")

    def __init__(self, rid, region, engine):
        self.id = rid
        self.region = region
        self.engine = engine
        self.stepping = False
        self.lbs: List["_LB"] = []
        self.zero_steps = 0


def _prompt_tokens(req: "_Req") -> int:
    return req.prompt


class _LB:
    __slots__ = ("name", "region", "router", "queue", "peers", "policy")

    def __init__(self, name, region, router):
        self.name = name
        self.region = region
        self.router: RegionRouter = router
        self.policy = router.local
        self.queue: HoldQueue = HoldQueue(_prompt_tokens)  # FCFS, by request id, with the prompt-token sum
        self.peers: List["_LB"] = []


class _Run:
    """One program in progress."""

    __slots__ = ("program", "client", "remaining", "children", "n_left", "t_start", "calls_text")

    def __init__(self, program, client, t_start):
        self.program = program
        self.client = client
        calls = program.calls
        self.remaining = [len(c.depends_on) for c in calls]
        ch: List[List[int]] = [[] for _ in calls]
        for i, c in enumerate(calls):
            for d in c.depends_on:
                ch[d].append(i)
        self.children = ch
        self.n_left = len(calls)
        self.t_start = t_start


class _Req:
    __slots__ = ("rid", "run", "ci", "region", "rreq", "prompt", "out", "hashes", "t_send", "t_lb",
                 "lb_wait", "path", "serve_lb", "replica", "t_first", "t_fin", "cross", "held", "t_disp",
                 "max_tokens", "ideal_hit")

    def __init__(self, rid, run, ci, region, rreq, prompt, out, hashes, t_send, max_tokens=None):
        self.rid = rid
        self.run = run
        self.ci = ci
        self.region = region
        self.rreq = rreq
        self.prompt = prompt
        self.out = out
        self.hashes = hashes
        self.t_send = t_send
        self.t_lb = 0.0
        self.lb_wait = 0.0
        self.path = 0.0  # sum of one-way delays on the way to the replica (= way back)
        self.serve_lb = None
        self.replica = None
        self.t_first = None
        self.t_fin = None
        self.cross = False
        self.held = False
        self.t_disp = 0.0  # when the serving LB dispatched it to the replica
        self.max_tokens = max_tokens  # the client's max_tokens (None: not sent)


@dataclass
class SimResult:
    """Raw outcome of a run; :func:`ray_geolb.sim.metrics.summarize` turns it into metrics."""

    config: dict
    deployment: dict
    workload: dict
    elapsed_s: float
    # per completed request: (t_send, ttft, e2e, prompt_tokens, output_tokens, lb_wait, cross, client_region, replica)
    requests: List[tuple]
    counters: Dict[str, int]
    engine_stats: Dict[str, dict]
    samples: Dict[str, List[float]]
    decisions: Dict[str, int]
    #: the ideal prefix-hit bound of this run's trace and the engines' load (sim/observe.py)
    ideal: Optional[dict] = None
    load: Optional[dict] = None


class Simulator:
    def __init__(self, workload, deployment: DeploymentSpec, config: Optional[SimConfig] = None,
                 trace: Optional[Callable[[str, dict], None]] = None,
                 progress: Optional[Callable[[float], None]] = None):
        self.workload = workload
        self.dep = deployment
        self.cfg = config or SimConfig()
        self.trace = trace
        self.progress = progress
        self.net = deployment.network
        self.rng = random.Random(f"sim:{self.cfg.seed}")
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self._nreq = 0
        self._blocks_cache: Dict[str, Tuple[int, list]] = {}
        self.profile = get_profile(deployment.profile)
        self._block_tokens = self.profile.block_tokens
        self._ow_cache: Dict[Tuple[str, str], float] = {}
        self._build()

    # ------------------------------------------------------------------ setup
    def _ow(self, a: str, b: str) -> float:
        k = (a, b)
        v = self._ow_cache.get(k)
        if v is None:
            v = self._ow_cache[k] = self.net.one_way_s(a, b)
        return v

    def _policy(self, targets: List[str]):
        spec = self.dep.policy
        cfg = parse_policy_config(spec)
        if isinstance(spec, str) or (isinstance(spec, dict) and "seed" not in spec):
            cfg = cfg.model_copy(update={"seed": self.cfg.seed})
        cls = policy_class(cfg.name)
        kw: Dict[str, Any] = {"cache_probe": self._cache_probe}
        if "clock" in inspect.signature(cls.__init__).parameters:
            kw["clock"] = self._clock
        return cls(cfg, targets=targets, **kw)

    def _clock(self) -> float:
        return self.now

    def _cache_probe(self, target, req: RouteRequest) -> int:
        blocks = req.driver_data  # the prompt's KV block hashes (set in _send)
        return self.replicas[target].engine.cached_prefix_tokens(blocks if blocks is not None else ())

    def _build(self) -> None:
        dep = self.dep
        self.replicas: Dict[str, _Replica] = {}
        by_region: Dict[str, List[str]] = {}
        for region, n in dep.replicas.items():
            for i in range(n):
                rid = f"{region}-{i}"
                self.replicas[rid] = _Replica(rid, region, make_engine(self.profile))
                by_region.setdefault(region, []).append(rid)
        self.lbs: Dict[str, _LB] = {}
        tl = dict(dep.two_layer)
        if dep.lb_kind == "central":
            tl["max_hops"] = 0
            region = dep.central_region
            router = RegionRouter(TwoLayerConfig(region=region, **tl), self._policy(list(self.replicas)),
                                  clock=self._clock)
            lb = self.lbs[region] = _LB(f"central@{region}", region, router)
            if dep.rtt_aware:
                if not hasattr(router.local, "rtt_of_target"):
                    raise ValueError(f"deployment {dep.system!r}: rtt_aware needs a policy with an "
                                     f"rtt_of_target hook (a cost policy), got {type(router.local).__name__}")
                router.local.rtt_of_target = self._central_rtt_fn(region)
            for r in self.replicas.values():
                r.lbs.append(lb)
        else:
            if dep.lb_kind == "region-local":
                tl["max_hops"] = 0
            for region in dep.lb_regions():
                router = RegionRouter(TwoLayerConfig(region=region, **tl), self._policy(by_region[region]),
                                      clock=self._clock)
                lb = self.lbs[region] = _LB(region, region, router)
                for rid in by_region[region]:
                    self.replicas[rid].lbs.append(lb)
            for lb in self.lbs.values():
                lb.peers = [p for p in self.lbs.values() if p is not lb]
        self._forwarding = dep.lb_kind == "per-region" and len(self.lbs) > 1 and \
            tl.get("max_hops", 1) >= 1
        # counters
        self.c = {"requests_sent": 0, "requests_completed": 0, "requests_rejected": 0, "programs_started": 0,
                  "programs_completed": 0, "forwards": 0, "lb_holds": 0, "engine_steps": 0, "stats_reports": 0,
                  "heartbeats": 0}
        self.decisions: Dict[str, int] = {}
        self.records: List[tuple] = []
        self.samples = {"t": [], "outstanding_cv": [], "outstanding_max_min": [], "outstanding_spread": [],
                        "lb_queue": []}
        self._inflight = 0
        self._pending_starts = 0
        self._stop_new = False
        self._open_iter: Optional[Iterator] = None
        self._out_of_programs = False
        self._reqs: Dict[str, _Req] = {}
        self.ideal = IdealPrefixCache(self._block_tokens)
        self.load = LoadSampler()

    def _central_rtt_fn(self, lb_region: str):
        """GORGO-proxy's network term: the RTT a request pays on its way client -> proxy -> replica.

        The client->proxy leg is the same for every replica (so it does not change the argmin) but
        it is part of what the request really pays, so the cost stays an honest TTFT estimate."""
        replicas = self.replicas
        net = self.net

        def rtt(target, req):
            client = req.region if req.region is not None else lb_region
            return net.rtt_s(client, lb_region) + net.rtt_s(lb_region, replicas[target].region)

        return rtt

    def _push(self, t: float, kind: int, a=None, b=None) -> None:
        self._seq += 1
        heappush(self._heap, (t, self._seq, kind, a, b))

    # ------------------------------------------------------------------ run
    def run(self) -> SimResult:
        cfg = self.cfg
        dep = self.dep
        rng = self.rng
        # periodic events, random initial phases
        for rep in self.replicas.values():
            self._push(rng.random() * dep.stats_period_s, _STATS_MEASURE, rep)
        if self._forwarding:
            for lb in self.lbs.values():
                self._push(rng.random() * dep.heartbeat_s, _HEARTBEAT, lb)
        self._push(cfg.sample_period_s, _SAMPLE)
        wl = self.workload
        if wl.closed is not None:
            self._next_prog_idx = {r: 0 for r in wl.closed.clients}
            for region in wl.closed.clients:
                if region not in self.net:
                    raise ValueError(f"workload region {region!r} is not in the network {self.net.regions}")
            cid = 0
            for region, n in wl.closed.clients.items():
                for _ in range(n):
                    self._pending_starts += 1
                    self._push(0.0, _PROG_START, (region, cid))
                    cid += 1
        else:
            self._open_iter = iter(wl.open.arrivals)
            self._schedule_next_arrival()

        end = cfg.duration_s
        heap = self._heap
        handlers = (self._on_lb_arrive, self._on_rep_arrive, self._on_step_end, self._on_step_wake,
                    self._on_lb_done, self._on_client_done, self._on_stats_measure, self._on_stats_deliver,
                    self._on_heartbeat, self._on_hb_deliver, self._on_prog_start, self._on_open_arrival,
                    self._on_sample, self._on_ping_reply)
        drain = cfg.drain
        last = 0.0
        progress = self.progress
        next_progress = 0.0
        while heap:
            t, _, kind, a, b = heap[0]
            if t > end and not drain:
                break
            if self._inflight == 0 and self._pending_starts == 0 and self._open_iter is None and \
                    (self._stop_new or self._out_of_programs):
                break
            heappop(heap)
            self.now = t
            handlers[kind](a, b)
            if kind <= _CLIENT_DONE:
                last = t
            if progress is not None and t >= next_progress:
                progress(min(t, end))
                next_progress = t + end / 200.0
        finished = self._inflight == 0 and not self._pending_starts and self._open_iter is None and \
            (self._stop_new or self._out_of_programs)
        # throughput denominator: the cut-off time, or the last completion if all work ended earlier
        # (or, when draining, after the cut-off)
        elapsed = (min(last, end) if not drain else last) if finished else (end if not drain else max(last, end))
        if progress is not None:
            progress(end)
        return self._result(max(elapsed, 1e-9))

    # ------------------------------------------------------------------ clients / programs
    def _on_prog_start(self, a, b):
        region, cid = a
        self._pending_starts -= 1
        if self._can_start():
            stream = self.workload.closed.programs[region]
            idx = self._next_prog_idx[region]
            try:
                prog = stream[idx]
            except IndexError:
                self._check_exhausted()
                return
            self._next_prog_idx[region] = idx + 1
            self._start_program(prog, (region, cid))

    def _can_start(self) -> bool:
        if self._stop_new:
            return False
        if self.now >= self.cfg.duration_s:
            self._stop_new = True
            return False
        mp = self.cfg.max_programs
        if mp is not None and self.c["programs_started"] >= mp:
            self._stop_new = True
            return False
        return True

    def _check_exhausted(self):
        # every region's stream ran out: no program can ever start again
        wl = self.workload.closed
        for region, stream in wl.programs.items():
            if wl.clients.get(region, 0) and (stream.limit is None or self._next_prog_idx[region] < stream.limit):
                return
        self._out_of_programs = True

    def _schedule_next_arrival(self):
        try:
            t, prog = next(self._open_iter)
        except StopIteration:
            self._open_iter = None
            self._out_of_programs = True
            return
        if t >= self.cfg.duration_s:
            self._open_iter = None
            self._stop_new = True
            return
        self._push(max(t, self.now), _OPEN_ARRIVAL, prog)

    def _on_open_arrival(self, prog, b):
        if self._can_start():
            self._start_program(prog, None)
            self._schedule_next_arrival()
        else:
            self._open_iter = None

    def _start_program(self, prog, client):
        self.c["programs_started"] += 1
        run = _Run(prog, client, self.now)
        if not prog.calls:
            self._program_done(run)
            return
        for i, c in enumerate(prog.calls):
            if not c.depends_on:
                self._send(run, i)

    def _program_done(self, run: _Run):
        self.c["programs_completed"] += 1
        if run.client is not None:
            self._pending_starts += 1
            self._push(self.now + self.workload.closed.think_time_s, _PROG_START, run.client)

    def _blocks(self, text: str) -> Tuple[int, list]:
        v = self._blocks_cache.get(text)
        if v is None:
            v = prompt_blocks(text, self.cfg.chars_per_token, self._block_tokens)
            cache = self._blocks_cache
            if len(cache) >= _BLOCK_CACHE_MAX:
                del cache[next(iter(cache))]
            cache[text] = v
        return v

    def _send(self, run: _Run, ci: int):
        call = run.program.calls[ci]
        text = call.text
        ntok, hashes = self._blocks(text)
        self._nreq += 1
        rid = f"r{self._nreq}"
        region = run.program.region
        self.c["requests_sent"] += 1
        out = call.output_tokens
        if not request_fits(self.profile, ntok, out, call.max_tokens):
            self.c["requests_rejected"] += 1
            self._count("rejected_too_long")
            self._call_done(run, ci)
            return
        rreq = RouteRequest(request_id=rid, text=text, session_key=call.session_key, prompt_tokens=ntok,
                            region=region, tenant=call.tenant, driver_data=hashes)
        req = _Req(rid, run, ci, region, rreq, ntok, out, hashes, self.now, call.max_tokens)
        req.ideal_hit = self.ideal.observe(ntok, hashes)
        self._inflight += 1
        lb = self.lbs[self.dep.lb_for_client(region)] if region not in self.lbs else self.lbs[region]
        d = self._ow(region, lb.region)
        req.path = d
        self._push(self.now + d, _LB_ARRIVE, lb, req)

    def _call_done(self, run: _Run, ci: int):
        run.n_left -= 1
        for j in run.children[ci]:
            run.remaining[j] -= 1
            if run.remaining[j] == 0:
                self._send(run, j)
        if run.n_left == 0:
            self._program_done(run)

    def _on_client_done(self, req: _Req, b):
        self._inflight -= 1
        self.c["requests_completed"] += 1
        if self.cfg.keep_requests:
            now = self.now
            self.records.append((req.t_send, req.t_first + req.path - req.t_send, now - req.t_send, req.prompt,
                                 req.out, req.lb_wait, req.cross, req.region, req.replica.id))
        self._call_done(req.run, req.ci)

    # ------------------------------------------------------------------ load balancers
    def _count(self, key: str):
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def _on_lb_arrive(self, lb: _LB, req: _Req):
        req.t_lb = self.now
        lb.queue.append(req.rid, req)
        self._pump(lb)

    def _pump(self, lb: _LB):
        q = lb.queue
        if not q:
            return
        router = lb.router
        now = self.now
        trace = self.trace
        while q:
            rid, req = q.head()
            # FCFS: what is queued at this LB *ahead of* the head request -- nothing (the cost
            # selector's Q_lb and the slot wait's 'ahead')
            ahead, ahead_tokens = q.ahead(rid)
            router.set_queue(ahead, float(ahead_tokens))
            d = router.decide(req.rreq, now)
            kind = d.kind
            if kind == "hold":
                if trace is not None:
                    trace("hold", {"lb": lb.name, "req": req.rid, "t": now, "reason": d.reason})
                if not req.held:
                    req.held = True
                    self.c["lb_holds"] += 1
                break
            q.pop_head()
            req.lb_wait += now - req.t_lb
            if kind == "local":
                rep = self.replicas[d.target]
                if trace is not None:
                    trace("local", {"lb": lb.name, "req": req.rid, "t": now, "target": d.target,
                                    "policy": lb.policy, "hops": req.rreq.hops})
                router.on_dispatch(req.rreq, d.target, now)
                self._count(f"local:{d.reason or 'local'}")
                req.serve_lb = lb
                req.replica = rep
                req.t_disp = now
                delay = self._ow(lb.region, rep.region)
                req.path += delay
                if rep.region != req.region:
                    req.cross = True
                self._push(now + delay, _REP_ARRIVE, rep, req)
            elif kind == "forward":
                peer = self.lbs[d.target]
                if trace is not None:
                    trace("forward", {"lb": lb.name, "req": req.rid, "t": now, "target": d.target,
                                      "local_available": len(lb.policy.tracker.available)})
                router.on_forward(req.rreq, d.target, now)
                self.c["forwards"] += 1
                self._count(f"forward:{d.reason}")
                req.rreq.hops += 1
                req.cross = True
                delay = self._ow(lb.region, peer.region)
                req.path += delay
                self._push(now + delay, _LB_ARRIVE, peer, req)
            else:  # reject
                self.c["requests_rejected"] += 1
                self._count(f"reject:{d.reason}")
                self._inflight -= 1
                self._call_done(req.run, req.ci)

    def _on_lb_done(self, lb: _LB, req: _Req):
        # TTFT as this LB sees it: the first token reaches it one replica->LB delay after the engine
        # produced it; minus when it dispatched the request (feeds the online t_p regression)
        ttft = None
        if req.t_first is not None:
            ttft = req.t_first + self._ow(req.replica.region, lb.region) - req.t_disp
        lb.policy.on_complete(req.rid, req.replica.id, self.now, ttft_s=ttft, ok=True, req=req.rreq)
        lb.router.on_local_complete(self.now)  # the 'cost' selector's local drain rate (stay_slot_wait)
        self._pump(lb)

    def _on_stats_measure(self, rep: _Replica, b):
        now = self.now
        dep = self.dep
        st = ReplicaStats.from_dict(rep.engine.stats(), default_timestamp=now)
        self.c["stats_reports"] += 1
        self.load.report(st.num_waiting)
        lag = dep.stats_lag_s
        for lb in rep.lbs:
            self._push(now + lag + self._ow(rep.region, lb.region), _STATS_DELIVER, lb, (rep.id, st))
        j = dep.stats_jitter
        period = dep.stats_period_s * (1.0 + (self.rng.random() * 2.0 - 1.0) * j)
        self._push(now + period, _STATS_MEASURE, rep)

    def _on_stats_deliver(self, lb: _LB, item):
        rid, st = item
        lb.policy.on_stats(rid, st)
        if self.trace is not None:
            self.trace("stats", {"lb": lb.name, "target": rid, "t": self.now, "stats": st})
        self._pump(lb)

    def _on_heartbeat(self, lb: _LB, b):
        now = self.now
        self.c["heartbeats"] += 1
        ps = lb.router.heartbeat(len(lb.queue), now, queued_tokens=float(lb.queue.tokens))
        for peer in lb.peers:
            d = self._ow(lb.region, peer.region)
            self._push(now + d, _HB_DELIVER, peer,
                       PeerState(ps.region, ps.available_replicas, ps.queue_len, ps.timestamp,
                                 rtt_s=self.net.rtt_s(lb.region, peer.region), extra=dict(ps.extra)))
            # RTT probe (a ping riding on the heartbeat): its reply comes back one RTT later
            self._push(now + 2.0 * d, _PING_REPLY, lb, (peer.region, now))
        self._push(now + self.dep.heartbeat_s, _HEARTBEAT, lb)

    def _on_ping_reply(self, lb: _LB, item):
        region, sent = item
        lb.router.observe_rtt(region, self.now - sent)

    def _on_hb_deliver(self, lb: _LB, ps: PeerState):
        lb.router.update_peer(ps)
        self._pump(lb)

    # ------------------------------------------------------------------ replicas
    def _on_rep_arrive(self, rep: _Replica, req: _Req):
        rep.engine.add_request(EngineRequest(req.rid, req.prompt, req.out, req.hashes, req.max_tokens), self.now)
        self._reqs[req.rid] = req
        if not rep.stepping:
            self._step(rep)

    def _step(self, rep: _Replica):
        now = self.now
        eng = rep.engine
        nr = eng.next_ready_time()
        if nr is None:
            rep.stepping = False
            return
        if nr > now:
            rep.stepping = True
            self._push(nr, _STEP_WAKE, rep)
            return
        out = eng.step(now)
        self.c["engine_steps"] += 1
        rep.stepping = True
        if out.duration > 0.0:
            rep.zero_steps = 0
            self._push(now + out.duration, _STEP_END, rep, out)
        else:
            rep.zero_steps += 1
            if rep.zero_steps > 1000:
                raise RuntimeError(f"replica {rep.id}: engine makes no progress at t={now}")
            self._push(now, _STEP_WAKE, rep)

    def _on_step_wake(self, rep: _Replica, b):
        self._step(rep)

    def _on_step_end(self, rep: _Replica, out):
        now = self.now
        reqs = self._reqs
        ideal = self.ideal
        for rid in out.first_tokens:
            req = reqs[rid]
            req.t_first = now
            ideal.count(req.prompt, req.ideal_hit)
        if out.finished:
            ow = self._ow
            for rid in out.finished:
                req = reqs.pop(rid)
                req.t_fin = now
                lb = req.serve_lb
                self._push(now + ow(rep.region, lb.region), _LB_DONE, lb, req)
                self._push(now + req.path, _CLIENT_DONE, req)
        self._step(rep)

    # ------------------------------------------------------------------ sampling / results
    def _on_sample(self, a, b):
        outs = [r.engine.num_unfinished for r in self.replicas.values()]
        tot = sum(outs)
        s = self.samples
        if tot > 0:
            n = len(outs)
            mean = tot / n
            var = sum((x - mean) ** 2 for x in outs) / n
            s["t"].append(self.now)
            s["outstanding_cv"].append((var ** 0.5) / mean)
            s["outstanding_max_min"].append(max(outs) / max(1, min(outs)))
            s["outstanding_spread"].append(max(outs) - min(outs))
            s["lb_queue"].append(sum(len(lb.queue) for lb in self.lbs.values()))
            self.load.sample(r.engine for r in self.replicas.values())
        self._push(self.now + self.cfg.sample_period_s, _SAMPLE)

    def _result(self, elapsed: float) -> SimResult:
        c = dict(self.c)
        c["in_flight_at_end"] = self._inflight
        c["lb_queue_at_end"] = sum(len(lb.queue) for lb in self.lbs.values())
        eng = {rid: r.engine.stats() for rid, r in self.replicas.items()}
        wl = self.workload
        return SimResult(
            config={"duration_s": self.cfg.duration_s, "seed": self.cfg.seed, "max_programs": self.cfg.max_programs,
                    "drain": self.cfg.drain},
            deployment=self.dep.to_dict(),
            workload={"name": wl.name, "description": wl.description,
                      "kind": "closed" if wl.closed is not None else "open"},
            elapsed_s=elapsed,
            requests=self.records,
            counters=c,
            engine_stats=eng,
            samples=self.samples,
            decisions=dict(self.decisions),
            ideal=self.ideal.summary(),
            load=self.load.summary(),
        )


def simulate(workload, deployment: DeploymentSpec, config: Optional[SimConfig] = None, **kw) -> SimResult:
    """Run one simulation (see :class:`Simulator`)."""
    return Simulator(workload, deployment, config, **kw).run()
