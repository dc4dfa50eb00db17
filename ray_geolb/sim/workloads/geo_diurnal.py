"""Open-loop, multi-region, diurnal demand: each region's arrival rate follows a day curve, compressed.

Demand (:class:`Demand`): ``{region: 24 hourly rates}``, hour = the UTC hour of the day, rate = requests
per second of REAL time during that hour. Two sources:

* the built-in ``geo-diurnal-3`` scenario (:func:`builtin_demand`): regions us / eu / asia;
  the day shape is the ServeGen fixture's aggregate rate (all 24 clients summed per 10-minute
  window, t = 0 = local midnight, averaged per hour, normalised to mean 1), shifted by each region's
  time zone (``servegen.DEFAULT_TZ``: us -5 h, eu +1 h, asia +9 h), so each region peaks at its own
  local hour; region weights from WildChat's countries (:data:`WILDCHAT_REGION_WEIGHTS`); the total
  mean rate is ``mean_rps`` (default 48 req/s: peaks of about 20 / 28 / 17 req/s in us / eu / asia,
  about one to two H100 replicas of Llama-3.1-8B each);
* a user CSV (:func:`load_demand_csv`), columns ``hour,region,rate`` (header required; ``#`` comments):
  ``hour`` an integer UTC hour 0..23, ``region`` a region name, ``rate`` requests/s >= 0. A region's
  hours not listed take the rate of its previous listed hour (wrapping round midnight: a step
  function). A bad row raises :class:`DemandCSVError` naming the line and the field.

Time compression: the day runs in ``day_s`` simulated seconds (default 144 s: 1 simulated second =
600 real seconds, each hour 6 simulated seconds). Rates are NOT compressed: an hour of 20 req/s is
10 simulated seconds at 20 req/s x ``multiplier``, so replicas see the real per-second load and only
the curve's changes are faster. Every output states ``day_s``, the compression and the multiplier
(:meth:`Demand.compression_note`).

Arrivals (:func:`geo_diurnal`): per region, a renewal process of unit rate in operational time
(inter-arrivals Gamma with the coefficient of variation of the Azure conversation trace's
inter-arrivals, :func:`azure_iat_cv`, about 1.14: burstier than Poisson) mapped through the inverse
of the region's cumulative rate (time rescaling), so the rate follows the curve and the burstiness is
kept. Content per arrival, drawn by ``mix`` (default conversation 0.6, shared-context 0.2, code 0.2):

* ``conversation``: the next turn of one of ``users`` per-region WildChat users (each walks its
  conversations turn by turn, with full history: consecutive turns extend each other, servegen's walk);
* ``shared-context``: a question about one of the live long contexts of ``shared_context`` (one pool
  sequence across regions: every region asks about the same documents at about the same time);
* ``code``: an Azure code-trace row's prompt and output lengths; the prompt is one of ``repos`` per-region
  repository texts (75 %) and a unique tail, so edits of the same repository share a prefix.

Everything is deterministic given ``seed``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from .conversation import conversation_turn_call, partition_conversations
from .datasets import fixture_path, load_conversations, load_servegen, open_text
from .model import Call, OpenLoopSpec, Program, Workload
from .servegen import DEFAULT_TZ, _PromptWalk
from .shared_context import SYSTEM_PROMPT, _context_text, _uniform, context_of
from .text import CHARS_PER_TOKEN, rng_for, words

__all__ = ["Demand", "DemandCSVError", "builtin_demand", "load_demand", "load_demand_csv", "geo_diurnal",
           "azure_iat_cv", "WILDCHAT_REGION_WEIGHTS", "BUILTIN_DEMANDS", "DEFAULT_MIX", "DEFAULT_DAY_S"]

#: share of WildChat conversations per region by ``metadata.country`` (``COUNTRY_REGION``), counted on the
#: project's shared WildChat sample (``wildchat_sample/wildchat_with_region.jsonl``: 186 conversations with a
#: mapped country: us 57, eu 80, asia 49). The shipped fixture is balanced by construction (20 per region),
#: so it cannot give the weights.
WILDCHAT_REGION_WEIGHTS = {"us": 57 / 186, "eu": 80 / 186, "asia": 49 / 186}
DEFAULT_MIX = {"conversation": 0.6, "shared-context": 0.2, "code": 0.2}
DEFAULT_DAY_S = 144.0
DEFAULT_MEAN_RPS = 48.0
REAL_DAY_S = 86400.0


class DemandCSVError(ValueError):
    """A bad demand CSV: the message names the file, the line and the field."""


@dataclass(frozen=True)
class Demand:
    """Per-region hourly demand: ``rates[region][h]`` = requests/s (real time) in UTC hour ``h``."""

    rates: Dict[str, List[float]]
    source: str = ""
    meta: Dict[str, object] = field(default_factory=dict)

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

    @property
    def regions(self) -> List[str]:
        return list(self.rates)

    def scaled(self, k: float) -> "Demand":
        return Demand({r: [x * k for x in xs] for r, xs in self.rates.items()}, self.source, dict(self.meta))

    def only(self, regions: Sequence[str]) -> "Demand":
        return Demand({r: list(self.rates[r]) for r in regions}, self.source, dict(self.meta))

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


def builtin_demand(mean_rps: float = DEFAULT_MEAN_RPS, tz: Optional[Dict[str, float]] = None,
                   weights: Optional[Dict[str, float]] = None) -> Demand:
    """The ``geo-diurnal-3`` demand (module docstring): total mean ``mean_rps`` req/s over the day."""
    if not (isinstance(mean_rps, (int, float)) and mean_rps > 0 and math.isfinite(mean_rps)):
        raise ValueError(f"mean_rps must be a finite number > 0, got {mean_rps!r}")
    tz = dict(DEFAULT_TZ if tz is None else tz)
    w = dict(WILDCHAT_REGION_WEIGHTS if weights is None else weights)
    total_w = sum(w[r] for r in tz)
    shape = servegen_day_shape()
    rates = {}
    for r, off in tz.items():
        rates[r] = [mean_rps * w[r] / total_w * shape[int(round(h + off)) % 24] for h in range(24)]
    return Demand(rates, "geo-diurnal-3", {"mean_rps": mean_rps, "tz_offsets_h": tz, "weights": w,
                                           "shape": "ServeGen m-large fixture, 24 clients summed"})


BUILTIN_DEMANDS = {"geo-diurnal-3": builtin_demand}

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


def _arrival_times(rates: Sequence[float], bin_s: float, multiplier: float, cv: float,
                   rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, 24 * bin_s): a unit-rate Gamma renewal process (CV ``cv``; 1 = Poisson)
    mapped through the inverse cumulative rate of the piecewise-constant ``rates`` x ``multiplier``."""
    lam = np.asarray(rates, dtype=float) * multiplier
    cum = np.concatenate([[0.0], np.cumsum(lam * bin_s)])
    total = float(cum[-1])
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
    ops = ops[ops < total]
    i = np.searchsorted(cum, ops, side="right") - 1
    i = np.clip(i, 0, len(lam) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        times = i * bin_s + np.where(lam[i] > 0, (ops - cum[i]) / lam[i], 0.0)
    return np.minimum(times, 24 * bin_s - 1e-9)


def geo_diurnal(curves: Optional[Dict[str, List[float]]] = None, *, day_s: float = DEFAULT_DAY_S,
                multiplier: float = 1.0, seed: int = 0, mix: Optional[Dict[str, float]] = None,
                iat_cv: Optional[float] = None, users: int = 16, repos: int = 16, live: int = 32,
                reuse: int = 6, context_tokens: Sequence[int] = (2000, 6000), hours: Optional[Sequence[int]] = None,
                mean_rps: float = DEFAULT_MEAN_RPS, keep_regions: Optional[Sequence[str]] = None) -> Workload:
    """The open-loop day (module docstring). ``curves``: ``{region: 24 hourly real req/s}`` (None: the
    built-in ``geo-diurnal-3`` at ``mean_rps``); ``hours``: simulate only these UTC hours [start, end)
    (each still ``day_s / 24`` s long, t = 0 at ``start``); ``iat_cv``: None = the Azure trace's;
    ``keep_regions``: keep only these regions' requests, exactly as they are in the whole day (the same
    times and texts: the shared contexts' sequence runs over every region, so dropping a region from
    ``curves`` instead would change the others' content)."""
    demand = builtin_demand(mean_rps) if curves is None else Demand({r: list(x) for r, x in curves.items()})
    if not (day_s > 0 and math.isfinite(day_s)):
        raise ValueError(f"day_s must be a finite number > 0, got {day_s!r}")
    if not (multiplier >= 0 and math.isfinite(multiplier)):
        raise ValueError(f"multiplier must be a finite number >= 0, got {multiplier!r}")
    mix = dict(DEFAULT_MIX if mix is None else mix)
    bad = [k for k in mix if k not in DEFAULT_MIX]
    if bad or not mix or any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix must map some of {list(DEFAULT_MIX)} to weights >= 0 (sum > 0), got {mix}")
    if users < 1 or repos < 1:
        raise ValueError(f"users and repos must be >= 1, got {users}, {repos}")
    h0, h1 = (0, 24) if hours is None else (int(hours[0]), int(hours[1]))
    if not 0 <= h0 < h1 <= 24:
        raise ValueError(f"hours must be [start, end) with 0 <= start < end <= 24, got {hours!r}")
    if keep_regions is not None:
        unknown = [r for r in keep_regions if r not in demand.rates]
        if unknown or not keep_regions:
            raise ValueError(f"keep_regions must name some of {demand.regions}, got {keep_regions!r}")
    cv = azure_iat_cv() if iat_cv is None else float(iat_cv)
    bin_s = day_s / 24.0
    kinds = [k for k in DEFAULT_MIX if mix.get(k, 0) > 0]
    cum_mix = np.cumsum([mix[k] for k in kinds]) / sum(mix[k] for k in kinds)
    regions = demand.regions
    convs = load_conversations("wildchat")
    pools = partition_conversations(convs, {r: 1 for r in regions}, "wildchat", seed)
    code_rows = _azure_code_rows()
    events = []  # (t, region index, k-th arrival of the region)
    for ri, r in enumerate(regions):
        rates = demand.rates[r][h0:h1]
        ts = _arrival_times(rates, bin_s, multiplier, cv, rng_for(seed, "geo-diurnal", r, h0, h1))
        events.extend((float(t), ri, k) for k, t in enumerate(ts))
    events.sort()
    walks: Dict[tuple, _PromptWalk] = {}
    ctx_texts: Dict[int, str] = {}
    n_ctx = 0
    arrivals = []
    counts = {k: 0 for k in kinds}
    for t, ri, k in events:
        r = regions[ri]
        rng = rng_for(seed, "geo-diurnal-pick", r, h0, k)
        kind = kinds[int(np.searchsorted(cum_mix, rng.random(), side="right").clip(0, len(kinds) - 1))]
        counts[kind] += 1
        if kind == "conversation":
            u = int(rng.integers(0, users))
            walk = walks.get((r, u))
            if walk is None:
                walk = walks[(r, u)] = _PromptWalk(pools[r], 1000 * ri + u, seed)
            conv, turn, cycle = walk.next()
            call = conversation_turn_call(conv, turn, salt=f"[{r} user {u}#{cycle}] ",
                                          session_key=f"{conv.session_key}#{r}.{u}.{cycle}", tenant=f"chat-{r}")
        elif kind == "shared-context":
            d = context_of(n_ctx, live, reuse, seed)
            n_ctx += 1
            if d not in ctx_texts:
                if len(ctx_texts) > 4 * live:
                    ctx_texts.clear()
                ctx_texts[d] = _context_text(d, tuple(context_tokens), seed)
            q = _uniform(64, 256, seed, "q-len", r, k)
            question = f"\n\nQuestion ({r} {k}): " + words(q * CHARS_PER_TOKEN, rng_for(seed, "q", r, k))
            call = Call(prompt=SYSTEM_PROMPT + ctx_texts[d] + question,
                        output_tokens=_uniform(32, 256, seed, "out", r, k), session_key=f"ctx-{d}", tenant="rag")
        else:
            ctx, gen = code_rows[int(rng.integers(0, len(code_rows)))]
            repo = int(rng.integers(0, repos))
            n_chars = max(8, ctx) * CHARS_PER_TOKEN
            head = f"# repository {r}/{repo}\n"
            shared = int(n_chars * 0.75)
            body = (head + words(shared, rng_for(seed, "repo", r, repo)))[:shared]
            tail = f"\n# edit {r} {k}: " + words(max(0, n_chars - shared), rng_for(seed, "edit", r, k))
            call = Call(prompt=body + tail, output_tokens=max(1, min(gen, 1024)), session_key=f"repo-{r}-{repo}",
                        tenant="code")
        if keep_regions is None or r in keep_regions:
            arrivals.append((t, Program(f"geo-diurnal:{r}:{k}", r, [call])))
    note = Demand.compression_note(day_s, multiplier)
    return Workload(
        name="geo-diurnal",
        description=(f"open-loop diurnal demand ({demand.source or 'curves'}), regions "
                     f"{regions if keep_regions is None else list(keep_regions)}, UTC hours "
                     f"{h0}-{h1}, {len(arrivals)} requests, mix {mix}, IAT CV {cv:.2f}; {note}"),
        open=OpenLoopSpec(arrivals),
        meta={"day_s": day_s, "compression": REAL_DAY_S / day_s, "multiplier": multiplier, "hours": [h0, h1],
              "iat_cv": cv, "mix": mix, "counts": counts, "seed": seed, "compression_note": note,
              "keep_regions": None if keep_regions is None else list(keep_regions),
              "rates": demand.to_kw()},
    )


def load_demand(spec: str, mean_rps: Optional[float] = None) -> Demand:
    """A built-in demand name or a CSV path (ValueError / DemandCSVError naming the problem): what ``plan``
    and ``goodput`` read from ``--demand``."""
    import os

    from ray_geolb.engine.network import RegionNetwork

    if spec in BUILTIN_DEMANDS:
        return BUILTIN_DEMANDS[spec](mean_rps) if mean_rps is not None else BUILTIN_DEMANDS[spec]()
    if mean_rps is not None:
        raise ValueError("--mean-rps applies to a built-in demand only (scale a CSV with --rate-scale)")
    if not spec.lower().endswith(".csv") and not os.path.exists(spec):
        raise ValueError(f"unknown demand {spec!r}: not a built-in ({', '.join(BUILTIN_DEMANDS)}) nor a CSV file")
    return load_demand_csv(spec, RegionNetwork.default().regions)
