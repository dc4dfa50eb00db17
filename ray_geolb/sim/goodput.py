"""SLO goodput: the largest load a deployment serves within its latency SLO, and SLO attainment.

* :class:`SLO`: a P99 TTFT bound (s) and an optional P99 TPOT bound (s per output token after the first).
* :func:`slo_run` (the per-run function the runner ships, :func:`~ray_geolb.sim.sweep.run_many`'s ``fn``):
  one open-loop run, the arrivals cut at the workload's end and the simulation at ``duration_s`` (the
  workload's day plus a tail, :func:`tail_s`). Every request SENT counts: one whose first token had not
  reached its client by the cut-off (still queued, refused until then, or rejected) counts as an SLO miss
  with an infinite TTFT and TPOT (the tail is longer than the SLO, so a request without its first token by
  then missed it). From the simulator's per-request records ``(t_send, ttft, e2e, prompt, output, ...)``:
  TTFT as recorded, TPOT = (e2e - ttft) / (output - 1) for outputs of 2+ tokens. A request still decoding
  at the cut-off (a long output late in the day: its first token came, its last had not) counts with its
  TTFT and the TPOT it had so far (``SimResult.unfinished``; None under 2 tokens, then it counts in TTFT
  only). (Such a request used to count as a miss: near the knee the tail held more than 1 % of them, and a
  run whose every first token met the SLO read an infinite P99.) Reported: P99 TTFT / TPOT over all sent
  requests, attainment (the share of sent requests within every SLO), the same per client region and
  per hour of the (compressed) day. A run MEETS the SLO when the P99s over all requests and over each
  client region's requests are within it (so a small region cannot be starved inside the global 1 %);
  per hour is reported, not required (a compressed hour has too few requests for a stable P99).
* :func:`goodput`: the largest rate multiplier ``m`` at which P99 TTFT <= SLO (and P99 TPOT <= SLO).
  Deterministic search per seed on a fixed grid: start at ``start``; double while it passes (halve
  while it fails) up to ``max_doublings`` steps, then ``bisect_steps`` bisections of [last pass, first
  fail] at the geometric midpoint rounded to 3 significant digits (the command's default, 6 bisections,
  narrows a x2 bracket to 2 ** (1 / 64): about 1.1 %; each seed's answer carries its bracket's relative
  width, ``resolution``). The searches of all seeds (and of all deployments given to :func:`goodput_many`)
  run in lockstep rounds, each round one batch through the runner (:func:`~ray_geolb.sim.sweep.run_many`:
  local by default, Ray with ``ray``/``address``), so the result is a function of the inputs only:
  byte-identical whatever the parallelism. Reported per seed, with the spread (min / mean / max) over
  seeds. The search assumes passing is monotone in the multiplier (a model assumption, see the tests).
* **Several SLOs at once** (the command's ``--ttft-slo 0.3,0.5,1,2``): one search per SLO and seed, and a
  (seed, multiplier) that any of them needs is simulated once and judged at every SLO (a run dict with
  ``"slos"``; the cut-off is the longest SLO's, :func:`tail_s`: the same 20 s for every TTFT SLO up to
  4 s), so the sweep shares its runs and each SLO gets the answer its own search would give. Every
  multiplier simulated is a point of the seed's **curve** (P99 TTFT / TPOT, and attainment per SLO): the
  command publishes those curves and judges the first system against each other one, a difference
  inside the search's resolution or the seeds' spread being a tie (:mod:`~ray_geolb.sim.goodput_report`).
* :func:`attainment`: SLO attainment at a fixed load (one run per seed).

A run dict here is a :class:`~ray_geolb.sim.run_spec.RunSpec` dict with an extra key ``"slo"``
(``SLO.to_dict()``); its workload must be open-loop and take a ``multiplier`` keyword (``geo-diurnal``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence

__all__ = ["DEFAULT_PROFILE", "DEFAULT_SYSTEMS", "SLO", "simulate_run", "slo_run", "tail_s", "goodput", "goodput_many",
           "attainment", "run_lockstep", "timed_slo_run", "grid_round", "parse_slos", "add_goodput_parser",
           "run_goodput"]

BIG = 1e9  # a miss's TTFT / TPOT in the percentile (reported as None = infinite)
#: the systems ``plan`` and ``goodput`` compare by default, and the engine profile they run
DEFAULT_SYSTEMS = ["geoprefix", "region-local", "sgl", "ray-prefix"]
DEFAULT_PROFILE = "llama3.1-8b-h100"
#: the goodput command's bisections after bracketing: a bracket of x2 narrowed to 2 ** (1 / 64), about 1.1 %
BISECT_STEPS = 6
#: the goodput command's doublings (or halvings) from ``--start`` before it gives up bracketing
MAX_DOUBLINGS = 10


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: Optional[float] = None

    def __post_init__(self):
        if not (isinstance(self.ttft_s, (int, float)) and math.isfinite(self.ttft_s) and self.ttft_s > 0):
            raise ValueError(f"slo.ttft_s must be a finite number > 0, got {self.ttft_s!r}")
        if self.tpot_s is not None and not (isinstance(self.tpot_s, (int, float)) and math.isfinite(self.tpot_s)
                                            and self.tpot_s > 0):
            raise ValueError(f"slo.tpot_s must be a finite number > 0 or None, got {self.tpot_s!r}")

    def to_dict(self) -> dict:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}

    def __str__(self) -> str:
        return f"P99 TTFT <= {self.ttft_s:g} s" + (f", P99 TPOT <= {self.tpot_s:g} s" if self.tpot_s else "")


def tail_s(slo: SLO) -> float:
    """Simulated seconds after the last arrival before the cut-off: longer than the TTFT SLO."""
    return max(20.0, 5.0 * slo.ttft_s)


def _p99(xs: List[float]) -> Optional[float]:
    from ray_geolb.percentile import percentile

    if not xs:
        return None
    v = percentile(xs, (99,))[0]
    return None if v >= BIG / 2 else v


def _stats(rows: List[tuple], missed: int, slo: SLO) -> Dict[str, Any]:
    """rows: (ttft, tpot or None); ``missed``: requests sent but not completed (misses)."""
    n = len(rows) + missed
    ttft = [r[0] for r in rows] + [BIG] * missed
    tpot = [r[1] for r in rows if r[1] is not None] + [BIG] * missed
    ok = sum(1 for a, b in rows if a <= slo.ttft_s and (slo.tpot_s is None or b is None or b <= slo.tpot_s))
    p99_ttft, p99_tpot = _p99(ttft), _p99(tpot)
    meets = n > 0 and p99_ttft is not None and p99_ttft <= slo.ttft_s and \
        (slo.tpot_s is None or (p99_tpot is not None and p99_tpot <= slo.tpot_s))
    return {"sent": n, "missed": missed, "p99_ttft_s": p99_ttft, "p99_tpot_s": p99_tpot,
            "attainment": ok / n if n else None, "meets": bool(meets)}


def simulate_run(run: Dict[str, Any], progress=None) -> tuple:
    """Simulate one run dict (RunSpec + ``"slo"`` or ``"slos"``, optional ``"hour_s"``): (spec, slos, hour_s,
    workload, result). The SLOs do not enter the simulation (the cut-off is the run's ``duration_s``)."""
    from .deploy import deployment_for
    from .run_spec import RunSpec
    from .scenarios import build_workload
    from .simulator import simulate

    run = dict(run)
    slos = [SLO(**d) for d in run.pop("slos")] if "slos" in run else [SLO(**run.pop("slo"))]
    hours_of = run.pop("hour_s", None)  # seconds per hour of the compressed day (per-hour figures)
    spec = RunSpec.model_validate(run)
    wl = build_workload(spec.workload)
    if wl.open is None:
        raise ValueError("workload: SLO goodput needs an open-loop workload (e.g. geo-diurnal)")
    dep = deployment_for(spec.system, spec.replicas, **spec.deploy)
    return spec, slos, hours_of, wl, simulate(wl, dep, spec.sim, progress=progress)


def _tally(spec, wl, res, hours_of) -> Dict[str, Any]:
    """Requests sent (per client region, per hour) and the (TTFT, TPOT) row of each one whose first token reached
    its client by the cut-off (completed, or still decoding), grouped alike."""
    sent_by_region: Dict[str, int] = {}
    sent_by_hour: Dict[tuple, int] = {}
    for t, prog in wl.open.arrivals:
        if t < spec.sim.duration_s:
            sent_by_region[prog.region] = sent_by_region.get(prog.region, 0) + 1
            if hours_of:
                key = (prog.region, int(t // hours_of))
                sent_by_hour[key] = sent_by_hour.get(key, 0) + 1
    by_region: Dict[str, List[tuple]] = {r: [] for r in sent_by_region}
    by_hour: Dict[tuple, List[tuple]] = {k: [] for k in sent_by_hour}
    rows = []
    answered = [((t_send, ttft, (e2e - ttft) / (out - 1) if out > 1 else None, region)  # TPOT: after the first token
                 for t_send, ttft, e2e, _prompt, out, _w, _cross, region, _rep in res.requests),
                ((t_send, ttft, tpot, region)  # still decoding at the cut-off: the TPOT so far
                 for t_send, ttft, tpot, _prompt, _out, _w, _cross, region, _rep in res.unfinished or ())]
    for part in answered:
        for t_send, ttft, tpot, region in part:
            row = (ttft, tpot)
            rows.append(row)
            by_region.setdefault(region, []).append(row)
            if hours_of:
                by_hour.setdefault((region, int(t_send // hours_of)), []).append(row)
    return {"rows": rows, "sent": sum(sent_by_region.values()), "by_region": by_region, "hourly": bool(hours_of),
            "sent_by_region": sent_by_region, "by_hour": by_hour, "sent_by_hour": sent_by_hour}


def _judge(spec, res, tl: Dict[str, Any], slo: SLO) -> Dict[str, Any]:
    """One simulated run's figures at one SLO (module docstring)."""
    from .attribution import attribute

    out = _stats(tl["rows"], max(0, tl["sent"] - len(tl["rows"])), slo)
    out["per_region"] = {r: _stats(rows, max(0, tl["sent_by_region"].get(r, 0) - len(rows)), slo)
                         for r, rows in sorted(tl["by_region"].items())}
    out["meets_overall"] = out["meets"]
    out["meets"] = out["meets"] and all(st["meets"] for st in out["per_region"].values())
    if tl["hourly"]:
        out["per_hour"] = {f"{r}/{h:02d}": {k: v for k, v in _stats(rows, max(
            0, tl["sent_by_hour"].get((r, h), 0) - len(rows)), slo).items() if k in ("p99_ttft_s", "sent")}
            for (r, h), rows in sorted(tl["by_hour"].items())}
    out["attribution"] = attribute(res, slo.ttft_s, tl["sent"])
    out.update({"label": spec.label, "system": spec.system, "replicas": dict(spec.replicas),
                "seed": spec.sim.seed, "multiplier": spec.workload.kw.get("multiplier", 1.0),
                "slo": slo.to_dict(), "counters": dict(res.counters), "elapsed_s": res.elapsed_s})
    return out


def slo_run(run: Dict[str, Any], progress: Optional[Callable[[float], None]] = None) -> Dict[str, Any]:
    """One run (a RunSpec dict + ``"slo"``) -> SLO figures (module docstring). Pure: a function of ``run``.
    With ``"slos"`` (a list of ``SLO.to_dict()``) instead: ONE simulation judged at each SLO,
    ``{"by_slo": [figures at each SLO, in order], "seed", "multiplier", "label"}``."""
    spec, slos, hours_of, wl, res = simulate_run(run, progress)
    tl = _tally(spec, wl, res, hours_of)
    judged = [_judge(spec, res, tl, slo) for slo in slos]
    if "slos" not in run:
        return judged[0]
    return {"by_slo": judged, "seed": spec.sim.seed, "multiplier": spec.workload.kw.get("multiplier", 1.0),
            "label": spec.label}


# ------------------------------------------------------------------------------------------ lockstep runner
Search = Generator[List[dict], List[dict], Any]


class _RoundBar:
    """Progress on stderr: a tqdm counter of finished runs (imported lazily), or one line per round."""

    def __init__(self, desc: str, enabled: bool):
        import sys

        self.desc, self.enabled, self.stream = desc, enabled, sys.stderr
        self.k = self.n = 0
        self.tq = None
        if enabled:
            try:
                from tqdm import tqdm

                self.tq = tqdm(desc=desc, unit="run", file=self.stream, leave=True)
            except ImportError:
                self.tq = None

    def round(self, runs: int, searches: int) -> None:
        self.k += 1
        if not self.enabled:
            return
        note = f"round {self.k}: {runs} runs, {searches} searches going"
        if self.tq is not None:
            self.tq.set_postfix_str(note)
        else:
            self.stream.write(f"{self.desc}: {note} ({self.n} runs done)\n")
            self.stream.flush()

    def one(self) -> None:
        self.n += 1
        if self.tq is not None:
            self.tq.update(1)

    def close(self) -> None:
        if self.tq is not None:
            self.tq.close()


def timed_slo_run(run: Dict[str, Any], progress: Optional[Callable[[float], None]] = None) -> Dict[str, Any]:
    """:func:`slo_run` and the wall seconds it took where it ran (``{"result", "wall_s"}``): what the
    lockstep runner ships, so each search's cost is known while its results stay a function of the run."""
    import time

    t0 = time.perf_counter()
    res = slo_run(run, progress)
    return {"result": res, "wall_s": time.perf_counter() - t0}


def _account(timing: Optional[dict], batch: List[tuple], timed: List[dict]) -> None:
    """Add one lockstep round's run seconds to ``timing``: per search (``searches``: runs, run_s) and the
    round itself (``rounds``: runs, run_s, longest_run_s)."""
    if timing is None or not timed:
        return
    per = timing.setdefault("searches", {})
    for (name, _), t in zip(batch, timed):
        acc = per.setdefault(name, {"runs": 0, "run_s": 0.0})
        acc["runs"] += 1
        acc["run_s"] += t["wall_s"]
    walls = [t["wall_s"] for t in timed]
    timing.setdefault("rounds", []).append({"runs": len(walls), "run_s": sum(walls), "longest_run_s": max(walls)})


def run_lockstep(searches: Dict[str, Search], *, ray: bool = False, address: Optional[str] = None,
                 progress: bool = True, desc: str = "search", timing: Optional[dict] = None) -> Dict[str, Any]:
    """Drive generator searches in rounds: each yields a list of run dicts and gets their results back
    (same order) until it returns its answer. A round's runs, from every search still going, are ONE
    batch through :func:`~ray_geolb.sim.sweep.run_many` (local or on Ray). Each search sees only its own
    results, so the answers do not depend on the parallelism. Returns ``{name: answer}``. ``timing``
    (a dict, filled in): each run's wall seconds where it ran, per search and per round
    (:func:`_account`), and the whole call's ``wall_s``; never part of an answer."""
    import time

    from .sweep import ray_session, run_many

    t0 = time.perf_counter()
    answers: Dict[str, Any] = {}
    pending: Dict[str, List[dict]] = {}
    for name, g in searches.items():
        try:
            pending[name] = next(g)
        except StopIteration as e:
            answers[name] = e.value
    bar = _RoundBar(desc, progress)
    with ray_session(ray, address):
        while pending:
            batch = [(name, r) for name, rs in pending.items() for r in rs]
            bar.round(len(batch), len(pending))
            timed = run_many([r for _, r in batch], ray=ray, address=address, progress=False, fn=timed_slo_run,
                             on_result=lambda i, m: bar.one())
            _account(timing, batch, timed)
            results = [t["result"] for t in timed]
            nxt: Dict[str, List[dict]] = {}
            for name in pending:
                res = [m for (n, _), m in zip(batch, results) if n == name]
                try:
                    nxt[name] = searches[name].send(res)
                except StopIteration as e:
                    answers[name] = e.value
            pending = nxt
    bar.close()
    if timing is not None:
        timing["wall_s"] = timing.get("wall_s", 0.0) + time.perf_counter() - t0
    return answers


def grid_round(x: float) -> float:
    """``x`` rounded to 3 significant digits (the search's fixed grid)."""
    if x <= 0:
        return 0.0
    return float(f"{x:.3g}")


def _with_multiplier(run: dict, m: float, seed: int) -> dict:
    r = {**run, "workload": {**run["workload"], "kw": {**run["workload"].get("kw", {}), "multiplier": m,
                                                       "seed": seed}},
         "sim": {**run["sim"], "seed": seed}}
    r["label"] = f"{run['label']}/x{m:g}/seed{seed}"
    return r


class _Bracket:
    """One seed's search at one SLO (module docstring): ``start``; doubling while it passes (halving while it
    fails) for up to ``max_doublings`` steps; then ``bisect_steps`` bisections of [last pass, first fail] at
    the geometric midpoint on the 3-digit grid."""

    def __init__(self, start: float, max_doublings: int, bisect_steps: int):
        self.start, self.max_doublings, self.bisect_steps = start, max_doublings, bisect_steps
        self.lo: Optional[float] = None
        self.hi: Optional[float] = None
        self.k = self.bis = 0
        self.tried: Dict[float, dict] = {}

    def next_m(self) -> Optional[float]:
        lo, hi = self.lo, self.hi
        if lo is None and hi is None:
            return self.start
        if lo is None or hi is None:  # bracketing: double from the last pass, halve from the last fail
            if self.k >= self.max_doublings:
                return None
            m = grid_round(lo * 2) if hi is None else grid_round(hi / 2)
            return m if m > 0 else None
        if self.bis >= self.bisect_steps:
            return None
        mid = grid_round(math.sqrt(lo * hi))
        return None if mid in (lo, hi) else mid

    def feed(self, m: float, res: dict) -> None:
        if self.lo is not None and self.hi is not None:
            self.bis += 1
        else:
            self.k += 1
        self.tried[m] = res
        if res["meets"]:
            self.lo = m
        else:
            self.hi = m

    def answer(self) -> dict:
        lo, hi = self.lo, self.hi
        return {"goodput_multiplier": lo or 0.0, "first_fail": hi,
                "resolution": (hi / lo - 1.0) if lo and hi else None,
                "tried": {f"{m:g}": {k: r[k] for k in ("meets", "p99_ttft_s", "p99_tpot_s", "attainment")}
                          for m, r in sorted(self.tried.items())}}


def _curve_point(m: float, r: dict) -> dict:
    first = r["by_slo"][0]  # the P99s do not depend on the SLO; attainment and meeting it do
    return {"multiplier": m, "p99_ttft_s": first["p99_ttft_s"], "p99_tpot_s": first["p99_tpot_s"],
            "per_region_p99_ttft_s": {g: st["p99_ttft_s"] for g, st in first["per_region"].items()},
            "sent": first["sent"], "missed": first["missed"],
            "attainment": [j["attainment"] for j in r["by_slo"]], "meets": [j["meets"] for j in r["by_slo"]]}


def _goodput_search(run: dict, seeds: Sequence[int], start: float, max_doublings: int, bisect_steps: int,
                    slos: Optional[Sequence[SLO]] = None, at: Optional[float] = None) -> Search:
    """Per SLO and seed a :class:`_Bracket`, all in lockstep. A (seed, multiplier) that any of them needs is
    simulated once and judged at every SLO (:func:`slo_run` with ``"slos"``), so an SLO sweep's searches
    share their runs; ``at``: every seed also runs at that multiplier (attainment at a fixed load).
    Returns ``by_slo`` (the answer per SLO: per seed and :func:`spread`), ``curve`` (per seed, every
    multiplier simulated, in order: P99 TTFT / TPOT, and attainment and meeting it per SLO) and ``at``."""
    from .goodput_report import spread

    slos = list(slos) if slos else [SLO(**run["slo"])]
    base = {k: v for k, v in run.items() if k != "slo"}
    base["slos"] = [s.to_dict() for s in slos]
    brackets = {(k, s): _Bracket(start, max_doublings, bisect_steps) for k in range(len(slos)) for s in seeds}
    done: Dict[tuple, dict] = {}
    while True:
        want = set()
        for (k, s), b in brackets.items():
            m = b.next_m()
            while m is not None and (s, m) in done:  # another SLO's search ran it already
                b.feed(m, done[(s, m)]["by_slo"][k])
                m = b.next_m()
            if m is not None:
                want.add((s, m))
        if at is not None:
            want.update((s, at) for s in seeds if (s, at) not in done)
        if not want:
            break
        todo = sorted(want)
        results = yield [_with_multiplier(base, m, s) for s, m in todo]
        done.update(zip(todo, results))
    by_slo = []
    for k, slo in enumerate(slos):
        per_seed = {s: brackets[(k, s)].answer() for s in seeds}
        by_slo.append({"slo": slo.to_dict(), "per_seed": per_seed, **spread(per_seed, seeds)})
    out = {"by_slo": by_slo, "curve": {s: [_curve_point(m, r) for (s2, m), r in sorted(done.items()) if s2 == s]
                                       for s in seeds}}
    if at is not None:
        out["at"] = {s: done[(s, at)] for s in seeds}
    return out


def goodput_many(runs: Dict[str, dict], slo: SLO, seeds: Sequence[int] = (0,), *, start: float = 1.0,
                 max_doublings: int = 8, bisect_steps: int = 4, ray: bool = False, address: Optional[str] = None,
                 progress: bool = True, timing: Optional[dict] = None) -> Dict[str, dict]:
    """:func:`goodput` of several base runs at once (their searches in lockstep); ``timing``: as
    :func:`run_lockstep`'s."""
    if not seeds:
        raise ValueError("seeds: at least one seed is needed")
    if not start > 0:
        raise ValueError(f"start must be > 0, got {start!r}")
    searches = {}
    for name, run in runs.items():
        run = {**run, "slo": slo.to_dict()}
        run.setdefault("label", name)
        searches[name] = _goodput_search(run, list(seeds), start, max_doublings, bisect_steps)
    ans = run_lockstep(searches, ray=ray, address=address, progress=progress, desc="goodput", timing=timing)
    return {name: {**a["by_slo"][0], "curve": a["curve"]} for name, a in ans.items()}


def goodput(run: dict, slo: SLO, seeds: Sequence[int] = (0,), **kw) -> dict:
    """The largest rate multiplier at which ``run`` (a RunSpec dict with an open-loop workload taking
    ``multiplier``) meets ``slo``, per seed and its spread (module docstring)."""
    return goodput_many({run.get("label", "run"): run}, slo, seeds, **kw)[run.get("label", "run")]


def attainment(run: dict, slo: SLO, seeds: Sequence[int] = (0,), *, multiplier: float = 1.0, ray: bool = False,
               address: Optional[str] = None, progress: bool = True) -> dict:
    """SLO attainment (share of sent requests within the SLO) at a fixed multiplier, per seed."""
    from .sweep import ray_session, run_many

    rs = [_with_multiplier({**run, "slo": slo.to_dict()}, multiplier, s) for s in seeds]
    with ray_session(ray, address):
        res = run_many(rs, ray=ray, address=address, progress=progress, fn=slo_run)
    att = [m["attainment"] for m in res]
    return {"multiplier": multiplier, "per_seed": {s: m for s, m in zip(seeds, res)},
            "attainment_min": min(att), "attainment_mean": sum(att) / len(att), "attainment_max": max(att)}


# ------------------------------------------------------------------------------------------------ CLI
def parse_slos(parser, spec: str, flag: str = "--ttft-slo") -> List[float]:
    """``--ttft-slo``: one or more comma-separated seconds, each a finite number > 0 (an argparse error
    naming ``flag`` and the bad value otherwise; a repeated value is one too)."""
    out: List[float] = []
    for part in str(spec).split(","):
        try:
            v = float(part)
        except ValueError:
            parser.error(f"{flag}: {part.strip()!r} is not a number of seconds")
        if not (math.isfinite(v) and v > 0):
            parser.error(f"{flag} must be a finite number > 0, got {part.strip()}")
        if v in out:
            parser.error(f"{flag}: {part.strip()} is listed twice")
        out.append(v)
    return out


def add_goodput_parser(subparsers):
    """``python -m ray_geolb goodput``: SLO goodput and attainment of systems on a fixed deployment."""

    from .sweep import add_runner_args
    from .workloads.geo_diurnal import BUILTIN_DEMANDS, DEFAULT_DAY_S

    sp = subparsers.add_parser(
        "goodput", help="SLO goodput: the largest rate multiplier each system serves within the SLO",
        description=("SLO goodput of each system on a fixed deployment and a day of regional demand: the largest "
                     "rate multiplier with P99 TTFT (and TPOT) within the SLO, per seed, at each SLO given; "
                     "P99 TTFT and attainment against the multiplier (the curves the searches trace); the first "
                     "system against each other one (win / tie / loss beyond the seed spread and the search's "
                     "resolution); SLO attainment at a fixed multiplier (ray_geolb/sim/goodput.py)."))
    sp.add_argument("--demand", default="geo-diurnal-3",
                    help=f"built-in demand ({', '.join(BUILTIN_DEMANDS)}) or a CSV hour,region,rate")
    sp.add_argument("--mean-rps", type=float, default=None, help="built-in demand: total mean req/s over the day")
    sp.add_argument("--regions", default="us=2,eu=2,asia=2", help="replicas per region (default us=2,eu=2,asia=2)")
    sp.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help="comma-separated systems; the first is judged against each other one")
    sp.add_argument("--profile", default=DEFAULT_PROFILE, help=f"engine profile (default {DEFAULT_PROFILE})")
    sp.add_argument("--ttft-slo", default="1",
                    help="P99 TTFT SLO in seconds, or several comma-separated (an SLO sweep sharing its runs), "
                         "e.g. 0.3,0.5,1,2 (default 1)")
    sp.add_argument("--tpot-slo", type=float, default=None,
                    help="optional P99 TPOT SLO in seconds per output token after the first, with every TTFT SLO")
    sp.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    sp.add_argument("--held-out-seeds", default="",
                    help="more seeds, searched alike and reported apart: the verdicts on them are separate")
    sp.add_argument("--day-s", type=float, default=DEFAULT_DAY_S, help="simulated seconds for the 24 h day")
    sp.add_argument("--start", type=float, default=1.0, help="the search's first multiplier (default 1)")
    sp.add_argument("--bisect-steps", type=int, default=BISECT_STEPS,
                    help=f"bisections after bracketing (default {BISECT_STEPS}: a bracket of x2 narrowed to about "
                         "1.1 %%)")
    sp.add_argument("--at", type=float, default=1.0, help="SLO attainment at this multiplier (default 1)")
    sp.add_argument("--attribute", action="store_true",
                    help="also split the requests lost at --at by where their TTFT went (sim/attribution.py)")
    sp.add_argument("--out", default=None, help="output directory (goodput.json, goodput.txt, goodput.png)")
    add_runner_args(sp)
    sp.set_defaults(func=run_goodput, _goodput_parser=sp)
    return sp


def _goodput_inputs(args, parser) -> Dict[str, Any]:
    """The command line's inputs, checked: an argparse error naming the flag for each bad one."""
    from ray_geolb.engine.network import RegionNetwork
    from ray_geolb.engine.profiles import PROFILES

    from .deploy import SYSTEMS, parse_regions
    from .sweep import parse_seeds
    from .workloads.geo_diurnal import load_demand

    ttfts = parse_slos(parser, args.ttft_slo)
    for flag, v in (("--day-s", args.day_s), ("--start", args.start), ("--at", args.at),
                    ("--tpot-slo", args.tpot_slo), ("--mean-rps", args.mean_rps)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            parser.error(f"{flag} must be a finite number > 0, got {v}")
    if args.bisect_steps < 0:
        parser.error(f"--bisect-steps must be >= 0, got {args.bisect_steps}")
    if args.profile not in PROFILES:
        parser.error(f"--profile: unknown engine profile {args.profile!r}; known: {', '.join(sorted(PROFILES))}")
    try:
        demand = load_demand(args.demand, args.mean_rps)
    except ValueError as e:
        parser.error(f"--demand: {e}")
    try:
        replicas = parse_regions(args.regions)
    except ValueError as e:
        parser.error(f"--regions: {e}")
    net = RegionNetwork.default().regions
    bad = [r for r in list(replicas) + demand.regions if r not in net]
    if bad:
        parser.error(f"--regions/--demand: unknown region(s) {sorted(set(bad))}; the network has {net}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if not systems or unknown:
        parser.error(f"--systems: unknown system(s) {unknown}; known: {', '.join(sorted(SYSTEMS))}")
    seeds = parse_seeds(parser, args.seeds)
    try:
        held = [int(s) for s in args.held_out_seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--held-out-seeds: expected comma-separated integers, got {args.held_out_seeds!r}")
    if set(held) & set(seeds):
        parser.error(f"--held-out-seeds: {sorted(set(held) & set(seeds))} also in --seeds")
    return {"slos": [SLO(t, args.tpot_slo) for t in ttfts], "demand": demand, "replicas": replicas,
            "systems": systems, "seeds": seeds, "held_out": held, "max_doublings": MAX_DOUBLINGS}


def run_goodput(args) -> int:
    import argparse
    import os
    import sys

    from .goodput_report import format_goodput, format_timing, goodput_result, plot_goodput, timing_summary
    from .metrics import dumps

    parser = getattr(args, "_goodput_parser", None) or argparse.ArgumentParser(prog="goodput")
    inp = _goodput_inputs(args, parser)
    slos, demand = inp["slos"], inp["demand"]
    tail = max(tail_s(slo) for slo in slos)  # one cut-off for every SLO: each run is judged at all of them
    searches: Dict[str, Search] = {}
    for s in inp["systems"]:
        run = {"label": s, "group": "goodput", "scenario": "goodput", "system": s, "replicas": inp["replicas"],
               "workload": {"name": "geo-diurnal", "kw": {**demand.workload_kw(), "day_s": args.day_s}},
               "sim": {"duration_s": args.day_s + tail, "seed": 0}, "deploy": {"profile": args.profile}}
        searches[s] = _goodput_search(run, inp["seeds"] + inp["held_out"], args.start, MAX_DOUBLINGS,
                                      args.bisect_steps, slos, at=args.at)
    timing: Dict[str, Any] = {}
    ans = run_lockstep(searches, ray=args.ray, address=args.address, progress=args.progress, desc="goodput",
                       timing=timing)
    out = goodput_result(ans, inp, args)
    text = format_goodput(out, attribute=getattr(args, "attribute", False))
    print(text)
    out["timing"] = timing_summary(timing, {s: {"search": [s]} for s in inp["systems"]})
    print(format_timing(out["timing"], f"goodput ({len(inp['systems'])} systems, {len(slos)} SLOs, demand "
                                       f"{demand.source})"), file=sys.stderr)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "goodput.json"), "w") as f:
            f.write(dumps(out))
        with open(os.path.join(args.out, "goodput.txt"), "w") as f:
            f.write(text + "\n")
        try:
            png = plot_goodput(out, os.path.join(args.out, "goodput.png"))
            print(f"wrote {os.path.join(args.out, 'goodput.json')}, {png}", file=sys.stderr)
        except ImportError as e:
            print(f"wrote {os.path.join(args.out, 'goodput.json')}; no plot ({e})", file=sys.stderr)
    return 0
