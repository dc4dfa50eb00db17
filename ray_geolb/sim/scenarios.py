"""Named experiments: SkyLB Fig. 8 / 9 / 10 and the Ray Serve prefix-router blog, as lists of runs.

A run is a plain dict (JSON-able, so it can be shipped to a Ray task)::

    {"label": "tot/skylb", "group": "tot", "system": "skylb", "replicas": {"us": 4, ...},
     "workload": {"name": "tot", "kw": {...}}, "sim": {"duration_s": 120, "seed": 0, ...},
     "deploy": {...DeploymentSpec overrides...}}

its fields typed by :class:`~ray_geolb.sim.run_spec.RunSpec`, and :func:`run_one` validates one as a
``RunSpec`` and turns it into a metrics summary (see ``metrics.summarize``) plus ``ttft_cdf`` (the
0th..100th TTFT percentiles, for plots). Everything is a pure function of the run dict.

Scenarios (``SCENARIOS``):

SkyLB's experiments (Fig. 8 / 9 / 10) run on ``llama3.1-8b-l4-sglang`` by default: SkyLB served
Llama-3.1-8B-Instruct with SGLang on L4s (§5), so the engine admits with SGLang's KV reservation
(``engine/sglang.py``). Their clients send ``max_tokens=256`` (SkyLB's benchmark client, SGLang's ToT
benchmark): ToT nodes write 256 tokens each, conversation replies are cut at 256 tokens
(``SKYLB_TOT_KW``, ``SKYLB_CONV_KW``). The other scenarios keep their engines (vLLM semantics).

* ``skylb-fig8``: multi-region macro-benchmark. Panels: ``conv-sharegpt`` (ShareGPT conversations
  standing in for ChatBot Arena: 80 clients per region, replicas 4/4/4), ``conv-wildchat`` (WildChat,
  40/30/30 clients, unbalanced replicas US 3 / Europe 2 / Asia 3, §5.1), ``tot`` (2-branch ToT,
  40/20/20 clients, 4/4/4),
  ``mixed-tot`` (US 2 clients x 4-branch, EU/Asia 20 x 2-branch, 4/4/4). Systems: SkyLB, SkyLB-CH,
  one-LB-in-the-US RR / LL / CH / SGL, plus P2C, Ray prefix and the oracle.
* ``skylb-fig9``: one region, 4 replicas, 30 clients, ToT 2-branch: BP vs SP-O vs SP-P (SGLang router).
* ``skylb-fig10``: diurnal skew (US 120, EU 40, Asia 40 clients, conversations), 6 / 9 / 12 replicas
  evenly spread: region-local vs SkyLB.
* ``ray-blog-prefix``: PrefixRepetition (512-token prefixes, 128-token suffixes, 128 output, 32
  prefixes and 512 prompts per replica, concurrency 32 per replica) at 1, 2, 4, 8 replicas in one
  region: Ray prefix router and SkyLB vs power of two. Runs until every prompt is answered.

* ``gorgo``: GORGO's setting (§4.1, §4.6): three regions US-West / Germany / Israel
  (``RegionNetwork.gorgo()``: 281 / 183 ms from US-West, Germany-Israel assumed 60 ms), one
  Mistral-7B server per region (``mistral-7b-a100``, calibrated from GORGO Table 1), 10 requests in
  flight in total (GuideLLM "concurrent" mode = a closed loop of 10 clients), 60 s, WildChat
  conversations. GORGO geo-routes each WildChat prompt to the nearest node, so the 10 clients are
  spread by where WildChat's users are: the fixture's pools are even (20/20/20 conversations per
  region), 10 = 4/3/3 with the remainder at US-West (the US is WildChat's largest country).
  Regions of the conversation workload are renamed us -> us-west, eu -> germany, asia -> israel
  (Americas -> US-West, Europe/Middle East/Africa -> Germany, Asia-Pacific -> Israel, the nearest
  of the three by great-circle distance). GORGO-proxy's central proxy sits in US-West.
* ``network-hard``: the network term tested honestly. Home region ``us-east`` (Washington DC) is
  overloaded (200 WildChat clients, 2 replicas: every LB must forward), the near region ``ca``
  (Toronto, 19 ms) is busy but keeping up on its own (40 clients, 2 replicas), the far region ``au``
  (Sydney, 215 ms) has 2 idle replicas and no clients. Every request the home LB cannot place must go
  somewhere: staying means queueing at home; the near peer is the cheap hop but filling it up queues
  *its* users and the forwarded ones; the far peer is free by availability but every forward there
  pays 215 ms RTT plus a recompute of the conversation history (its cache has nothing). A policy that
  ignores the network sends too much to Sydney; one that ignores remote queues piles onto Toronto.
  Hard because the right split changes with the instantaneous queues, and conversations make every
  forward cost a recompute. RTTs from the shipped IBM Cloud table; SkyLB's L4 profile; 60 s.

* ``shared-context``: shared long contexts from every region. Three regions (the default
  network: us / eu / asia, 98-237 ms), two Mistral-7B A100 replicas each (``mistral-7b-a100``: a
  4,000-8,000-token context costs 0.4-0.75 s of prefill, more than any RTT here). Group ``rag``: 24
  clients per region ask about a turning-over pool of 64 live contexts (RAG documents / agent contexts,
  each asked ~4 times per region, so ~12 times in all, from all three regions at about the same time;
  ``workloads/shared_context.py``); group ``trace-dealt``: the same pool as a Mooncake-format JSONL trace
  (Poisson, 8 req/s, each context ~12 times), its rows dealt round-robin over the regions
  (``trace(region_by="row")``). A per-region LB sees a third of each context's traffic. 120 s.

``scale`` multiplies client counts and replica counts (rounded, at least 1 per region that has
any); ``scale=1`` is the paper's size. ``duration_s`` is the simulated time per run.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Callable, Dict, List, Optional

__all__ = ["SCENARIOS", "scenario_runs", "run_one", "build_workload", "scenario_names", "DEFAULT_SCALE"]

FIG8_SYSTEMS = ["skylb", "skylb-ch", "rr", "ll", "ch", "sgl", "p2c", "ray-prefix", "oracle"]
DEFAULT_SCALE = {"skylb-fig8": 1.0, "skylb-fig9": 1.0, "skylb-fig10": 1.0, "ray-blog-prefix": 1.0, "gorgo": 1.0,
                 "network-hard": 1.0, "shared-context": 1.0}
DEFAULT_DURATION = {"skylb-fig8": 120.0, "skylb-fig9": 120.0, "skylb-fig10": 120.0, "ray-blog-prefix": 3600.0,
                    "gorgo": 60.0, "network-hard": 60.0, "shared-context": 120.0}
GORGO_SYSTEMS = ["gorgo", "gorgo-proxy", "geoprefix", "skylb", "ll", "sgl"]
GORGO_REGION_MAP = {"us": "us-west", "eu": "germany", "asia": "israel"}
HARD_REGION_MAP = {"us": "us-east", "eu": "ca"}
SKYLB_PROFILE = "llama3.1-8b-l4-sglang"
SKYLB_TOT_KW = {"max_tokens": 256, "thought_tokens": 256}
SKYLB_CONV_KW = {"max_tokens": 256}
SHARED_CONTEXT_SYSTEMS = ["geoprefix", "skylb", "gorgo", "sgl", "ch", "ll", "ray-prefix", "oracle"]
SHARED_CONTEXT_CLIENTS = {"us": 24, "eu": 24, "asia": 24}
SHARED_CONTEXT_TRACE_RPS = 8.0


def _scaled(d: Dict[str, int], scale: float) -> Dict[str, int]:
    return {k: (max(1, int(round(v * scale))) if v > 0 else 0) for k, v in d.items()}


def _run(label, group, system, replicas, workload, sim, deploy=None) -> dict:
    return {"label": label, "group": group, "system": system, "replicas": dict(replicas),
            "workload": workload, "sim": dict(sim), "deploy": dict(deploy or {})}


def _fig8(scale, duration, seed, systems=None, profile=None) -> List[dict]:
    panels = [
        ("conv-sharegpt", {"name": "conversation:sharegpt",
                           "kw": {"clients": {"us": 80, "eu": 80, "asia": 80}, **SKYLB_CONV_KW}},
         {"us": 4, "eu": 4, "asia": 4}),
        ("conv-wildchat", {"name": "conversation:wildchat",
                           "kw": {"clients": {"us": 40, "eu": 30, "asia": 30}, **SKYLB_CONV_KW}},
         {"us": 3, "eu": 2, "asia": 3}),
        ("tot", {"name": "tot", "kw": {"branching": 2, "clients": {"us": 40, "eu": 20, "asia": 20}, **SKYLB_TOT_KW}},
         {"us": 4, "eu": 4, "asia": 4}),
        ("mixed-tot", {"name": "mixed-tot", "kw": {"clients": {"us": 2, "eu": 20, "asia": 20},
                                                   "branching": {"us": 4, "eu": 2, "asia": 2}, **SKYLB_TOT_KW}},
         {"us": 4, "eu": 4, "asia": 4}),
    ]
    runs = []
    for group, wl, reps in panels:
        wl = {"name": wl["name"], "kw": dict(wl["kw"], clients=_scaled(wl["kw"]["clients"], scale), seed=seed)}
        for s in systems or FIG8_SYSTEMS:
            runs.append(_run(f"{group}/{s}", group, s, _scaled(reps, scale), wl,
                             {"duration_s": duration, "seed": seed}, {"profile": profile or SKYLB_PROFILE}))
    return runs


def _fig9(scale, duration, seed, systems=None, profile=None) -> List[dict]:
    wl = {"name": "tot", "kw": {"branching": 2, "clients": _scaled({"us": 30}, scale), "seed": seed, **SKYLB_TOT_KW}}
    return [_run(f"tot-1region/{s}", "tot-1region", s, _scaled({"us": 4}, scale), wl,
                 {"duration_s": duration, "seed": seed}, {"profile": profile or SKYLB_PROFILE})
            for s in systems or ["bp", "sp-o", "sp-p"]]


def _fig10(scale, duration, seed, systems=None, profile=None) -> List[dict]:
    wl = {"name": "diurnal", "kw": {"clients": _scaled({"us": 120, "eu": 40, "asia": 40}, scale), "seed": seed,
                                    **SKYLB_CONV_KW}}
    runs = []
    for per in (2, 3, 4):
        reps = _scaled({"us": per, "eu": per, "asia": per}, scale)
        n = sum(reps.values())
        for s in systems or ["region-local", "skylb"]:
            runs.append(_run(f"{n}rep/{s}", f"{n} replicas", s, reps, wl,
                             {"duration_s": duration, "seed": seed}, {"profile": profile or SKYLB_PROFILE}))
    return runs


def _blog(scale, duration, seed, systems=None, profile=None) -> List[dict]:
    runs = []
    for n in (1, 2, 4, 8):
        ppr = max(1, int(round(512 * scale)))
        wl = {"name": "prefix-repetition", "kw": {"num_replicas": n, "prompts_per_replica": ppr, "seed": seed}}
        for s in systems or ["p2c", "ray-prefix", "skylb"]:
            runs.append(_run(f"{n}rep/{s}", f"{n} replicas", s, {"us": n}, wl,
                             {"duration_s": duration, "seed": seed, "drain": True},
                             {"profile": profile} if profile else None))
    return runs


def _deploy(profile, **kw):
    d = dict(kw)
    if profile:
        d["profile"] = profile
    return d


def _gorgo(scale, duration, seed, systems=None, profile=None) -> List[dict]:
    clients = _scaled({"us": 4, "eu": 3, "asia": 3}, scale)
    wl = {"name": "conversation:wildchat", "kw": {"clients": clients, "seed": seed},
          "region_map": dict(GORGO_REGION_MAP)}
    reps = _scaled({"us-west": 1, "germany": 1, "israel": 1}, scale)
    return [_run(f"gorgo/{s}", "gorgo", s, reps, wl, {"duration_s": duration, "seed": seed},
                 _deploy(profile or "mistral-7b-a100", network="gorgo", central_region="us-west"))
            for s in systems or GORGO_SYSTEMS]


def _network_hard(scale, duration, seed, systems=None, profile=None) -> List[dict]:
    clients = _scaled({"us": 200, "eu": 40}, scale)
    wl = {"name": "conversation:wildchat", "kw": {"clients": clients, "seed": seed},
          "region_map": dict(HARD_REGION_MAP)}
    reps = _scaled({"us-east": 2, "ca": 2, "au": 2}, scale)
    return [_run(f"network-hard/{s}", "network-hard", s, reps, wl, {"duration_s": duration, "seed": seed},
                 _deploy(profile, network="network-hard", central_region="us-east"))
            for s in systems or GORGO_SYSTEMS]


def _shared_context(scale, duration, seed, systems=None, profile=None) -> List[dict]:
    reps = _scaled({"us": 2, "eu": 2, "asia": 2}, scale)
    closed = {"name": "shared-context", "kw": {"clients": _scaled(SHARED_CONTEXT_CLIENTS, scale), "seed": seed}}
    dealt = {"name": "shared-context-trace",
             "kw": {"region_by": "row", "rate_rps": SHARED_CONTEXT_TRACE_RPS * scale,
                    "requests": int(round(SHARED_CONTEXT_TRACE_RPS * scale * (duration + 10))), "seed": seed}}
    runs = []
    for group, wl in (("rag", closed), ("trace-dealt", dealt)):
        for s in systems or SHARED_CONTEXT_SYSTEMS:
            runs.append(_run(f"{group}/{s}", group, s, reps, wl, {"duration_s": duration, "seed": seed},
                             _deploy(profile or "mistral-7b-a100", central_region="us")))
    return runs


SCENARIOS: Dict[str, Callable[..., List[dict]]] = {
    "skylb-fig8": _fig8,
    "skylb-fig9": _fig9,
    "skylb-fig10": _fig10,
    "ray-blog-prefix": _blog,
    "gorgo": _gorgo,
    "network-hard": _network_hard,
    "shared-context": _shared_context,
}


def scenario_names() -> List[str]:
    return sorted(SCENARIOS)


def scenario_runs(name: str, scale: Optional[float] = None, duration_s: Optional[float] = None, seed: int = 0,
                  systems: Optional[List[str]] = None, profile: Optional[str] = None,
                  data_dir: Optional[str] = None) -> List[dict]:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(scenario_names())}")
    scale = DEFAULT_SCALE[name] if scale is None else scale
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    duration = DEFAULT_DURATION[name] if duration_s is None else duration_s
    runs = SCENARIOS[name](scale, duration, seed, systems, profile)
    for r in runs:
        r["scenario"] = name
        if data_dir:
            r["workload"]["data_dir"] = data_dir
    return runs


# ---------------------------------------------------------------------------------------- workloads
_DATA_PATTERNS = {
    "sharegpt": ["*sharegpt*.json", "*sharegpt*.jsonl", "*sharegpt*.json.gz", "*sharegpt*.jsonl.gz", "*ShareGPT*.json"],
    "wildchat": ["*wildchat*.jsonl", "*wildchat*.jsonl.gz", "*wildchat*.json", "*WildChat*.jsonl*"],
    "gsm8k": ["*gsm8k*.jsonl", "test.jsonl", "*gsm8k*.jsonl.gz"],
}


def _data_file(data_dir: str, kind: str) -> str:
    if not os.path.isdir(data_dir):
        raise ValueError(f"--data-dir {data_dir!r} is not a directory")
    for pat in _DATA_PATTERNS[kind]:
        hits = sorted(glob.glob(os.path.join(data_dir, pat)))
        if hits:
            return hits[0]
    raise ValueError(f"--data-dir {data_dir!r} has no {kind} file (looked for {', '.join(_DATA_PATTERNS[kind])})")


def remap_regions(workload, mapping: Dict[str, str]):
    """Rename a closed-loop workload's client regions (``{"us": "us-west", ...}``) in place."""
    from dataclasses import replace as dc_replace

    from .workloads import ClosedLoopSpec, ProgramStream

    cl = workload.closed
    if cl is None:
        raise ValueError("region_map applies to closed-loop workloads only")
    missing = [r for r in cl.clients if r not in mapping]
    if missing:
        raise ValueError(f"region_map has no entry for workload regions {missing}")

    def stream(src, region):
        return ProgramStream(lambda i: dc_replace(src[i], region=region), limit=src.limit)

    workload.closed = ClosedLoopSpec(clients={mapping[r]: n for r, n in cl.clients.items()},
                                     programs={mapping[r]: stream(cl.programs[r], mapping[r]) for r in cl.clients},
                                     think_time_s=cl.think_time_s)
    workload.description += f" (regions renamed {mapping})"
    return workload


