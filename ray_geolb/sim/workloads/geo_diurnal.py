"""Open-loop, multi-region, diurnal demand: each region's arrival rate follows a day curve, compressed.

Demand (:class:`Demand`): ``{region: 24 hourly rates}``, hour = the UTC hour of the day, rate = requests
per second of REAL time during that hour, plus what its arrivals and requests are made of
(:attr:`Demand.workload`, :meth:`Demand.workload_kw`: the keyword arguments of :func:`geo_diurnal`). The
built-in demands (:data:`BUILTIN_DEMANDS`; regions us / eu / asia; total mean ``mean_rps`` req/s over the day,
default 48; region weights from WildChat's countries, :data:`WILDCHAT_REGION_WEIGHTS`):

* ``geo-diurnal-3`` (:func:`builtin_demand`): the day shape is the ServeGen fixture's aggregate rate (all 24
  clients summed per 10-minute window, t = 0 = local midnight, averaged per hour, normalised to mean 1),
  shifted by each region's time zone (``servegen.DEFAULT_TZ``: us -5 h, eu +1 h, asia +9 h), so each region
  peaks at its own local hour (peaks of about 20 / 28 / 17 req/s). That aggregate is nearly flat (peak / mean
  1.35, trough 0.72): the regions' days overlap by 0.85-0.88 (:func:`~.demand_data.curve_overlap`) and every
  hour is above half of every region's peak. Gamma arrivals and the default content mix (below).
* ``geo-workday-3`` (:func:`workday_demand`): each region's day is the day of ServeGen's working-day tenants
  (:func:`~.demand_data.workday_day_shape`: the 23 of 162 m-large tenants whose days repeat one routine -- each
  day's hourly shares correlate >= 0.8 with the tenant's 14-day mean day on average -- and put >= 75 % of their
  requests in local 08:00-20:00; 9.8 % of all requests, 7.2 % from the largest; their summed 14-day mean rate
  per local hour: peak / mean 2.41, a lunch dip at 12:00), shifted by the same time zones: each region peaks
  at a different hour (UTC 15 / 9 / 1) and the regions' days barely overlap (us-eu 0.53, us-asia 0.28,
  eu-asia 0.38; the hours at >= half a region's peak, 9 per region, share at most 3 with another region's).
  Same volume, weights, arrivals and content as ``geo-diurnal-3``: peaks of about 35 / 50 / 30 req/s.
* ``azure-bursty-3`` (:func:`azure_bursty_demand`): ``geo-diurnal-3``'s hourly rates, with the arrivals and the
  requests of the Azure LLM inference trace 2023 (:func:`~.demand_data.azure_arrivals`: code and conv merged,
  28,185 requests in 58.6 min, inter-arrival CV 1.33, the request count per minute varying with CV 0.37):
  each region replays the trace's gap sequence from a seeded start, time-rescaled to its hourly rate
  (``arrivals="azure-2023"``), and each request has its trace row's prompt and output tokens (mix
  ``{"azure-2023": 1}``: mean 1,434 / 154 tokens; a unique text, since the trace has no prefix information).
  A day replays only the stretch of the trace its volume needs (at 48 req/s, about 7,000 of the 28,185 rows),
  so a seed's CV, burst sizes and token means are that stretch's: on seeds 0-3 the CV is 1.21-1.33 and the
  prompt / output means 1,273-1,584 / 137-211 tokens (``demand_stats``). The day's volume is the curve's.

A user CSV (:func:`load_demand_csv`), columns ``hour,region,rate`` (header required; ``#`` comments):
``hour`` an integer UTC hour 0..23, ``region`` a region name, ``rate`` requests/s >= 0. A region's
hours not listed take the rate of its previous listed hour (wrapping round midnight: a step
function). A bad row raises :class:`DemandCSVError` naming the line and the field; an unknown demand name
:class:`UnknownDemandError` listing the built-in ones (:func:`load_demand`).

Time compression: the day runs in ``day_s`` simulated seconds (default 144 s: 1 simulated second =
600 real seconds, each hour 6 simulated seconds). Rates are NOT compressed: an hour of 20 req/s is
10 simulated seconds at 20 req/s x ``multiplier``, so replicas see the real per-second load and only
the curve's changes are faster. Every output states ``day_s``, the compression and the multiplier
(:meth:`Demand.compression_note`).

Arrivals (:func:`geo_diurnal`), per region, mapped through the inverse of the region's cumulative rate
(time rescaling), so the rate follows the curve and the burstiness is kept:

* ``arrivals="gamma"`` (default): a renewal process of unit rate in operational time, inter-arrivals Gamma
  with the coefficient of variation ``iat_cv`` (None: the Azure conversation fixture's, :func:`azure_iat_cv`,
  about 1.14: burstier than Poisson);
* ``arrivals="azure-2023"``: the merged Azure trace's gaps in units of its mean gap, in order from a seeded
  start (wrapping), so its bursts (their lengths as well as the gaps' CV) are kept.

Content per arrival, drawn by ``mix`` (default conversation 0.6, shared-context 0.2, code 0.2):

* ``conversation``: the next turn of one of ``users`` per-region WildChat users (each walks its
  conversations turn by turn, with full history: consecutive turns extend each other, servegen's walk);
* ``shared-context``: a question about one of the live long contexts of ``shared_context`` (one pool
  sequence across regions: every region asks about the same documents at about the same time);
* ``code``: an Azure code-trace row's prompt and output lengths; the prompt is one of ``repos`` per-region
  repository texts (75 %) and a unique tail, so edits of the same repository share a prefix;
* ``azure-2023``: a merged Azure trace row's prompt and output tokens (the replayed row with
  ``arrivals="azure-2023"``, else a seeded draw), a unique prompt text.

Everything is deterministic given ``seed``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .conversation import conversation_turn_call, partition_conversations
from .datasets import fixture_path, load_conversations, load_servegen, open_text
from .demand_data import azure_arrivals, workday_day_shape
from .model import Call, OpenLoopSpec, Program, Workload
from .servegen import DEFAULT_TZ, _PromptWalk
from .shared_context import SYSTEM_PROMPT, _context_text, _uniform, context_of
from .text import CHARS_PER_TOKEN, rng_for, words

__all__ = ["Demand", "DemandError", "DemandCSVError", "UnknownDemandError", "builtin_demand", "workday_demand",
           "azure_bursty_demand", "load_demand", "load_demand_csv", "geo_diurnal", "azure_iat_cv",
           "WILDCHAT_REGION_WEIGHTS", "BUILTIN_DEMANDS", "DEFAULT_MIX", "MIX_KINDS", "ARRIVALS", "DEFAULT_DAY_S"]

#: share of WildChat conversations per region by ``metadata.country`` (``COUNTRY_REGION``), counted on the
#: project's shared WildChat sample (``wildchat_sample/wildchat_with_region.jsonl``: 186 conversations with a
#: mapped country: us 57, eu 80, asia 49). The shipped fixture is balanced by construction (20 per region),
#: so it cannot give the weights.
WILDCHAT_REGION_WEIGHTS = {"us": 57 / 186, "eu": 80 / 186, "asia": 49 / 186}
DEFAULT_MIX = {"conversation": 0.6, "shared-context": 0.2, "code": 0.2}
#: every content kind of ``mix`` (module docstring), in the order a draw walks them
MIX_KINDS = (*DEFAULT_MIX, "azure-2023")
#: the arrival processes of :func:`geo_diurnal` (module docstring)
ARRIVALS = ("gamma", "azure-2023")
DEFAULT_DAY_S = 144.0
DEFAULT_MEAN_RPS = 48.0
REAL_DAY_S = 86400.0


class DemandError(ValueError):
    """A bad demand: the message names it (the name, or the file, line and field)."""


class DemandCSVError(DemandError):
    """A bad demand CSV: the message names the file, the line and the field."""


class UnknownDemandError(DemandError):
    """A demand name that is neither a built-in demand nor a CSV file: the message lists the built-in ones."""


@dataclass(frozen=True)
class Demand:
    """Per-region hourly demand: ``rates[region][h]`` = requests/s (real time) in UTC hour ``h``;
    ``workload``: the keyword arguments of :func:`geo_diurnal` beyond the rates that the demand's arrivals and
    requests need (empty: Gamma arrivals and the default mix)."""

    rates: Dict[str, List[float]]
    source: str = ""
    meta: Dict[str, object] = field(default_factory=dict)
    workload: Dict[str, object] = field(default_factory=dict)

    def __post_init__(self):
        if not self.rates:
            raise ValueError("demand: no region")
        for r, xs in self.rates.items():
            if len(xs) != 24:
                raise ValueError(f"demand: region {r!r} has {len(xs)} hourly rates, need 24")
            for h, x in enumerate(xs):
                if not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0):
                    raise ValueError(f"demand: rate of {r!r} at hour {h} must be a finite number >= 0, got {x!r}")
        if sum(sum(xs) for xs in self.rates.values()) <= 0:
            raise ValueError("demand: every rate is 0")
        bad = [k for k in self.workload if k in ("curves", "day_s", "multiplier", "seed")]
        if bad:
            raise ValueError(f"demand: workload may not set {bad} (the run sets them)")

    @property
    def regions(self) -> List[str]:
        return list(self.rates)

    def scaled(self, k: float) -> "Demand":
        return Demand({r: [x * k for x in xs] for r, xs in self.rates.items()}, self.source, dict(self.meta),
                      dict(self.workload))

    def only(self, regions: Sequence[str]) -> "Demand":
        return Demand({r: list(self.rates[r]) for r in regions}, self.source, dict(self.meta), dict(self.workload))

    def peak(self, region: Optional[str] = None) -> float:
        """A region's peak hourly rate, or (None) the peak of the regions' sum."""
        if region is not None:
            return max(self.rates[region])
        return max(sum(xs[h] for xs in self.rates.values()) for h in range(24))

    def total(self) -> List[float]:
        return [sum(xs[h] for xs in self.rates.values()) for h in range(24)]

    def to_kw(self) -> Dict[str, List[float]]:
        """JSON-able ``curves`` for :func:`geo_diurnal` (a run dict's workload kw)."""
        return {r: [float(x) for x in xs] for r, xs in self.rates.items()}

    def workload_kw(self) -> Dict[str, object]:
        """JSON-able keyword arguments of :func:`geo_diurnal` for this demand: ``curves`` and what its arrivals
        and requests are made of (a run adds ``day_s``, ``multiplier``, ``seed``)."""
        import copy

        return {"curves": self.to_kw(), **copy.deepcopy(self.workload)}

    @staticmethod
    def compression_note(day_s: float, multiplier: float = 1.0) -> str:
        return (f"time compressed: 24 h in {day_s:g} simulated s (x{REAL_DAY_S / day_s:g}: one hour = "
                f"{day_s / 24:g} s), rates real req/s x {multiplier:g}")


@lru_cache(maxsize=1)
def servegen_day_shape() -> tuple:
    """24 hourly factors (mean 1) of the ServeGen fixture's aggregate rate, hour 0 = local midnight."""
    data = load_servegen()
    tot = np.zeros(144)
    for ws in data.values():
        for w in ws:
            tot[int(w.window_start_s // 600) % 144] += w.rate_rps
    hourly = tot.reshape(24, 6).mean(axis=1)
    return tuple(float(x) for x in hourly / hourly.mean())


def _tz_shifted(name: str, shape: Sequence[float], shape_note: str, mean_rps: float,
                tz: Optional[Dict[str, float]], weights: Optional[Dict[str, float]]) -> Demand:
    """Regions ``tz`` (UTC offsets, h) sharing one local day ``shape`` (24 factors, mean 1), weighted by
    ``weights``, total mean ``mean_rps`` req/s."""
    if not (isinstance(mean_rps, (int, float)) and mean_rps > 0 and math.isfinite(mean_rps)):
        raise ValueError(f"mean_rps must be a finite number > 0, got {mean_rps!r}")
    tz = dict(DEFAULT_TZ if tz is None else tz)
    w = dict(WILDCHAT_REGION_WEIGHTS if weights is None else weights)
    total_w = sum(w[r] for r in tz)
    rates = {}
    for r, off in tz.items():
        rates[r] = [mean_rps * w[r] / total_w * shape[int(round(h + off)) % 24] for h in range(24)]
    return Demand(rates, name, {"mean_rps": mean_rps, "tz_offsets_h": tz, "weights": w, "shape": shape_note})


def builtin_demand(mean_rps: float = DEFAULT_MEAN_RPS, tz: Optional[Dict[str, float]] = None,
                   weights: Optional[Dict[str, float]] = None) -> Demand:
    """The ``geo-diurnal-3`` demand (module docstring): total mean ``mean_rps`` req/s over the day."""
    return _tz_shifted("geo-diurnal-3", servegen_day_shape(), "ServeGen m-large fixture, 24 clients summed",
                       mean_rps, tz, weights)


def workday_demand(mean_rps: float = DEFAULT_MEAN_RPS, tz: Optional[Dict[str, float]] = None,
                   weights: Optional[Dict[str, float]] = None) -> Demand:
    """The ``geo-workday-3`` demand (module docstring): ServeGen's working-day tenants' day in each region's
    time zone, so the regions' peaks barely overlap; total mean ``mean_rps`` req/s."""
    return _tz_shifted("geo-workday-3", workday_day_shape(),
                       "ServeGen m-large working-day tenants (servegen_m-large_workday_tenants_hourly.csv), "
                       "14-day mean", mean_rps, tz, weights)


def azure_bursty_demand(mean_rps: float = DEFAULT_MEAN_RPS, tz: Optional[Dict[str, float]] = None,
                        weights: Optional[Dict[str, float]] = None) -> Demand:
    """The ``azure-bursty-3`` demand (module docstring): ``geo-diurnal-3``'s rates with the merged Azure 2023
    trace's arrivals replayed and its prompt / output tokens."""
    base = builtin_demand(mean_rps, tz, weights)
    trace = azure_arrivals()
    meta = {**base.meta, "arrivals": "Azure LLM inference trace 2023, code + conv merged (azure_2023_arrivals.csv.gz)"
            f": gaps replayed, IAT CV {trace.iat_cv:.2f}", "content": "the trace rows' prompt / output tokens"}
    return Demand(base.rates, "azure-bursty-3", meta, {"arrivals": "azure-2023", "mix": {"azure-2023": 1.0}})


BUILTIN_DEMANDS = {"geo-diurnal-3": builtin_demand, "geo-workday-3": workday_demand,
                   "azure-bursty-3": azure_bursty_demand}

CSV_COLUMNS = ["hour", "region", "rate"]


def load_demand_csv(path: str | Path, regions: Optional[Sequence[str]] = None) -> Demand:
    """A user's demand CSV (module docstring); ``regions``: the allowed region names (None: any)."""
    p = Path(path)
    if not p.is_file():
        raise DemandCSVError(f"demand CSV {str(p)!r}: file not found")
    given: Dict[str, Dict[int, float]] = {}
    with open(p, newline="") as f:
        rows = [(i, row) for i, row in enumerate(csv.reader(f), 1)
                if row and any(c.strip() for c in row) and not row[0].lstrip().startswith("#")]
    if not rows:
        raise DemandCSVError(f"{p}: empty; expected a header {','.join(CSV_COLUMNS)} and rows")
    lineno, header = rows[0]
    header = [c.strip().lower() for c in header]
    if header != CSV_COLUMNS:
        raise DemandCSVError(f"{p}:{lineno}: header must be {','.join(CSV_COLUMNS)}, got {','.join(header)}")
    for lineno, row in rows[1:]:
        if len(row) != 3:
            raise DemandCSVError(f"{p}:{lineno}: expected 3 fields hour,region,rate, got {len(row)}: {row!r}")
        h_s, region, rate_s = (c.strip() for c in row)
        try:
            h = int(h_s)
        except ValueError:
            raise DemandCSVError(f"{p}:{lineno}: field 'hour': {h_s!r} is not an integer 0..23") from None
        if not 0 <= h <= 23:
            raise DemandCSVError(f"{p}:{lineno}: field 'hour': {h} is not in 0..23")
        if not region:
            raise DemandCSVError(f"{p}:{lineno}: field 'region' is empty")
        if regions is not None and region not in regions:
            raise DemandCSVError(f"{p}:{lineno}: field 'region': unknown region {region!r}; known: "
                                 f"{', '.join(regions)}")
        try:
            rate = float(rate_s)
        except ValueError:
            raise DemandCSVError(f"{p}:{lineno}: field 'rate': {rate_s!r} is not a number") from None
        if not (math.isfinite(rate) and rate >= 0):
            raise DemandCSVError(f"{p}:{lineno}: field 'rate': must be a finite number >= 0, got {rate_s!r}")
        hours = given.setdefault(region, {})
        if h in hours:
            raise DemandCSVError(f"{p}:{lineno}: field 'hour': hour {h} of region {region!r} given twice")
        hours[h] = rate
    if not given:
        raise DemandCSVError(f"{p}: no data rows after the header")
    rates = {}
    for region, hours in given.items():
        cur = hours[max(hours)]  # before the first listed hour: the last one's rate (wrapping)
        xs = []
        for h in range(24):
            cur = hours.get(h, cur)
            xs.append(cur)
        rates[region] = xs
    if sum(sum(xs) for xs in rates.values()) <= 0:
        raise DemandCSVError(f"{p}: field 'rate': every rate is 0")
    return Demand(rates, f"csv:{p.name}", {"path": str(p)})


@lru_cache(maxsize=1)
def azure_iat_cv() -> float:
    """Coefficient of variation of the Azure conversation trace's inter-arrival times (the fixture)."""
    from .trace import _parse_ts

    with open_text(fixture_path("azure_conv")) as f:
        rows = list(csv.reader(f))[1:]
    ts = np.array(sorted(_parse_ts(r[0]) for r in rows if r))
    d = np.diff(ts)
    d = d[d > 0]
    return float(d.std() / d.mean())


@lru_cache(maxsize=1)
def _azure_code_rows() -> tuple:
    with open_text(fixture_path("azure_code")) as f:
        rows = list(csv.reader(f))[1:]
    return tuple((int(r[1]), int(r[2])) for r in rows if len(r) == 3)


def _cumulative(rates: Sequence[float], bin_s: float, multiplier: float) -> Tuple[np.ndarray, np.ndarray, float]:
    """The piecewise-constant rates x ``multiplier`` and their cumulative count at each bin edge."""
    lam = np.asarray(rates, dtype=float) * multiplier
    cum = np.concatenate([[0.0], np.cumsum(lam * bin_s)])
    return lam, cum, float(cum[-1])


def _ops_to_times(ops: np.ndarray, lam: np.ndarray, cum: np.ndarray, bin_s: float) -> np.ndarray:
    """Operational times (expected arrivals so far) -> times, through the inverse cumulative rate."""
    i = np.searchsorted(cum, ops, side="right") - 1
    i = np.clip(i, 0, len(lam) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        times = i * bin_s + np.where(lam[i] > 0, (ops - cum[i]) / lam[i], 0.0)
    return np.minimum(times, 24 * bin_s - 1e-9)


def _arrival_times(rates: Sequence[float], bin_s: float, multiplier: float, cv: float,
                   rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, 24 * bin_s): a unit-rate Gamma renewal process (CV ``cv``; 1 = Poisson)
    mapped through the inverse cumulative rate of the piecewise-constant ``rates`` x ``multiplier``."""
    lam, cum, total = _cumulative(rates, bin_s, multiplier)
    if total <= 0:
        return np.empty(0)
    k = 1.0 / (cv * cv) if cv > 0 else 1.0
    s, t = [], 0.0
    while t < total:
        n = int((total - t) * 1.2) + 32
        xs = t + np.cumsum(rng.gamma(k, 1.0 / k, size=n))
        s.append(xs)
        t = float(xs[-1])
    ops = np.concatenate(s)
    return _ops_to_times(ops[ops < total], lam, cum, bin_s)


def _replay_times(rates: Sequence[float], bin_s: float, multiplier: float, unit_gaps: np.ndarray,
                  rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """Arrival times and trace rows: the ``m`` = round(expected count) trace rows from a seeded one on
    (wrapping at the end), at their gaps (``unit_gaps``, mean 1) stretched so that row ``m + 1`` would land at
    the day's end (the first a uniform share of its gap in): the day's volume is the curve's whatever stretch
    of the trace it replays, and the trace's bursts inside it are kept; mapped like :func:`_arrival_times`."""
    lam, cum, total = _cumulative(rates, bin_s, multiplier)
    m = int(round(total))
    if m <= 0:
        return np.empty(0), np.empty(0, dtype=int)
    n = len(unit_gaps)
    start = int(rng.integers(0, n))
    rows = (start + np.arange(m + 1)) % n
    ops = np.cumsum(unit_gaps[rows])
    ops -= float(rng.random()) * float(unit_gaps[start])
    ops *= total / ops[-1]
    return _ops_to_times(ops[:m], lam, cum, bin_s), rows[:m]


class _Content:
    """Each arrival's request by its kind (module docstring), with the state that spans arrivals: each user's
    conversation walk and the live shared contexts."""

    def __init__(self, regions: Sequence[str], seed: int, users: int, repos: int, live: int, reuse: int,
                 context_tokens: Sequence[int], h0: int):
        self.regions, self.seed, self.users, self.repos = list(regions), seed, users, repos
        self.live, self.reuse, self.context_tokens, self.h0 = live, reuse, tuple(context_tokens), h0
        self._pools = None
        self.walks: Dict[tuple, _PromptWalk] = {}
        self.ctx_texts: Dict[int, str] = {}
        self.n_ctx = 0

    def call(self, kind: str, ri: int, k: int, rng: np.random.Generator, row: Optional[int]) -> Call:
        """The request of region ``ri``'s ``k``-th arrival; ``row``: its replayed trace row (None: drawn)."""
        r = self.regions[ri]
        if kind == "conversation":
            return self._conversation(r, ri, rng)
        if kind == "shared-context":
            return self._shared_context(r, k)
        if kind == "code":
            return self._code(r, k, rng)
        return self._azure(r, k, rng, row)

    def _conversation(self, r: str, ri: int, rng: np.random.Generator) -> Call:
        if self._pools is None:
            self._pools = partition_conversations(load_conversations("wildchat"), {x: 1 for x in self.regions},
                                                  "wildchat", self.seed)
        u = int(rng.integers(0, self.users))
        walk = self.walks.get((r, u))
        if walk is None:
            walk = self.walks[(r, u)] = _PromptWalk(self._pools[r], 1000 * ri + u, self.seed)
        conv, turn, cycle = walk.next()
        return conversation_turn_call(conv, turn, salt=f"[{r} user {u}#{cycle}] ",
                                      session_key=f"{conv.session_key}#{r}.{u}.{cycle}", tenant=f"chat-{r}")

    def _shared_context(self, r: str, k: int) -> Call:
        seed = self.seed
        d = context_of(self.n_ctx, self.live, self.reuse, seed)
        self.n_ctx += 1
        if d not in self.ctx_texts:
            if len(self.ctx_texts) > 4 * self.live:
                self.ctx_texts.clear()
            self.ctx_texts[d] = _context_text(d, self.context_tokens, seed)
        q = _uniform(64, 256, seed, "q-len", r, k)
        question = f"\n\nQuestion ({r} {k}): " + words(q * CHARS_PER_TOKEN, rng_for(seed, "q", r, k))
        return Call(prompt=SYSTEM_PROMPT + self.ctx_texts[d] + question,
                    output_tokens=_uniform(32, 256, seed, "out", r, k), session_key=f"ctx-{d}", tenant="rag")

    def _code(self, r: str, k: int, rng: np.random.Generator) -> Call:
        code_rows = _azure_code_rows()
        ctx, gen = code_rows[int(rng.integers(0, len(code_rows)))]
        repo = int(rng.integers(0, self.repos))
        n_chars = max(8, ctx) * CHARS_PER_TOKEN
        head = f"# repository {r}/{repo}\n"
        shared = int(n_chars * 0.75)
        body = (head + words(shared, rng_for(self.seed, "repo", r, repo)))[:shared]
        tail = f"\n# edit {r} {k}: " + words(max(0, n_chars - shared), rng_for(self.seed, "edit", r, k))
        return Call(prompt=body + tail, output_tokens=max(1, min(gen, 1024)), session_key=f"repo-{r}-{repo}",
                    tenant="code")

    def _azure(self, r: str, k: int, rng: np.random.Generator, row: Optional[int]) -> Call:
        trace = azure_arrivals()
        i = int(rng.integers(0, len(trace.service))) if row is None else int(row)
        service = trace.service[i]
        head = f"[{service} {r} {self.h0}.{k}] "
        n_chars = int(trace.context_tokens[i]) * CHARS_PER_TOKEN
        text = head + words(max(0, n_chars - len(head)), rng_for(self.seed, "azure-text", r, self.h0, k))
        return Call(prompt=text[:max(n_chars, 1)], output_tokens=int(trace.generated_tokens[i]),
                    session_key=f"azure-{r}-{self.h0}.{k}", tenant=f"azure-{service}")


def _checked(curves, day_s, multiplier, mix, users, repos, hours, keep_regions, mean_rps, arrivals, iat_cv):
    """:func:`geo_diurnal`'s arguments checked (ValueError naming the bad one): (demand, mix, (h0, h1))."""
    demand = builtin_demand(mean_rps) if curves is None else Demand({r: list(x) for r, x in curves.items()})
    if not (day_s > 0 and math.isfinite(day_s)):
        raise ValueError(f"day_s must be a finite number > 0, got {day_s!r}")
    if not (multiplier >= 0 and math.isfinite(multiplier)):
        raise ValueError(f"multiplier must be a finite number >= 0, got {multiplier!r}")
    mix = dict(DEFAULT_MIX if mix is None else mix)
    bad = [k for k in mix if k not in MIX_KINDS]
    if bad or not mix or any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix must map some of {list(MIX_KINDS)} to weights >= 0 (sum > 0), got {mix}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {list(ARRIVALS)}, got {arrivals!r}")
    if arrivals != "gamma" and iat_cv is not None:
        raise ValueError(f"iat_cv applies to gamma arrivals only, not to arrivals={arrivals!r}")
    if users < 1 or repos < 1:
        raise ValueError(f"users and repos must be >= 1, got {users}, {repos}")
    h0, h1 = (0, 24) if hours is None else (int(hours[0]), int(hours[1]))
    if not 0 <= h0 < h1 <= 24:
        raise ValueError(f"hours must be [start, end) with 0 <= start < end <= 24, got {hours!r}")
    if keep_regions is not None:
        unknown = [r for r in keep_regions if r not in demand.rates]
        if unknown or not keep_regions:
            raise ValueError(f"keep_regions must name some of {demand.regions}, got {keep_regions!r}")
    return demand, mix, (h0, h1)


def _events(demand: Demand, h0: int, h1: int, bin_s: float, multiplier: float, seed: int, arrivals: str,
            cv: float) -> Tuple[list, Dict[int, np.ndarray]]:
    """Every region's arrivals as time-sorted ``(t, region index, k-th arrival of the region)``, and per region
    the trace row of each arrival (replayed arrivals only)."""
    events, rows = [], {}
    for ri, r in enumerate(demand.regions):
        rates = demand.rates[r][h0:h1]
        if arrivals == "gamma":
            ts = _arrival_times(rates, bin_s, multiplier, cv, rng_for(seed, "geo-diurnal", r, h0, h1))
        else:
            ts, rows[ri] = _replay_times(rates, bin_s, multiplier, azure_arrivals().unit_gaps(),
                                         rng_for(seed, "geo-diurnal-replay", arrivals, r, h0, h1))
        events.extend((float(t), ri, k) for k, t in enumerate(ts))
    events.sort()
    return events, rows


def geo_diurnal(curves: Optional[Dict[str, List[float]]] = None, *, day_s: float = DEFAULT_DAY_S,
                multiplier: float = 1.0, seed: int = 0, mix: Optional[Dict[str, float]] = None,
                iat_cv: Optional[float] = None, users: int = 16, repos: int = 16, live: int = 32,
                reuse: int = 6, context_tokens: Sequence[int] = (2000, 6000), hours: Optional[Sequence[int]] = None,
                mean_rps: float = DEFAULT_MEAN_RPS, keep_regions: Optional[Sequence[str]] = None,
                arrivals: str = "gamma") -> Workload:
    """The open-loop day (module docstring). ``curves``: ``{region: 24 hourly real req/s}`` (None: the
    built-in ``geo-diurnal-3`` at ``mean_rps``; a demand's :meth:`Demand.workload_kw` gives ``curves`` and the
    rest); ``hours``: simulate only these UTC hours [start, end) (each still ``day_s / 24`` s long, t = 0 at
    ``start``); ``arrivals``: ``gamma`` (CV ``iat_cv``, None = the Azure trace's) or ``azure-2023`` (the
    merged Azure trace replayed); ``keep_regions``: keep only these regions' requests, exactly as they are in
    the whole day (the same times and texts: the shared contexts' sequence runs over every region, so dropping
    a region from ``curves`` instead would change the others' content)."""
    demand, mix, (h0, h1) = _checked(curves, day_s, multiplier, mix, users, repos, hours, keep_regions, mean_rps,
                                     arrivals, iat_cv)
    if arrivals == "gamma":
        cv = azure_iat_cv() if iat_cv is None else float(iat_cv)
    else:
        cv = azure_arrivals().iat_cv
    kinds = [k for k in MIX_KINDS if mix.get(k, 0) > 0]
    cum_mix = np.cumsum([mix[k] for k in kinds]) / sum(mix[k] for k in kinds)
    regions = demand.regions
    events, rows = _events(demand, h0, h1, day_s / 24.0, multiplier, seed, arrivals, cv)
    content = _Content(regions, seed, users, repos, live, reuse, context_tokens, h0)
    arrivals_out = []
    counts = {k: 0 for k in kinds}
    for t, ri, k in events:
        r = regions[ri]
        rng = rng_for(seed, "geo-diurnal-pick", r, h0, k)
        kind = kinds[int(np.searchsorted(cum_mix, rng.random(), side="right").clip(0, len(kinds) - 1))]
        counts[kind] += 1
        call = content.call(kind, ri, k, rng, rows[ri][k] if ri in rows else None)
        if keep_regions is None or r in keep_regions:
            arrivals_out.append((t, Program(f"geo-diurnal:{r}:{k}", r, [call])))
    note = Demand.compression_note(day_s, multiplier)
    how = (f"IAT CV {cv:.2f}" if arrivals == "gamma" else
           f"arrivals: the {arrivals} trace's gaps replayed (IAT CV {cv:.2f})")
    meta = {"day_s": day_s, "compression": REAL_DAY_S / day_s, "multiplier": multiplier, "hours": [h0, h1],
            "iat_cv": cv, "mix": mix, "counts": counts, "seed": seed, "compression_note": note,
            "keep_regions": None if keep_regions is None else list(keep_regions), "rates": demand.to_kw()}
    if arrivals != "gamma":
        meta["arrivals"] = arrivals
    return Workload(
        name="geo-diurnal",
        description=(f"open-loop diurnal demand ({demand.source or 'curves'}), regions "
                     f"{regions if keep_regions is None else list(keep_regions)}, UTC hours "
                     f"{h0}-{h1}, {len(arrivals_out)} requests, mix {mix}, {how}; {note}"),
        open=OpenLoopSpec(arrivals_out), meta=meta)


def load_demand(spec: str, mean_rps: Optional[float] = None) -> Demand:
    """A built-in demand name or a CSV path: what ``plan`` and ``goodput`` read from ``--demand``. A bad one
    raises a :class:`DemandError` naming it: :class:`UnknownDemandError` (listing the built-in demands) or
    :class:`DemandCSVError` (the file, line and field: an unknown region names the network's regions)."""
    import os

    from ray_geolb.engine.network import RegionNetwork

    if spec in BUILTIN_DEMANDS:
        return BUILTIN_DEMANDS[spec](mean_rps) if mean_rps is not None else BUILTIN_DEMANDS[spec]()
    if mean_rps is not None:
        raise DemandError(f"--mean-rps applies to a built-in demand only ({', '.join(BUILTIN_DEMANDS)}), not to "
                          f"{spec!r} (scale a CSV with --rate-scale)")
    if not spec.lower().endswith(".csv") and not os.path.exists(spec):
        raise UnknownDemandError(f"unknown demand {spec!r}: not a built-in demand ({', '.join(BUILTIN_DEMANDS)}) "
                                 "nor a CSV file hour,region,rate")
    return load_demand_csv(spec, RegionNetwork.default().regions)
