"""Discrete-event multi-region simulator that drives the shipped policy core in virtual time.

One event heap of ``(time, seq, kind, a, b)``; ``seq`` is a global counter, so ties are broken by
scheduling order and a run is a pure function of (workload, deployment, config): no wall clock, no
Python ``hash()`` of strings, no dependence on set iteration order. Same seed -> byte-identical JSON.

What is simulated (replicas, late reports, the region LBs on the one queue rule, heartbeats through the
registry, RTT probes, feedback to the policies, the network, clients), how a run starts and ends, and
what the Serve ingress does that is not simulated (:data:`SERVE_NOT_SIMULATED`): ``docs/design.md``
section 8.
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
from ray_geolb.policy.region.config import TwoLayerConfig
from ray_geolb.policy.region.registry_state import RegistryState
from ray_geolb.policy.region.router import PeerState, RegionRouter

from .deploy import DeploymentSpec
from .events import (
    CLIENT_DONE,
    HEARTBEAT,
    LB_ARRIVE,
    LB_DONE,
    OPEN_ARRIVAL,
    PROG_START,
    RETRY,
    RTT_PROBE,
    SAMPLE,
    STATS_DELIVER,
    STATS_MEASURE,
    STEP_END,
    STEP_WAKE,
)
from .faults import FaultModel, check_faults
from .observe import IdealPrefixCache, LoadSampler
from .region_lb import RegionLB

__all__ = ["SERVE_NOT_SIMULATED", "SimConfig", "Simulator", "SimResult", "simulate"]

#: What the Serve ingress has that the simulated region layer does not model, and why: each
#: ``IngressConfig`` field (``registry.<field>`` for its ``RegistryOptions``) that
#: ``Simulator.region_layer_config`` does not report, then behaviours that are no config field. The
#: comparison test requires every ``IngressConfig`` field to be either compared or named here.
SERVE_NOT_SIMULATED: Dict[str, str] = {
    "model_name": "the OpenAI model name clients address; a simulated request names no model",
    "poll_s": "how often Serve re-decides the head of its queue (20 ms); the simulator re-decides it at every "
              "event that changes what the decision reads (arrival, replica report, completion, peer table)",
    "registry.name": "the registry actor's name; the simulated registry is one object",
    "registry.namespace": "the registry actor's namespace; the simulated registry is one object",
    "registry.pin_standbys": "where a standby registry's actor is placed (pinned to its region's nodes or not); "
                             "the simulator places each standby in its region",
    "registry.timeout_s": "a registry call that cannot get through (the registry's region down, or across a cut: "
                          "sim/faults.py) is lost at once and the LB ticks again one period later; no registry is "
                          "ever slow, so nothing times out",
    "snapshot_period_s": "the regional snapshot is mirrored to the registry only so that a restarted ingress can "
                         "reload it; a simulated LB restarting after an outage (sim/faults.py) keeps its router as "
                         "it was, as if it had reloaded it",
    "default_max_tokens": "an HTTP request default; a simulated request carries its workload's own max_tokens",
    "max_tokens_limit": "HTTP request validation; simulated workloads are valid by construction",
    "first_token_timeout_s": "streams never stall in the simulator: a stream runs, or a fault loses it at once and "
                             "its client sends the request again (sim/faults.py)",
    "stream_idle_timeout_s": "streams never stall in the simulator: a stream runs, or a fault loses it at once and "
                             "its client sends the request again (sim/faults.py)",
    "max_concurrent": "an HTTP concurrency bound per ingress replica (429); simulated clients are the workload's "
                      "own and every LB queue is bounded by max_queue, which is compared",
    "tenant_header": "the HTTP header a tenant is read from; simulated requests carry no tenant (the region "
                     "layer's tenant_regions rule itself is policy code both sides run)",
    "max_body_bytes": "an HTTP input bound (413); simulated requests have no body and are valid by construction",
    "max_json_depth": "an HTTP input bound (400); simulated requests have no JSON body",
    "max_model_len": "the ingress's context-length check (400 before routing); the simulator's client rejects a "
                     "request the engine could never run (request_fits) instead, so none reaches an LB",
    "max_chars_per_token": "the bound behind the ingress's context-length check; simulated prompts come with "
                           "their token counts",
    "forward_timeout_s": "a forward that cannot connect (its peer down, or across a cut: sim/faults.py) fails one "
                         "round trip later and is decided again, as on Serve's ForwardFailed; one that connected "
                         "never hangs, so nothing times out",
    "request_timeout_s": "a request's deadline until its response starts (503 / 504); simulated requests wait "
                         "at most max_wait_s at an LB, which is compared, and nothing stalls (a fault loses a "
                         "request at once: sim/faults.py)",
    "retry_budget_ratio": "the budget of retries of forwards that could not reach their peer; the simulated LB "
                          "decides every such request again (sim/faults.py) without a budget -- they stop once "
                          "the peer's heartbeat is stale",
    "retry_budget_min_per_s": "the budget of retries of forwards that could not reach their peer; the simulated "
                              "LB decides every such request again (sim/faults.py) without a budget",
    "snapshot_max_rows": "rows of the regional snapshot one heartbeat may carry to the registry's mirror (for a "
                         "restarted ingress); the simulator mirrors no snapshot: an LB restarting after an outage "
                         "keeps its router as it was",
    "share_sibling_inserts": "acts only with several ingress replicas per region (one LB per region by default "
                             "here: see 'ingress_replicas > 1'); the simulator runs the same channel with "
                             "DeploymentSpec.share_sibling_inserts",
    "debug": "operator access to the state endpoint and per-request figures",
    "admin_token": "operator access to the state endpoint and per-request figures",
    "admin_token_env": "operator access to the state endpoint and per-request figures",
    # behaviours that are no IngressConfig field
    "GeoPrefixRouter queue (router_kwargs queue_bound / wait_limit_s)":
        "Serve's ingress sends a request 'local' when the router reports a free slot and the router then "
        "places it; a report that went stale in between parks it in the router's own queue. The simulated LB "
        "picks the replica in the same step as the region decision, so nothing waits there; its one queue is "
        "the ingress's admission queue",
    "x-geolb-max-wait-s header": "a client's own, shorter wait limit; no simulated client sends one",
    "RTT probe warm-up call": "Serve's first call to a peer sets up its handle and is not measured; the "
                              "simulator has no handles",
    "ingress_replicas > 1": "simulated with DeploymentSpec.ingress_replicas (docs/design.md section 8), except "
                            "how Ray's proxy spreads requests over them (here uniformly at random; Ray picks by two "
                            "choices on in-flight counts); by default one LB per region, as build_region_apps "
                            "deploys, and never under faults; their shared inserts (Serve's share_sibling_inserts, "
                            "on by default there) only with DeploymentSpec.share_sibling_inserts",
    "circuit breaker of an unreachable peer (BREAKER_BACKOFF_S)": "after a failed forward the simulated LB marks "
        "the peer unavailable until its next peer table, not for a backoff; a peer that stopped heartbeating "
        "(down, or across a cut: sim/faults.py) is stale after peer_stale_s anyway",
    "502 handover_lost": "a peer that fails after it may have taken a forwarded request answers 502 and the client "
                         "retries; in the simulator a fault loses the request and its client sends it again "
                         "retry_after_s later, the same outcome without the error body",
    "registry call latency in the one-machine demo": "the demo injects inter-region latency around forwards and "
                                                     "probes only; the simulator charges each heartbeat leg the "
                                                     "one-way delay to the registry's region, as a real multi-region "
                                                     "deployment pays it",
}

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
    #: the control plane runs this long before the first request (from ``-warmup_s`` to 0): replica
    #: reports, heartbeats and RTT probes, on idle engines -- a deployment is up before its traffic
    warmup_s: float = 5.0
    #: region outages and partitions (``sim/faults.py``): Faults or dicts ``{kind, region, start_s, duration_s[,
    #: detect_s]}``, each window inside ``[0, duration_s)``
    faults: Tuple[Any, ...] = ()

    def __post_init__(self):
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s!r}")
        if self.max_programs is not None and self.max_programs < 1:
            raise ValueError(f"max_programs must be >= 1, got {self.max_programs!r}")
        if not self.sample_period_s > 0:
            raise ValueError(f"sample_period_s must be > 0, got {self.sample_period_s!r}")
        if not (isinstance(self.warmup_s, (int, float)) and 0 <= self.warmup_s < float("inf")):
            raise ValueError(f"warmup_s must be a finite number >= 0, got {self.warmup_s!r}")
        self.faults = check_faults(self.faults, duration_s=self.duration_s)


class _Replica:
    __slots__ = ("id", "region", "engine", "stepping", "lbs", "zero_steps", "down")

    def __init__(self, rid, region, engine):
        self.id = rid
        self.region = region
        self.engine = engine
        self.stepping = False
        self.lbs: List[RegionLB] = []
        self.zero_steps = 0
        self.down = False  # in a region outage (sim/faults.py)


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
                 "max_tokens", "ideal_hit", "kv_hashes", "eng_uncached", "eng_queued", "eng_prefill", "entry", "lb",
                 "lost", "reply_text")

    def __init__(self, rid, run, ci, region, rreq, prompt, out, hashes, t_send, max_tokens=None):
        self.rid = rid
        self.run = run
        self.ci = ci
        self.region = region
        self.rreq = rreq
        self.prompt = prompt
        self.out = out
        self.hashes = hashes
        self.kv_hashes = hashes  # what the engine may cache: the prompt's blocks, then the reply's if known
        self.reply_text = None  # the prompt + reply text (Call.text_with_reply), what its LB learns when it is done
        self.eng_uncached = None  # prompt tokens the engine prefilled (its RequestTiming), as a replica reports
        self.eng_queued = 0.0  # its RequestTiming's queued_s (waiting in the engine) and prefill_s
        self.eng_prefill = 0.0
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
        self.entry = self.lb = None  # the LB its client reached, the LB holding it (or it is on its way to)
        self.lost = 0  # lost in a fault (sim/faults.py): this attempt is over, its client sends a new one


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
    #: per completed request, in ``requests``' order: (network s -- the one-way delays to the replica and
    #: back, engine queued s, engine prefill s, uncached prompt tokens); ``sim/attribution.py`` reads it
    breakdown: Optional[List[tuple]] = None
    #: a run with faults: what each fault window saw (``FaultModel.result``; ``faults.fault_report`` reads it)
    faults: Optional[dict] = None
    #: per request still in flight at the cut-off whose first token had reached its client by then (a long
    #: output still decoding): ``requests``' fields with ``e2e`` replaced by the TPOT measured so far -- (cut-off
    #: or engine finish - first token) / (tokens generated - 1), None under 2 tokens; with keep_requests only
    unfinished: Optional[List[tuple]] = None
    #: their ``breakdown`` rows, in the same order
    unfinished_breakdown: Optional[List[tuple]] = None

    def answered(self) -> Tuple[List[tuple], List[tuple]]:
        """(records, breakdown rows) of every request whose first token reached its client by the cut-off: the
        completed ones, then those still decoding (``unfinished``). Fields 0, 1 and 3-8 mean the same in both;
        field 2 is the e2e latency of a completed one and the TPOT so far of one still decoding."""
        return (list(self.requests) + list(self.unfinished or ()),
                list(self.breakdown or ()) + list(self.unfinished_breakdown or ()))


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
        self._proxy_rng = random.Random(f"proxy:{self.cfg.seed}")  # which of a region's routers (lb_of)
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
    def one_way(self, a: str, b: str) -> float:
        k = (a, b)
        v = self._ow_cache.get(k)
        if v is None:
            v = self._ow_cache[k] = self.net.one_way_s(a, b)
        return v

    def _policy(self, targets: List[str], rank: int = 0):
        spec = self.dep.policy
        cfg = parse_policy_config(spec)
        if isinstance(spec, str) or (isinstance(spec, dict) and "seed" not in spec):
            cfg = cfg.model_copy(update={"seed": self.cfg.seed + 7919 * rank})  # a region's routers differ
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
        self.settings = dep.settings
        self.lbs: Dict[str, RegionLB] = {}  # by name: the region's, or "<region>.<k>" with several per region
        self.region_lbs: Dict[str, List[RegionLB]] = {}  # region -> its routers (DeploymentSpec.ingress_replicas)
        self.sibling_logs: Dict[str, list] = {}  # region -> its routers' inserts, in order (sibling_inserts_s)
        tl = self._tl = dict(dep.two_layer)
        if dep.lb_kind == "central":
            tl["max_hops"] = 0
            lb = self.lbs[dep.central_region] = self.central_lb(dep.central_region, f"central@{dep.central_region}")
            self.region_lbs[dep.central_region] = [lb]
        else:
            if dep.lb_kind == "region-local":
                tl["max_hops"] = 0
            self._region_routers(dep, tl, by_region)
        self._forwarding = dep.lb_kind == "per-region" and len(self.region_lbs) > 1 and \
            tl.get("max_hops", 1) >= 1
        self.registry: Optional[RegistryState] = None
        self.registries: Dict[str, RegistryState] = {}
        if self._forwarding:
            # the registries every LB heartbeats to (policy/region/registry_state.py, on the virtual clock):
            # the primary, then any standbys (RegionLayerSettings.registry_standbys)
            self.registries = {r: RegistryState(clock=self._clock, regions=list(self.region_lbs))
                               for r in dep.registry_regions()}
            self.registry_region = dep.registry_region()
            self.registry = self.registries[self.registry_region]
            for lb in self.lbs.values():  # known but unheard: unavailable until a heartbeat says otherwise
                for p in lb.peers:
                    lb.router.update_peer(PeerState(p.region, 0, 0, float("-inf")))
        # counters
        self.c = {"requests_sent": 0, "requests_completed": 0, "requests_rejected": 0, "programs_started": 0,
                  "programs_completed": 0, "forwards": 0, "lb_holds": 0, "engine_steps": 0, "stats_reports": 0,
                  "heartbeats": 0, "lb_queue_full": 0, "lb_wait_timeout": 0}
        self.decisions: Dict[str, int] = {}
        self.records: List[tuple] = []
        self.breakdown: List[tuple] = []
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
        if self.cfg.faults and dep.ingress_replicas > 1:
            raise ValueError("faults with ingress_replicas > 1 are not simulated (the fault model fails a region's "
                             "one LB and sends its clients to another region's)")
        self.faults: Optional[FaultModel] = FaultModel(self, self.cfg.faults) if self.cfg.faults else None

    def _region_routers(self, dep: DeploymentSpec, tl: dict, by_region: Dict[str, List[str]]) -> None:
        """The per-region LBs: ``ingress_replicas`` routers per region, router k of n with the k-th share of
        each report's headroom (``Policy.set_headroom_share``, as GeoPrefixRouter's ``headroom_share="auto"``);
        each hears every local replica's reports. Peers are the other regions (one LB each stands for it)."""
        n = dep.ingress_replicas
        for region in dep.lb_regions():
            for k in range(n):
                router = RegionRouter(TwoLayerConfig(region=region, **tl), self._policy(by_region[region], k),
                                      clock=self._clock)
                if n > 1:
                    router.local.set_headroom_share(k, n)
                name = region if n == 1 else f"{region}.{k}"
                lb = self.lbs[name] = RegionLB(self, name, region, router, ingress=True)
                self.region_lbs.setdefault(region, []).append(lb)
                for rid in by_region[region]:
                    self.replicas[rid].lbs.append(lb)
        if n > 1 and dep.sibling_inserts_s is not None:  # each region's routers share their inserts (RegionLB)
            self.sibling_logs = {r: [] for r in self.region_lbs}
        stand_ins = [lbs[0] for lbs in self.region_lbs.values()]
        for lb in self.lbs.values():
            lb.peers = [p for p in stand_ins if p.region != lb.region]

    def lb_of(self, region: str) -> RegionLB:
        """The router of ``region`` a request reaches: its only one, else one of its ``ingress_replicas`` at
        random (uniform, from its own stream: Ray's proxy picks an ingress replica by two random choices
        on in-flight counts, not modelled)."""
        lbs = self.region_lbs[region]
        return lbs[0] if len(lbs) == 1 else lbs[self._proxy_rng.randrange(len(lbs))]

    def central_lb(self, region: str, name: str) -> RegionLB:
        """A central LB in ``region`` over every replica (the deployment's, or its standby: ``sim/faults.py``)."""
        dep = self.dep
        router = RegionRouter(TwoLayerConfig(region=region, **self._tl), self._policy(list(self.replicas)),
                              clock=self._clock)
        lb = RegionLB(self, name, region, router)
        if dep.rtt_aware:
            if not hasattr(router.local, "rtt_of_target"):
                raise ValueError(f"deployment {dep.system!r}: rtt_aware needs a policy with an "
                                 f"rtt_of_target hook (a cost policy), got {type(router.local).__name__}")
            router.local.rtt_of_target = central_rtt_fn(self.replicas, self.net, region)
        for r in self.replicas.values():
            r.lbs.append(lb)
        return lb

    def region_layer_config(self, region: str) -> Dict[str, Any]:
        """What the LB of ``region`` runs, in the Serve ingress's terms: :func:`region_layer_config`."""
        return region_layer_config(self, region)

    def push(self, t: float, kind: int, a=None, b=None) -> None:
        self._seq += 1
        heappush(self._heap, (t, self._seq, kind, a, b))

    # ------------------------------------------------------------------ run
    def run(self) -> SimResult:
        cfg = self.cfg
        dep = self.dep
        rng = self.rng
        # periodic events, random initial phases, from -warmup_s on (the control plane is warm at 0)
        t0 = self.now = -float(cfg.warmup_s)
        for rep in self.replicas.values():
            self.push(t0 + rng.random() * dep.stats_period_s, STATS_MEASURE, rep)
        if self._forwarding:
            st = self.settings
            for lb in self.lbs.values():
                self.push(t0 + rng.random() * st.heartbeat_period_s, HEARTBEAT, lb)
                self.push(t0 + rng.random() * st.rtt_probe_period_s, RTT_PROBE, lb, 0)
        self.push(cfg.sample_period_s, SAMPLE)
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
                    self.push(0.0, PROG_START, (region, cid))
                    cid += 1
        else:
            self._open_iter = iter(wl.open.arrivals)
            self._schedule_next_arrival()

        end = cfg.duration_s
        heap = self._heap
        lb = RegionLB  # the LB events' handlers take the LB (the event's a) as self
        handlers = (lb.on_arrive, self._on_rep_arrive, self._on_step_end, self._on_step_wake, lb.on_done,
                    self._on_client_done, self._on_stats_measure, lb.on_stats, lb.on_heartbeat, lb.on_reg_arrive,
                    self._on_prog_start, self._on_open_arrival, self._on_sample, lb.on_ping_reply,
                    lb.on_reg_reply, lb.on_rtt_probe, lb.on_timeout, self._on_retry,
                    lb.on_steal_offer, lb.on_stolen, lb.on_steal_settle, lb.on_steal_answer)
        if self.faults is not None:
            handlers = self.faults.install(handlers)
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
            if kind <= CLIENT_DONE:
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
        self.push(max(t, self.now), OPEN_ARRIVAL, prog)

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
            self.push(self.now + self.workload.closed.think_time_s, PROG_START, run.client)

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
        if self.faults is not None:
            self.faults.on_sent(self.now, region)
        out = call.output_tokens
        if not request_fits(self.profile, ntok, out, call.max_tokens):
            self.c["requests_rejected"] += 1
            self.count("rejected_too_long")
            self._call_done(run, ci)
            return
        rreq = RouteRequest(request_id=rid, text=text, session_key=call.session_key, prompt_tokens=ntok,
                            region=region, tenant=call.tenant, reply_span=call.reply_span(text), driver_data=hashes,
                            output_tokens_hint=call.max_tokens or 0)  # the ingress's hint: the client's max_tokens
        req = _Req(rid, run, ci, region, rreq, ntok, out, hashes, self.now, call.max_tokens)
        req.ideal_hit = self.ideal.observe(ntok, hashes)
        full = req.reply_text = call.text_with_reply
        if full is not None:  # the engine caches the reply's blocks as it decodes them (vLLM does)
            kv = self._blocks(full)[1]
            if kv[:len(hashes)] == hashes:
                req.kv_hashes = kv
                self.ideal.remember(kv)
        self._inflight += 1
        self._to_lb(req)

    def _to_lb(self, req: _Req):
        """The client sends ``req`` to the LB of its region (else the nearest; with faults, the one its
        failover names, or it waits for the failover: ``FaultModel.client_lb``)."""
        region = req.region
        if self.faults is None:
            lb = self.lb_of(region if region in self.region_lbs else self.dep.lb_for_client(region))
        elif (lb := self.faults.client_lb(req)) is None:
            return
        d = self.one_way(region, lb.region)
        req.path = d
        req.entry = req.lb = lb
        self.push(self.now + d, LB_ARRIVE, lb, req)

    def new_attempt(self, req: _Req) -> _Req:
        """The same request sent again by its client after its attempt ``req`` was lost (``sim/faults.py``): a new
        request id (``<first id>~<n>``), the same content, first-send time and program."""
        base, _, n = req.rid.partition("~")
        rid = f"{base}~{int(n or 0) + 1}"
        r = req.rreq
        rreq = RouteRequest(request_id=rid, text=r.text, session_key=r.session_key, prompt_tokens=r.prompt_tokens,
                            region=r.region, tenant=r.tenant, reply_span=r.reply_span, driver_data=r.driver_data,
                            output_tokens_hint=r.output_tokens_hint)
        new = _Req(rid, req.run, req.ci, req.region, rreq, req.prompt, req.out, req.hashes, req.t_send, req.max_tokens)
        new.kv_hashes, new.ideal_hit, new.reply_text = req.kv_hashes, req.ideal_hit, req.reply_text
        return new

    def _on_retry(self, req: _Req, b):
        """A refused request's client sends it again (its latency still counts from the first send)."""
        req.rreq.hops = 0
        req.cross = False
        self._to_lb(req)

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
            self.breakdown.append((2.0 * req.path, req.eng_queued, req.eng_prefill, req.eng_uncached or 0))
        self._call_done(req.run, req.ci)

    # ------------------------------------------------------------------ LB services (sim/region_lb.py)
    def count(self, key: str):
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def refuse(self, req: _Req, reason: str):
        """The ingress refuses ``req`` with a Retry-After (429 ``queue_full``, 503 ``wait_timeout``): the
        refusal travels back to the client, which sends the request again ``retry_after_s`` later. Not a
        rejection: the request stays in flight until served or cut off (counters ``lb_<reason>``)."""
        self.c[f"lb_{reason}"] += 1
        self.count(f"refused:{reason}")
        self.push(self.now + req.path + self.settings.retry_after_s, RETRY, req)

    def reject(self, req: _Req, reason: str):
        """``req`` is refused (reject decision, full queue, wait limit): its program goes on as if answered."""
        self.c["requests_rejected"] += 1
        self.count(f"reject:{reason}")
        self._inflight -= 1
        self._call_done(req.run, req.ci)

    def _on_stats_measure(self, rep: _Replica, b):
        now = self.now
        dep = self.dep
        st = ReplicaStats.from_dict(rep.engine.stats(), default_timestamp=now)
        self.c["stats_reports"] += 1
        self.load.report(st.num_waiting)
        lag = dep.stats_lag_s
        for lb in rep.lbs:
            self.push(now + lag + self.one_way(rep.region, lb.region), STATS_DELIVER, lb, (rep.id, st))
        j = dep.stats_jitter
        period = dep.stats_period_s * (1.0 + (self.rng.random() * 2.0 - 1.0) * j)
        self.push(now + period, STATS_MEASURE, rep)

    # ------------------------------------------------------------------ replicas
    def _on_rep_arrive(self, rep: _Replica, req: _Req):
        rep.engine.add_request(EngineRequest(req.rid, req.prompt, req.out, req.kv_hashes, req.max_tokens), self.now)
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
            self.push(nr, STEP_WAKE, rep)
            return
        out = eng.step(now)
        self.c["engine_steps"] += 1
        rep.stepping = True
        if out.duration > 0.0:
            rep.zero_steps = 0
            self.push(now + out.duration, STEP_END, rep, out)
        else:
            rep.zero_steps += 1
            if rep.zero_steps > 1000:
                raise RuntimeError(f"replica {rep.id}: engine makes no progress at t={now}")
            self.push(now, STEP_WAKE, rep)

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
            req.serve_lb.on_first_token(req)  # the TTFT-SLO guard's calibration
        for tm in out.timings:
            req = reqs[tm.request_id]
            req.eng_uncached = tm.uncached_tokens
            req.eng_queued = tm.queued_s
            req.eng_prefill = tm.prefill_s
        if out.finished:
            ow = self.one_way
            for rid in out.finished:
                req = reqs.pop(rid)
                req.t_fin = now
                lb = req.serve_lb
                self.push(now + ow(rep.region, lb.region), LB_DONE, lb, req)
                self.push(now + req.path, CLIENT_DONE, req)
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
        self.push(self.now + self.cfg.sample_period_s, SAMPLE)

    def _result(self, elapsed: float) -> SimResult:
        c = dict(self.c)
        c["in_flight_at_end"] = self._inflight
        c["lb_queue_at_end"] = sum(len(lb.queue) for lb in self.lbs.values())
        faults = self.faults.result(c) if self.faults is not None else None
        eng = {rid: r.engine.stats() for rid, r in self.replicas.items()}
        wl = self.workload
        config = {"duration_s": self.cfg.duration_s, "seed": self.cfg.seed, "max_programs": self.cfg.max_programs,
                  "drain": self.cfg.drain}
        if faults is not None:
            config["faults"] = [f.to_dict() for f in self.cfg.faults]
        unfinished, unfinished_bd = (decoding_at_cutoff(self._reqs.values(), self._heap, self.cfg.duration_s)
                                     if self.cfg.keep_requests else (None, None))
        return SimResult(
            config=config, deployment=self.dep.to_dict(),
            workload={"name": wl.name, "description": wl.description,
                      "kind": "closed" if wl.closed is not None else "open"},
            elapsed_s=elapsed, requests=self.records, breakdown=self.breakdown, counters=c, engine_stats=eng,
            samples=self.samples, decisions=dict(self.decisions), ideal=self.ideal.summary(),
            load=self.load.summary(), faults=faults, unfinished=unfinished, unfinished_breakdown=unfinished_bd,
        )