def build_workload(spec):
    """``{"name": workload name (see workloads.WORKLOAD_NAMES), "kw": {...}, "data_dir": optional,
    "region_map": optional {workload region: network region}}`` (or a
    :class:`~ray_geolb.sim.run_spec.WorkloadSpec`; a dict is validated as one)."""
    from .run_spec import WorkloadSpec
    from .workloads import by_name

    spec = WorkloadSpec.model_validate(spec)
    name = spec.name
    kw = dict(spec.kw)
    data_dir = spec.data_dir
    if data_dir and "path" not in kw:
        base, _, arg = name.partition(":")
        if base == "conversation":
            kw["path"] = _data_file(data_dir, arg or kw.get("source", "sharegpt"))
        elif base in ("tot", "mixed-tot", "mixed_tot"):
            kw["path"] = _data_file(data_dir, "gsm8k")
        elif base == "diurnal" and (arg or "conversation") == "conversation":
            kw["path"] = _data_file(data_dir, kw.get("source", "sharegpt"))
        elif base == "diurnal" and arg == "tot":
            kw["path"] = _data_file(data_dir, "gsm8k")
    w = by_name(name, **kw)
    if spec.region_map:
        w = remap_regions(w, spec.region_map)
    return w


def run_one(run: Dict[str, Any], progress=None) -> Dict[str, Any]:
    """Simulate one run dict and return its summary (+ ``label``, ``group``, ``ttft_cdf``). The dict is
    validated first as a :class:`~ray_geolb.sim.run_spec.RunSpec` (a bad one raises a ``ValueError``
    naming the field); the summary's ``run`` records the dict as given."""
    from ray_geolb.percentile import percentile

    from .deploy import deployment_for
    from .metrics import summarize
    from .run_spec import RunSpec
    from .simulator import simulate

    spec = RunSpec.model_validate(run)
    wl = build_workload(spec.workload)
    dep = deployment_for(spec.system, spec.replicas, **spec.deploy)
    res = simulate(wl, dep, spec.sim, progress=progress)
    m = summarize(res)
    # the plotted CDF: the 0th..100th percentiles, by the project's one percentile definition
    ttft = [r[1] for r in res.requests]
    m["ttft_cdf"] = percentile(ttft, range(101)) if ttft else []
    m["label"] = spec.label
    m["group"] = spec.group
    m["scenario"] = spec.scenario
    m["run"] = {k: run[k] for k in ("system", "replicas", "workload", "sim", "deploy") if k in run}
    return m
