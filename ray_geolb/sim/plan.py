"""``python -m ray_geolb plan``: how many GPUs each region needs to serve a day of demand at an SLO,
under each routing system.

Inputs: the regional demand (``geo-diurnal-3``, the built-in 3-region day of
:mod:`~ray_geolb.sim.workloads.geo_diurnal`, or a CSV ``hour,region,rate``), the engine profile (one
replica = one GPU of that profile), the SLO (P99 TTFT, optional P99 TPOT, over every request of the
day: :mod:`~ray_geolb.sim.goodput`), optional GPU prices per region ($ per GPU-hour) and the systems
(``sim.deploy.SYSTEMS``; default GeoPrefix, region-local and the central LBs with the lowest P99 in
``benchmarks/compare_policies.py``: SGLang's cache-aware router and Ray's prefix router). Each
simulation is the whole day, time-compressed (``day_s`` simulated seconds; the compression is stated
in every output), open loop.

The search (deterministic; every round is one batch through the runner, so results are byte-identical
whatever the parallelism, :func:`~ray_geolb.sim.goodput.run_lockstep`):

1. **One replica's capacity** ``c1``: the SLO goodput (req/s) of one replica of the profile, alone in
   the first region, region-local, flat demand with the day's content mix (a short day of
   ``CAPACITY_DAY_S``). Used for starting points and for the plot's capacity lines only.
2. **Per system, greedy**: start every region with demand at ``max(1, floor(START_FRACTION * peak_r /
   c1))`` replicas (at least one per region: a region's own clients need a local replica for latency
   locality; the start is below any region's need at the rates we tried, see the prune step); simulate
   the day (every seed); while the SLO is missed (on the worst seed: the P99 over all requests or over
   one client region's requests above the SLO, :func:`~ray_geolb.sim.goodput.slo_run`), add one
   replica to the region whose clients' P99 TTFT is the worst (ties, e.g. several regions overloaded
   with an infinite P99: the lowest SLO attainment, then the region order) and simulate
   again, up to ``max_replicas`` in total. Then **prune**, once per region the greedy never grew
   (largest first): one replica less, kept if the SLO still holds. Then **descend**, for every system
   alike (:func:`_descend`): while some placement of one GPU fewer meets the SLO, move to the one with
   the lowest P99 -- every placement of that size is tried while there are at most
   ``DESCENT_EXHAUSTIVE_MAX`` (3 regions: up to 12 GPUs), which makes the answer the fewest GPUs of any
   placement under the monotonicity assumption below. The answer is the replicas per
   region, fixed all day (reserved GPUs): GPU-hours = GPUs x 24 h, cost = sum of each region's GPUs x
   24 x its price.
3. **References**, printed beside, each by a 1-D search over the replica count (start from the ``c1``
   estimate; down while it passes, up while it fails), on a POOLED deployment: the replicas in one
   region, a zero-RTT network. They are references, not bounds: nothing proves that no placement over
   the real network needs fewer GPUs, and no system is held to them.

   * **one pooled region, per system** (the ``pooled ref`` column): the system's OWN policy -- GeoPrefix's,
     region-local's, each central LB's -- with every replica in one region and the whole day's demand (every
     client's LB is the pool's: a per-region system has one LB there, a central LB sits there). What the
     system would need if the world were one region: the gap to its plan is what geography costs it;
   * **sum of regional peaks**: each region's requests alone (exactly as in the whole day: the same
     times and texts) on its own pool under one central prefix-aware LB (each of ``POOL_LBS``, Ray's prefix
     router and SGLang's; the fewer counts), summed: what region-local routing would need at perfect balance
     inside each region (its LB is a central one, not region-local's ingress, so region-local itself
     may need more).

What each plan cost is printed on stderr and kept in its JSON (``timing``): per system the runs of its own
search and of its pooled reference and the wall seconds they took where they ran, the searches no system
owns, the plan's wall time, and an estimate of its wall time on 2 and 16 workers through ``--ray`` /
``--address`` (:func:`~ray_geolb.sim.goodput_report.estimate_wall_s`); an SLO sweep also prints the wall
seconds per system per SLO. Wall time is not part of the result.

Savings are against region-local (when it is among the systems). The search assumes more replicas
never make the SLO harder to meet (tested on small cases); its answer equals an exhaustive search over
every placement on a small instance, for every system (``tests/sim/test_planner_finds_the_fewest_gpus.py``).
It minimises GPUs, then P99; it is not guaranteed to find the cheapest placement when prices differ by
region (it reports their cost).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from .goodput import DEFAULT_PROFILE, DEFAULT_SYSTEMS, SLO, goodput_many, parse_slos, run_lockstep, tail_s
from .goodput_report import format_timing, timing_summary
from .metrics import text_table
from .survive import add_survive_args, check_survive_args, format_survival, survive_plan
from .sweep import add_runner_args, parse_seeds
from .workloads.geo_diurnal import (
    BUILTIN_DEMANDS,
    DEFAULT_DAY_S,
    DEFAULT_MEAN_RPS,
    Demand,
    DemandCSVError,
    load_demand,
)

__all__ = ["DEFAULT_SYSTEMS", "placements", "plan", "add_plan_parser", "run_plan", "format_plan", "format_sweep",
           "format_sweep_timing",
           "parse_slos", "plot_plan", "load_demand", "POOL_LBS"]

DEFAULT_PLAN_DAY_S = DEFAULT_DAY_S
POOL_LBS = ("ray-prefix", "sgl")  # the sum-of-regional-peaks reference's central LBs (the fewer counts)
START_FRACTION = 0.6
CAPACITY_DAY_S = 48.0


def _base_run(label: str, system: str, replicas: Dict[str, int], demand: Demand, day_s: float, multiplier: float,
              profile: str, slo: SLO, deploy: Optional[dict] = None, keep: Optional[List[str]] = None) -> dict:
    kw = {**demand.workload_kw(), "day_s": day_s, "multiplier": multiplier}  # the demand's arrivals and mix too
    if keep is not None:
        kw["keep_regions"] = list(keep)
    return {"label": label, "group": "plan", "scenario": "plan", "system": system, "replicas": dict(replicas),
            "workload": {"name": "geo-diurnal", "kw": kw},
            "sim": {"duration_s": day_s + tail_s(slo), "seed": 0},
            "deploy": {"profile": profile, **(deploy or {})}, "slo": slo.to_dict(), "hour_s": day_s / 24.0}


def _seeded(run: dict, seed: int) -> dict:
    r = {**run, "workload": {**run["workload"], "kw": {**run["workload"]["kw"], "seed": seed}},
         "sim": {**run["sim"], "seed": seed}}
    r["label"] = f"{run['label']}/seed{seed}"
    return r


def _zero_rtt(regions: Sequence[str]) -> dict:
    regions = list(regions)
    return {"regions": regions, "rtt_ms": [[a, b, 0.0] for i, a in enumerate(regions) for b in regions[i + 1:]]}


def _worst(results: List[dict]) -> Dict[str, Any]:
    """Over seeds: meets = every seed meets; per region the worst P99 TTFT (None = infinite)."""
    inf = float("inf")
    per_region: Dict[str, float] = {}
    attain: Dict[str, float] = {}
    for m in results:
        for r, st in m["per_region"].items():
            v = inf if st["p99_ttft_s"] is None else st["p99_ttft_s"]
            per_region[r] = max(per_region.get(r, -inf), v)
            attain[r] = min(attain.get(r, 1.0), st["attainment"] if st["attainment"] is not None else 0.0)
    p99 = [inf if m["p99_ttft_s"] is None else m["p99_ttft_s"] for m in results]
    tpot = [inf if m["p99_tpot_s"] is None else m["p99_tpot_s"] for m in results]
    return {"meets": all(m["meets"] for m in results), "p99_ttft_s": max(p99), "p99_tpot_s": max(tpot),
            "attainment": min(m["attainment"] or 0.0 for m in results), "per_region_p99_ttft_s": per_region,
            "per_region_attainment": attain}


def _fin(x: float) -> Optional[float]:
    return None if x is None or math.isinf(x) else x


def _greedy(system: str, demand: Demand, start: Dict[str, int], seeds: Sequence[int], max_replicas: int,
            mk) -> Any:
    """The per-system search (module docstring, step 2), as a lockstep generator."""
    reps = dict(start)
    grown = set()
    history = []

    def record(reps, w):
        history.append({"replicas": dict(reps), "meets": w["meets"], "p99_ttft_s": _fin(w["p99_ttft_s"]),
                        "p99_tpot_s": _fin(w["p99_tpot_s"]),
                        "per_region_p99_ttft_s": {r: _fin(v) for r, v in w["per_region_p99_ttft_s"].items()},
                        "per_region_attainment": dict(w["per_region_attainment"])})

    while True:
        res = yield [_seeded(mk(system, reps), s) for s in seeds]
        w = _worst(res)
        record(reps, w)
        if w["meets"]:
            break
        if sum(reps.values()) >= max_replicas:
            return {"system": system, "replicas": None, "met": False, "history": history,
                    "note": f"SLO not met with {max_replicas} replicas (--max-replicas)"}
        per, att = w["per_region_p99_ttft_s"], w["per_region_attainment"]
        # the worst P99; among equal ones (several regions overloaded: infinite) the lowest attainment
        region = max(demand.regions, key=lambda r: (per.get(r, -1.0), -att.get(r, 1.0), -demand.regions.index(r)))
        reps[region] += 1
        grown.add(region)
    best, best_w = dict(reps), w
    for region in sorted((r for r in demand.regions if r not in grown and reps[r] > 1),
                         key=lambda r: (-reps[r], demand.regions.index(r))):
        trial = dict(best)
        trial[region] -= 1
        res = yield [_seeded(mk(system, trial), s) for s in seeds]
        w = _worst(res)
        record(trial, w)
        if w["meets"]:
            best, best_w = trial, w
    best, best_w = yield from _descend(system, demand.regions, best, best_w, seeds, mk, record)
    return {"system": system, "replicas": best, "met": True, "history": history,
            "p99_ttft_s": _fin(best_w["p99_ttft_s"]), "p99_tpot_s": _fin(best_w["p99_tpot_s"]),
            "attainment": best_w["attainment"],
            "per_region_p99_ttft_s": {r: _fin(v) for r, v in best_w["per_region_p99_ttft_s"].items()}}


#: the descent tries every placement of one GPU fewer while there are at most this many (else the ones
#: within ``DESCENT_RADIUS`` replicas moved of the current one)
DESCENT_EXHAUSTIVE_MAX = 45
DESCENT_RADIUS = 3


def placements(regions: Sequence[str], total: int) -> List[Dict[str, int]]:
    """Every placement of ``total`` replicas over ``regions``, at least one in each, in a fixed order."""
    k = len(regions)
    if total < k:
        return []
    if k == 1:
        return [{regions[0]: total}]
    return [{regions[0]: n, **rest} for n in range(total - k + 1, 0, -1)
            for rest in placements(regions[1:], total - n)]


def _descend(system: str, regions: Sequence[str], reps: Dict[str, int], w: dict, seeds: Sequence[int], mk,
             record) -> Any:
    """After the greedy: while some placement of one GPU fewer meets the SLO, take the one with the lowest
    worst-seed P99 (ties: the fixed placement order) and go on. Each round tries every placement of
    that size (at most :data:`DESCENT_EXHAUSTIVE_MAX` of them; else the ones that move at most
    :data:`DESCENT_RADIUS` replicas), in one batch. With the search's assumption that a replica more
    never makes the SLO harder (so some placement of n - 1 meets whenever one of n - 2 does), an
    exhaustive round that finds none proves the answer the fewest GPUs of any placement: this is what
    undoes a greedy placement that went wrong (a central LB's replicas placed where its clients' P99
    was worst, not where they help)."""
    tried = set()
    while sum(reps.values()) > len(regions):
        every = placements(list(regions), sum(reps.values()) - 1)
        if len(every) > DESCENT_EXHAUSTIVE_MAX:
            every = [c for c in every if sum(abs(c[r] - reps[r]) for r in regions) <= DESCENT_RADIUS]
        cands = [c for c in every if tuple(c[r] for r in regions) not in tried]
        tried.update(tuple(c[r] for r in regions) for c in cands)
        if not cands:
            break
        res = yield [_seeded(mk(system, c), s) for c in cands for s in seeds]
        k = len(seeds)
        met = []
        for i, c in enumerate(cands):
            cw = _worst(res[i * k:(i + 1) * k])
            record(c, cw)
            if cw["meets"]:
                met.append((cw["p99_ttft_s"], i, c, cw))
        if not met:
            break
        _, _, reps, w = min(met, key=lambda m: (m[0], m[1]))
    return reps, w


def _one_d(start: int, seeds: Sequence[int], max_replicas: int, mk) -> Any:
    """Fewest replicas n >= 1 on one pool: from ``start`` down while it passes, up while it fails."""
    tried: Dict[int, bool] = {}
    n = max(1, min(start, max_replicas))
    while True:
        res = yield [_seeded(mk(n), s) for s in seeds]
        tried[n] = _worst(res)["meets"]
        if tried[n]:
            if n == 1 or (n - 1) in tried:
                break
            n -= 1
        else:
            if (n + 1) in tried or n >= max_replicas:
                n = n + 1 if (n + 1) in tried else None
                break
            n += 1
    return {"replicas": n, "tried": {str(k): v for k, v in sorted(tried.items())}}


def _check_plan_inputs(demand: Demand, systems: Sequence[str], profile: str, seeds: Sequence[int],
                       pool_lbs: Sequence[str], references: bool, day_s: float, multiplier: float,
                       max_replicas: int, prices: Optional[Dict[str, float]]) -> Dict[str, float]:
    """Every input of :func:`plan` checked (a ValueError whose first word names the field); the prices."""
    from ray_geolb.engine.network import RegionNetwork
    from ray_geolb.engine.profiles import PROFILES

    from .deploy import SYSTEMS

    if profile not in PROFILES:
        raise ValueError(f"profile: unknown engine profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
    if not systems:
        raise ValueError("systems: at least one system is needed")
    for s in systems:
        if s not in SYSTEMS:
            raise ValueError(f"systems: unknown system {s!r}; known: {', '.join(sorted(SYSTEMS))}")
        if SYSTEMS[s].single_region:
            raise ValueError(f"systems: {s!r} puts every replica in one region; the planner places them per region")
    net = RegionNetwork.default().regions
    bad = [r for r in demand.regions if r not in net]
    if bad:
        raise ValueError(f"demand: unknown region(s) {bad}; the network has {net}")
    if not seeds:
        raise ValueError("seeds: at least one seed is needed")
    for lb in pool_lbs:
        if lb not in SYSTEMS or SYSTEMS[lb].lb_kind != "central":
            raise ValueError(f"pool_lbs: {lb!r} is not a central LB system")
    if references and not pool_lbs:
        raise ValueError("pool_lbs: at least one central LB is needed for the sum-of-regional-peaks reference")
    if not (day_s > 0 and math.isfinite(day_s)):
        raise ValueError(f"day_s must be a finite number > 0, got {day_s!r}")
    if not (multiplier > 0 and math.isfinite(multiplier)):
        raise ValueError(f"multiplier must be a finite number > 0, got {multiplier!r}")
    if not (isinstance(max_replicas, int) and max_replicas >= len(demand.regions)):
        raise ValueError(f"max_replicas must be an int >= the number of regions ({len(demand.regions)}), "
                         f"got {max_replicas!r}")
    prices = dict(prices or {})
    for r, p in prices.items():
        if r not in demand.regions:
            raise ValueError(f"prices: region {r!r} has no demand; regions: {demand.regions}")
        if not (isinstance(p, (int, float)) and math.isfinite(p) and p >= 0):
            raise ValueError(f"prices: price of {r!r} must be a finite number >= 0, got {p!r}")
    return prices


def _capacity(demand: Demand, profile: str, slo: SLO, seeds: Sequence[int], ray: bool, address: Optional[str],
              progress: bool, timing: Optional[dict] = None) -> tuple:
    """Step 1: one replica's SLO goodput (req/s, flat demand in the first region, the demand's arrivals and
    request mix) and the search behind it."""
    region = demand.regions[0]
    flat = Demand({region: [1.0] * 24}, "flat", workload=dict(demand.workload))
    cap_run = _base_run("capacity/1-replica", "region-local", {region: 1}, flat, CAPACITY_DAY_S, 1.0, profile, slo)
    cap_run.pop("hour_s")
    g = goodput_many({"capacity": cap_run}, slo, seeds, start=4.0, max_doublings=10, bisect_steps=4, ray=ray,
                     address=address, progress=progress, timing=timing)["capacity"]
    return g["min"], g


def _reference_searches(scaled: Demand, c1: float, systems: Sequence[str], pool_lbs: Sequence[str],
                        seeds: Sequence[int], max_replicas: int, run_of) -> Dict[str, Any]:
    """Step 3's 1-D searches: each system alone on one zero-RTT pool with the whole day's demand
    (``ref:pooled:<system>``), and each region's demand alone on a pool under each central LB of
    ``pool_lbs`` (``ref:peak:<region>:<lb>``). ``run_of(label, system, replicas, deploy, keep)``."""
    regions = scaled.regions
    zero = _zero_rtt(regions)

    def mk_pool(system: str, keep: Optional[List[str]], tag: str):
        region = keep[0] if keep else regions[0]

        def mk(n):  # the whole day's requests (of ``keep``'s regions only), on one zero-RTT pool
            return run_of(f"ref-{tag}-{system}/{n}", system, {region: n},
                          {"network": zero, "central_region": region}, keep)
        return mk

    searches: Dict[str, Any] = {}
    for s in systems:
        searches[f"ref:pooled:{s}"] = _one_d(max(1, math.ceil(scaled.peak() / c1) - 1), seeds, max_replicas,
                                             mk_pool(s, None, "pooled"))
    for lb in pool_lbs:
        for r in regions:
            searches[f"ref:peak:{r}:{lb}"] = _one_d(max(1, math.ceil(scaled.peak(r) / c1) - 1), seeds,
                                                    max_replicas, mk_pool(lb, [r], f"peak-{r}"))
    return searches


def _references(answers: Dict[str, Any], systems: Sequence[str], regions: Sequence[str],
                pool_lbs: Sequence[str]) -> Dict[str, Any]:
    """Step 3's figures from the searches' answers."""
    def fewest(region):  # the fewest replicas over the pool LBs (None: none met the SLO), and which LB
        got = [(answers[f"ref:peak:{region}:{lb}"]["replicas"], lb) for lb in pool_lbs]
        ok = [g for g in got if g[0] is not None]
        return min(ok) if ok else (None, None)

    peak_parts = {r: fewest(r) for r in regions}
    return {
        "pooled": {s: answers[f"ref:pooled:{s}"]["replicas"] for s in systems},
        "pooled_note": "each system's own policy with every replica in one region, zero RTT, the whole day's "
                       "demand: a reference, not a bound (no system is held to it)",
        "pool_lbs": list(pool_lbs),
        "sum_of_regional_peaks": (sum(n for n, _ in peak_parts.values())
                                  if all(n for n, _ in peak_parts.values()) else None),
        "sum_of_regional_peaks_per_region": {r: n for r, (n, _) in peak_parts.items()},
        "sum_of_regional_peaks_lb": {r: lb for r, (_, lb) in peak_parts.items()},
        "searches": {k: v for k, v in answers.items() if k.startswith("ref:")},
    }


def _system_rows(systems: Sequence[str], answers: Dict[str, Any], prices: Dict[str, float],
                 c1: float) -> List[Dict[str, Any]]:
    rows = []
    for s in systems:
        a = answers[s]
        reps = a["replicas"]
        row = {"system": s, "met": a["met"], "replicas": reps, "history": a["history"]}
        if reps:
            gpus = sum(reps.values())
            row.update({"gpus": gpus, "gpu_hours_per_day": gpus * 24.0,
                        "cost_per_day": (sum(n * 24.0 * prices[r] for r, n in reps.items()) if prices else None),
                        "p99_ttft_s": a["p99_ttft_s"], "p99_tpot_s": a["p99_tpot_s"], "attainment": a["attainment"],
                        "per_region_p99_ttft_s": a["per_region_p99_ttft_s"],
                        "capacity_rps_estimate": {r: n * c1 for r, n in reps.items()}})
        else:
            row["note"] = a["note"]
        rows.append(row)
    rl = next((r for r in rows if r["system"] == "region-local" and r.get("gpus")), None)
    for row in rows:
        if rl and row.get("gpus"):
            row["gpu_savings_vs_region_local"] = 1.0 - row["gpus"] / rl["gpus"]
            if row.get("cost_per_day") is not None and rl.get("cost_per_day"):
                row["cost_savings_vs_region_local"] = 1.0 - row["cost_per_day"] / rl["cost_per_day"]
    return rows


def plan(demand: Demand, slo: SLO, *, systems: Sequence[str] = tuple(DEFAULT_SYSTEMS), profile: str = DEFAULT_PROFILE,
         prices: Optional[Dict[str, float]] = None, seeds: Sequence[int] = (0,), day_s: float = DEFAULT_PLAN_DAY_S,
         multiplier: float = 1.0, max_replicas: int = 64, references: bool = True, ray: bool = False,
         address: Optional[str] = None, progress: bool = True, capacity: Optional[float] = None,
         pool_lbs: Sequence[str] = POOL_LBS, bounds: Optional[bool] = None) -> Dict[str, Any]:
    """The plan (module docstring) as a JSON-able dict. ``capacity``: skip step 1 and use this ``c1``.
    ``bounds``: the former name of ``references`` (step 3's figures were called bounds; they are not)."""
    if bounds is not None:
        references = bounds
    prices = _check_plan_inputs(demand, systems, profile, seeds, pool_lbs, references, day_s, multiplier,
                                max_replicas, prices)
    regions = demand.regions
    scaled = demand.scaled(multiplier)
    t0 = time.perf_counter()
    timing: Dict[str, Any] = {}  # what each search cost (goodput.run_lockstep), never part of the result
    if capacity is None:  # 1. one replica's capacity (req/s at the SLO, flat demand, first region)
        c1, cap_detail = _capacity(demand, profile, slo, seeds, ray, address, progress, timing)
    else:
        c1, cap_detail = float(capacity), {"given": True}
    if not c1 > 0:
        raise ValueError(f"one replica of {profile} does not meet {slo} even at a tiny load; loosen the SLO")

    def mk_system(system, reps):
        return _base_run(f"{system}/{'-'.join(f'{r}{n}' for r, n in reps.items())}", system, reps, scaled, day_s,
                         1.0, profile, slo)

    def run_of(label, system, reps, deploy, keep):
        return _base_run(label, system, reps, scaled, day_s, 1.0, profile, slo, deploy, keep)

    start = {r: max(1, int(math.floor(START_FRACTION * scaled.peak(r) / c1))) for r in regions}
    searches = {s: _greedy(s, scaled, start, seeds, max_replicas, mk_system) for s in systems}
    if references:
        searches.update(_reference_searches(scaled, c1, systems, pool_lbs, seeds, max_replicas, run_of))
    answers = run_lockstep(searches, ray=ray, address=address, progress=progress, desc="plan", timing=timing)
    rows = _system_rows(systems, answers, prices, c1)
    out: Dict[str, Any] = {
        "demand": {"source": demand.source, "regions": regions, "rates_rps_by_utc_hour": scaled.to_kw(),
                   "peak_rps": {r: scaled.peak(r) for r in regions}, "peak_total_rps": scaled.peak(),
                   "meta": demand.meta, "workload": dict(demand.workload)},
        "compression": {"day_s": day_s, "factor": 86400.0 / day_s, "multiplier": multiplier,
                        "note": Demand.compression_note(day_s, multiplier)},
        "profile": profile, "slo": slo.to_dict(), "slo_text": str(slo), "seeds": list(seeds), "prices": prices,
        "one_replica_capacity_rps": c1, "capacity_search": cap_detail, "start": start,
        "systems": rows, "max_replicas": max_replicas,
    }
    if references:
        out["references"] = _references(answers, systems, regions, pool_lbs)
        for row in rows:
            row["pooled_reference_gpus"] = out["references"]["pooled"][row["system"]]
    out["wall_s_note"] = "not part of the result (wall time varies)"
    out["_wall_s"] = time.perf_counter() - t0
    out["_timing"] = _plan_timing(timing, systems, list(searches), references)
    return out


def _plan_timing(timing: dict, systems: Sequence[str], names: Sequence[str], references: bool) -> Dict[str, Any]:
    """What the plan cost per system -- its own search and its pooled reference's -- and in the searches no
    system owns (:func:`~ray_geolb.sim.goodput_report.timing_summary`)."""
    per = {s: {"search": [s], **({"pooled ref": [f"ref:pooled:{s}"]} if references else {})} for s in systems}
    shared = {"capacity": ["capacity"], "sum of regional peaks": [n for n in names if n.startswith("ref:peak:")]}
    return timing_summary(timing, per, {k: v for k, v in shared.items() if any(n in timing.get("searches", {})
                                                                             for n in v)})


def _ref_cell(n: Optional[int], max_replicas: int) -> str:
    return str(n) if n else f"none <= {max_replicas}"


def format_plan(p: Dict[str, Any]) -> str:
    regions = p["demand"]["regions"]
    refs = p.get("references")
    tpot = p["slo"].get("tpot_s") is not None
    head = ["system", *regions, "GPUs"] + (["pooled ref"] if refs else []) + [
        "GPU-h/day", "$/day", "vs region-local", "P99 TTFT s"] + (["P99 TPOT s"] if tpot else []) + ["attain", "met"]
    table = [head]
    for row in p["systems"]:
        reps = row.get("replicas") or {}
        sav = row.get("gpu_savings_vs_region_local")
        line = [row["system"], *[str(reps.get(r, "-")) for r in regions], str(row.get("gpus", "-"))]
        if refs:
            line.append(_ref_cell(row.get("pooled_reference_gpus"), p["max_replicas"]))
        line += [f"{row['gpu_hours_per_day']:.0f}" if row.get("gpus") else "-",
                 f"{row['cost_per_day']:.0f}" if row.get("cost_per_day") is not None else "-",
                 f"{sav:+.1%}" if sav is not None else "-",
                 f"{row['p99_ttft_s']:.3f}" if row.get("p99_ttft_s") is not None else "-"]
        if tpot:
            line.append(f"{row['p99_tpot_s']:.4f}" if row.get("p99_tpot_s") is not None else "-")
        line += [f"{row['attainment']:.2%}" if row.get("attainment") is not None else "-",
                 "yes" if row["met"] else "NO"]
        table.append(line)
    d = p["demand"]
    peaks = ", ".join(f"{r} peak {d['peak_rps'][r]:.1f}" for r in regions)
    top = (f"plan: demand {d['source']} ({peaks}, "
           f"total peak {d['peak_total_rps']:.1f} req/s), {p['profile']}, {p['slo_text']}, seeds "
           f"{','.join(map(str, p['seeds']))}\n{p['compression']['note']}\n"
           f"one replica serves {p['one_replica_capacity_rps']:.2f} req/s at the SLO (flat load)")
    text = top + "\n\n" + text_table(table)
    if refs:
        parts = ", ".join(f"{r} {n} ({refs['sum_of_regional_peaks_lb'][r]})"
                          for r, n in refs["sum_of_regional_peaks_per_region"].items())
        text += ("\n\nreferences (zero RTT, every replica in one place; references, not bounds: no system is held "
                 "to them):\n  pooled ref: the system's own policy on one pooled region with the whole day's demand"
                 f"\n  sum of regional peaks (each region alone on its own pool, one central LB: the fewer of "
                 f"{', '.join(refs['pool_lbs'])}): {refs['sum_of_regional_peaks']} GPUs ({parts})")
    return text


def plot_plan(p: Dict[str, Any], path: str) -> str:
    """Each region's demand over the UTC day against each system's capacity there (replicas x one replica's
    SLO capacity, an estimate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regions = p["demand"]["regions"]
    fig, axes = plt.subplots(1, len(regions), figsize=(4.2 * len(regions), 3.4), sharey=True, squeeze=False)
    hours = list(range(25))
    for ax, r in zip(axes[0], regions):
        rates = p["demand"]["rates_rps_by_utc_hour"][r]
        ax.step(hours, rates + rates[-1:], where="post", color="black", lw=2, label="demand")
        n_sys = len(p["systems"])
        for k, row in enumerate(p["systems"]):
            reps = row.get("replicas")
            if reps:  # widest first, so systems with the same count stay visible as nested lines
                cap = reps[r] * p["one_replica_capacity_rps"]
                ax.axhline(cap, ls=("--", ":", "-.", (0, (5, 1)))[k % 4], color=f"C{k}", lw=1.0 + 1.2 * (n_sys - k),
                           alpha=0.7, label=f"{row['system']}: {reps[r]} GPU")
        ax.set_title(r)
        ax.set_xlabel("UTC hour")
        ax.set_xlim(0, 24)
        ax.legend(fontsize=7)
    caps = [n * p["one_replica_capacity_rps"] for row in p["systems"] for n in (row.get("replicas") or {}).values()]
    top = max([max(xs) for xs in p["demand"]["rates_rps_by_utc_hour"].values()] + caps)
    axes[0][0].set_ylim(0, 1.12 * top)
    axes[0][0].set_ylabel("req/s")
    fig.suptitle(f"plan: {p['demand']['source']}, {p['slo_text']}; capacity = GPUs x one replica's SLO capacity "
                 f"({p['one_replica_capacity_rps']:.1f} req/s, estimate)\n{p['compression']['note']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ CLI
def add_plan_parser(subparsers) -> argparse.ArgumentParser:
    sp = subparsers.add_parser(
        "plan", help="capacity planner: GPUs per region at an SLO for each routing system",
        description=("How many GPUs each region needs to serve a day of regional demand at a P99 TTFT SLO, "
                     "per routing system (simulated, time-compressed)."))
    sp.add_argument("--demand", default="geo-diurnal-3",
                    help=f"built-in demand ({', '.join(BUILTIN_DEMANDS)}) or a CSV with columns hour,region,rate "
                         "(UTC hour 0..23, requests/s; unlisted hours keep the previous listed hour's rate)")
    sp.add_argument("--mean-rps", type=float, default=None,
                    help=f"built-in demand: total mean req/s over the day (default {DEFAULT_MEAN_RPS:g})")
    sp.add_argument("--rate-scale", type=float, default=1.0, help="multiply every rate (default 1)")
    sp.add_argument("--profile", default=DEFAULT_PROFILE,
                    help=f"engine profile, one GPU each (default {DEFAULT_PROFILE})")
    sp.add_argument("--ttft-slo", default="1",
                    help="P99 TTFT SLO in seconds, or several comma-separated (an SLO sweep: one plan per SLO and "
                         "a table of GPUs per system per SLO), e.g. 0.3,0.5,1,2 (default 1)")
    sp.add_argument("--tpot-slo", type=float, default=None, help="optional P99 TPOT SLO in seconds per token")
    sp.add_argument("--price", default=None, metavar="REGION=USD_PER_GPU_HOUR[,...]",
                    help="GPU price per region, e.g. us=2.5,eu=2.9,asia=3.1")
    sp.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help=f"comma-separated systems (default {','.join(DEFAULT_SYSTEMS)})")
    sp.add_argument("--seeds", default="0", help="comma-separated seeds; the SLO must hold on every seed (default 0)")
    sp.add_argument("--day-s", type=float, default=DEFAULT_PLAN_DAY_S,
                    help=f"simulated seconds for the 24 h day (default {DEFAULT_PLAN_DAY_S:g})")
    sp.add_argument("--max-replicas", type=int, default=64, help="give up past this many replicas in total")
    sp.add_argument("--capacity", type=float, default=None,
                    help="one replica's req/s at the SLO (skips measuring it)")
    sp.add_argument("--no-references", "--no-bounds", dest="references", action="store_false",
                    help="skip the references (each system on one zero-RTT pool, the sum of regional peaks); "
                         "--no-bounds is its former name")
    sp.add_argument("--pool-lbs", default=",".join(POOL_LBS),
                    help="central LBs the sum-of-regional-peaks reference tries, the fewer replicas counts "
                         f"(default {','.join(POOL_LBS)})")
    add_survive_args(sp)
    sp.add_argument("--out", default=None, help="output directory (plan.json, plan.txt, plan.png)")
    add_runner_args(sp)
    sp.set_defaults(func=run_plan, _plan_parser=sp)
    return sp


def _parse_prices(parser, spec: Optional[str]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            parser.error(f"--price: {part!r} is not REGION=PRICE")
        try:
            x = float(v)
        except ValueError:
            parser.error(f"--price: price {v!r} of {k.strip()!r} is not a number")
        if not (math.isfinite(x) and x >= 0):
            parser.error(f"--price: price of {k.strip()!r} must be a finite number >= 0, got {v!r}")
        out[k.strip()] = x
    return out


def format_sweep(plans: List[Dict[str, Any]]) -> str:
    """GPUs per system (rows) per SLO (columns) of an SLO sweep, with the system's pooled reference in
    brackets when the plans have references; ``none <= N`` where a system meets the SLO at no count up to
    ``--max-replicas``."""
    slos = [p["slo_text"] for p in plans]
    systems = [r["system"] for r in plans[0]["systems"]]
    rows = []
    for s in systems:
        row = [s]
        for p in plans:
            r = next(x for x in p["systems"] if x["system"] == s)
            cell = _ref_cell(r.get("gpus"), p["max_replicas"])
            if p.get("references"):
                cell += f" (pool {_ref_cell(r.get('pooled_reference_gpus'), p['max_replicas'])})"
            row.append(cell)
        rows.append(row)
    return text_table([["system"] + slos, *rows])


def format_sweep_timing(plans: List[Dict[str, Any]]) -> str:
    """Wall seconds per system (rows) per SLO (columns) of an SLO sweep: the system's own search and its
    pooled reference, summed over their runs (``timing`` in each plan's JSON); the last row each plan's
    whole wall time, the shared searches included."""
    rows = []
    for s in [r["system"] for r in plans[0]["systems"]]:
        rows.append([s] + [f"{sum(v['run_s'] for v in p['timing']['per_system'][s].values()):.1f}" for p in plans])
    rows.append(["whole plan"] + [f"{p['timing']['wall_s']:.1f}" for p in plans])
    return text_table([["system"] + [p["slo_text"] for p in plans], *rows])


def run_plan(args) -> int:
    parser = getattr(args, "_plan_parser", None) or argparse.ArgumentParser(prog="plan")
    slos = parse_slos(parser, args.ttft_slo)
    for flag, v, ok in (("--tpot-slo", args.tpot_slo, args.tpot_slo is None or args.tpot_slo > 0),
                        ("--rate-scale", args.rate_scale, args.rate_scale > 0),
                        ("--day-s", args.day_s, args.day_s > 0),
                        ("--mean-rps", args.mean_rps, args.mean_rps is None or args.mean_rps > 0),
                        ("--capacity", args.capacity, args.capacity is None or args.capacity > 0)):
        if not ok or (isinstance(v, float) and not math.isfinite(v)):
            parser.error(f"{flag} must be a finite number > 0, got {v}")
    try:
        demand = load_demand(args.demand, args.mean_rps)
    except DemandCSVError as e:
        parser.error(f"--demand: {e}")
    except ValueError as e:
        parser.error(f"--demand: {e}")
    seeds = parse_seeds(parser, args.seeds)
    check_survive_args(parser, args)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    prices = _parse_prices(parser, args.price)
    plans = []
    for ttft in slos:
        try:
            p = plan(demand, SLO(ttft, args.tpot_slo), systems=systems, profile=args.profile, prices=prices,
                     seeds=seeds, day_s=args.day_s, multiplier=args.rate_scale, max_replicas=args.max_replicas,
                     references=args.references, ray=args.ray, address=args.address, progress=args.progress,
                     capacity=args.capacity, pool_lbs=[s.strip() for s in args.pool_lbs.split(",") if s.strip()])
        except ValueError as e:
            field = str(e).split(":", 1)[0].split(" ", 1)[0]
            flag = {"profile": "--profile", "systems": "--systems", "prices": "--price", "seeds": "--seeds",
                    "max_replicas": "--max-replicas", "demand": "--demand", "pool_lbs": "--pool-lbs"}.get(field)
            parser.error(f"{flag}: {e}" if flag else str(e))
        p.pop("_wall_s")
        p.pop("wall_s_note", None)
        p["timing"] = p.pop("_timing")  # in the JSON, not in the table (it varies from run to run)
        text = format_plan(p)
        if args.survive_region_loss:
            text += "\n\n" + _survival(p, demand, SLO(ttft, args.tpot_slo), seeds, args)
        print(text if len(slos) == 1 else f"== {p['slo_text']} ==\n{text}\n")
        print("\n" + format_timing(p["timing"], f"plan at {p['slo_text']} ({len(systems)} systems, demand "
                                                f"{demand.source}, seeds {args.seeds})"), file=sys.stderr)
        _write_plan(args.out, p, text, "" if len(slos) == 1 else f"_slo{ttft:g}")
        plans.append(p)
    if len(plans) > 1:
        sweep = format_sweep(plans)
        print(f"GPUs per system per SLO ({demand.source}; seeds {','.join(map(str, seeds))}"
              f"{'; in brackets each system alone on one zero-RTT pool, a reference' if args.references else ''})"
              f":\n{sweep}")
        print(f"\nwall seconds per system per SLO ({demand.source}; each system's runs, summed):\n"
              f"{format_sweep_timing(plans)}", file=sys.stderr)
        if args.out:
            from .metrics import dumps

            with open(os.path.join(args.out, "sweep.txt"), "w") as f:
                f.write(sweep + "\n")
            with open(os.path.join(args.out, "sweep.json"), "w") as f:
                f.write(dumps({"slos": [p["slo"] for p in plans], "plans": plans}))
    return 0


def _survival(p: Dict[str, Any], demand: Demand, slo: SLO, seeds: Sequence[int], args) -> str:
    """``--survive-region-loss``: each met system's placement grown until it survives any one region's loss
    (``survive.py``); kept in the plan's JSON as ``survive_region_loss``."""
    def base_run_of(system: str, reps: Dict[str, int]) -> dict:
        return _base_run(f"survive/{system}", system, reps, demand, args.day_s, args.rate_scale, args.profile, slo)

    p["survive_region_loss"] = survive_plan(p, base_run_of, slo, seeds, args)
    return format_survival(p, p["survive_region_loss"])


def _write_plan(out: Optional[str], p: Dict[str, Any], text: str, suffix: str) -> None:
    if not out:
        return
    from .metrics import dumps

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"plan{suffix}.json"), "w") as f:
        f.write(dumps(p))
    with open(os.path.join(out, f"plan{suffix}.txt"), "w") as f:
        f.write(text + "\n")
    try:
        png = plot_plan(p, os.path.join(out, f"plan{suffix}.png"))
        print(f"wrote {os.path.join(out, f'plan{suffix}.json')}, {png}", file=sys.stderr)
    except ImportError as e:
        print(f"no plot ({e})", file=sys.stderr)