def decoding_at_cutoff(reqs, heap: list, end: float) -> Tuple[List[tuple], List[tuple]]:
    """The records and breakdown rows (``SimResult.unfinished`` / ``unfinished_breakdown``) of each request in
    flight at the cut-off ``end`` whose first token had reached its client by then: still decoding at its engine
    (``reqs``: the simulator's requests at an engine), or done there with its last token still on its way back
    (a ``CLIENT_DONE`` event left in ``heap``). Its TTFT is known; a request without a first token by ``end`` is
    not here (a miss, for the SLO yardstick)."""
    seen = {q.rid: q for q in reqs}
    for item in heap:
        if item[2] == CLIENT_DONE and isinstance(item[3], _Req):
            seen.setdefault(item[3].rid, item[3])
    out = []
    for q in seen.values():
        if q.lost or q.t_first is None or q.t_first + q.path > end:
            continue
        if q.t_fin is not None:
            n, last = q.out, q.t_fin
        else:
            g = q.replica.engine.generated_tokens(q.rid) if q.replica is not None else None
            n, last = (g or 0), end
        tpot = (last - q.t_first) / (n - 1) if n > 1 else None
        out.append(((q.t_send, q.t_first + q.path - q.t_send, tpot, q.prompt, q.out, q.lb_wait, q.cross,
                     q.region, q.replica.id), (2.0 * q.path, q.eng_queued, q.eng_prefill, q.eng_uncached or 0)))
    out.sort(key=lambda u: u[0][0])
    return [u[0] for u in out], [u[1] for u in out]


def central_rtt_fn(replicas: Dict[str, _Replica], net, lb_region: str):
    """GORGO-proxy's network term: the RTT a request pays on its way client -> proxy -> replica.

    The client->proxy leg is the same for every replica (so it does not change the argmin) but
    it is part of what the request really pays, so the cost stays an honest TTFT estimate."""

    def rtt(target, req):
        client = req.region if req.region is not None else lb_region
        return net.rtt_s(client, lb_region) + net.rtt_s(lb_region, replicas[target].region)

    return rtt


def region_layer_config(sim: Simulator, region: str) -> Dict[str, Any]:
    """What the LB of ``region`` runs, in the Serve ingress's terms (``IngressConfig`` field names; None
    where the LB has no such part, e.g. no registry without forwarding): read from the objects ``sim``
    built -- the router's ``TwoLayerConfig``, the registry, the settings its code reads -- not from the
    deployment's defaults. What it leaves out: :data:`SERVE_NOT_SIMULATED`."""
    lb = sim.region_lbs[region][0]
    st = sim.settings
    reg = sim.registry
    net = sim.net
    fwd = sim._forwarding
    regions = [region] + [p.region for p in lb.peers]
    return {
        "region": lb.region,
        "peers": sorted(p.region for p in lb.peers) if fwd else [],
        "policy": lb.policy.config.name,
        "two_layer": lb.router.config,
        "local_availability": "router",  # the local policy's own availability (SP-P), as GeoPrefixRouter's
        "max_queue": st.max_queue if lb.ingress else None,
        "max_wait_s": st.max_wait_s if lb.ingress else None,
        "retry_after_s": st.retry_after_s if lb.ingress else None,
        "registry.period_s": st.heartbeat_period_s if reg is not None else None,
        "registry.standbys": list(sim.registries)[1:] if reg is not None else None,
        "registry.config": None if reg is None else {
            "max_regions": reg.max_regions, "max_sources_per_region": reg.max_sources, "fresh_s": reg.fresh_s,
            "drop_after_s": reg.drop_after_s, "max_snapshot_nodes": reg.max_snapshot_nodes},
        "rtt_probe_period_s": st.rtt_probe_period_s if fwd else None,
        "latency.rtt_ms": {(a, b): net.rtt_ms(a, b) for a in regions for b in regions if a < b},
        "note_forwards": st.note_forwards if fwd else None,
        "forward_past_queue": st.forward_past_queue if lb.ingress else None,
        "stats_period_s": sim.dep.stats_period_s,
    }


def simulate(workload, deployment: DeploymentSpec, config: Optional[SimConfig] = None, **kw) -> SimResult:
    """Run one simulation (see :class:`Simulator`)."""
    return Simulator(workload, deployment, config, **kw).run()
