"""Fit the step-time roofline (:mod:`.step_model`) to measured GPU step times.

    python -m ray_geolb.engine.step_fit            # fit every card of the committed fixture, print the
                                                   # constants, every row's error and the design checks

The fixture (``ray_geolb/data/gpu_step_times/llama3.1-8b_steps.json``, source and license inside) holds
single-chunk and single-decode-batch rows ``[P, c, B, L, median_s]`` per card and run (the first 44-row
grids, a second H100 run, and the long-context rows of 2026-11-28 with their three reference rows), and,
for one H100 run, ``design_checks``: steps with several prefill chunks that no fit reads. They were seen
while the model's form was chosen, so they check the design; they are not held-out data.

How the constants are fitted (numpy only, deterministic), per card, on every single-chunk and
single-decode row of all its runs:

1. The model is linear in ``o, k_c, k_d, g, a, q, m`` once two discrete choices are made: the knee ``k``
   and which chunks are pass-bound (their cost is ``m * (c + P)``, one query tile over the context)
   rather than pair-bound (``q * P * (c + P/2)``). A chunk is pass-bound when its new tokens are fewer
   than ``m / q``, so the choice is a threshold ``s`` on ``P``: chunks with ``P <= s`` are pass-bound.
2. For each knee ``k`` (16..512 tokens, step 2) and each threshold ``s`` (0 and every chunk size in the
   rows up to 128 tokens, the largest query tile an attention kernel uses: without that bound a grid
   without short chunks over long contexts -- the first grids alone -- is fitted best by pricing every
   512-token chunk as a "pass", m = 820 ns, and eight 16-token chunks over 30,000 tokens come out at
   +372 %), the seven constants by least squares on the relative error (each row weighted by ``1 / t``),
   non-negative (a negative one is dropped and the rest refitted).
3. The (k, s) whose model -- evaluated with its ``max`` terms, not the assumed branches -- has the
   smallest root-mean-square relative error wins.

Nothing in the form is per row: one GEMM knee, one bandwidth rate for every decode, one compute rate
per attention pair and one per tile pass, and three launch terms.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .step_model import StepModel

__all__ = ["FIXTURE", "Step", "load_fixture", "card_runs", "design_checks", "fit_card", "fit_step_model",
           "errors", "predict", "FitReport"]

FIXTURE = "gpu_step_times/llama3.1-8b_steps.json"

#: one measured step: prefill chunks [(P_i, c_i)], decodes B of context L each, seconds
Step = Tuple[Tuple[Tuple[int, int], ...], int, int, float]

KNEES = tuple(range(16, 513, 2))

#: the largest query tile an attention kernel runs (64 or 128 queries in FlashAttention-style kernels): a
#: chunk with more new tokens is never priced by a tile's pass, whatever lowers the error on the rows
MAX_TILE_TOKENS = 128


def load_fixture(path: Optional[str] = None) -> dict:
    """The committed fixture (or ``path``)."""
    if path is not None:
        with open(path) as f:
            return json.load(f)
    return json.loads(resources.files("ray_geolb.data").joinpath(FIXTURE).read_text())


def _row_step(r: Sequence) -> Step:
    P, c, B, L, t = r
    return (((int(P), int(c)),) if P else ()), int(B), int(L), float(t)


def card_runs(fixture: dict, card: str) -> List[List[Step]]:
    """The single-chunk / single-decode-batch rows of ``card`` (reference rows included), one list per run."""
    try:
        runs = fixture["cards"][card]
    except KeyError:
        raise ValueError(f"no card {card!r} in the step-time fixture; cards: {sorted(fixture['cards'])}") from None
    return [[_row_step(r) for r in run["rows"]] for run in runs]


def design_checks(fixture: dict, card: str = "h100-sxm") -> List[Step]:
    """The multi-chunk steps of ``card``: never fitted on, seen while the form was chosen."""
    out: List[Step] = []
    for run in fixture["cards"][card]:
        for v in run.get("design_checks", run.get("validation", ())):  # "validation": the older name
            out.append((tuple((int(p), int(c)) for p, c in v["chunks"]), int(v["B"]), int(v["L"]),
                        float(v["median_s"])))
    return out


def predict(model: StepModel, step: Step) -> float:
    chunks, B, L, _t = step
    return model.time(chunks, [L] * B)


def errors(model: StepModel, steps: Sequence[Step]) -> np.ndarray:
    """Relative errors (predicted / measured - 1) of ``steps``."""
    return np.array([predict(model, s) / s[3] - 1.0 for s in steps])


# the columns of the least squares, in this order
_COLS = ("overhead_s", "chunk_overhead_s", "decode_overhead_s", "gemm_per_token_s",
         "decode_attn_per_ctx_token_s", "prefill_attn_per_pair_s", "lone_attn_per_ctx_token_s")


def _design(steps: Sequence[Step]) -> dict:
    """Per-row arrays the fit reuses for every (k, s)."""
    n = len(steps)
    fixed = np.zeros((n, 3))  # o, k_c, k_d
    tokens = np.zeros(n)
    ctx = np.zeros(n)  # B * L
    chunk_p, chunk_row, chunk_pairs, chunk_pass = [], [], [], []
    for i, (chunks, B, L, _t) in enumerate(steps):
        fixed[i] = (1.0, len(chunks), 1.0 if B else 0.0)
        tokens[i] = sum(p for p, _ in chunks) + B
        ctx[i] = B * L
        for p, c in chunks:
            chunk_p.append(p)
            chunk_row.append(i)
            chunk_pairs.append(p * (c + 0.5 * p))
            chunk_pass.append(c + p)
    return dict(y=np.array([s[3] for s in steps]), fixed=fixed, tokens=tokens, ctx=ctx,
                chunk_p=np.array(chunk_p), chunk_row=np.array(chunk_row, dtype=int),
                chunk_pairs=np.array(chunk_pairs), chunk_pass=np.array(chunk_pass))


def _nnls_rel(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of ``X @ coef ~ y`` on the relative error, non-negative by dropping columns."""
    w = 1.0 / y
    active = list(range(X.shape[1]))
    while True:
        sol, *_ = np.linalg.lstsq(X[:, active] * w[:, None], np.ones_like(y), rcond=None)
        if (sol >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(sol)))
    coef = np.zeros(X.shape[1])
    coef[active] = np.maximum(sol, 0.0)
    return coef


def _model_times(d: dict, coef: np.ndarray, k: float) -> np.ndarray:
    """The fitted model's step times (its real ``max`` terms) for the rows of ``d``."""
    o, kc, kd, g, a, q, m = coef
    t = d["fixed"] @ np.array([o, kc, kd]) + g * np.maximum(d["tokens"], k) + a * d["ctx"]
    attn = np.maximum(q * d["chunk_pairs"], m * d["chunk_pass"])
    np.add.at(t, d["chunk_row"], attn)
    return t


def _fit_at(d: dict, k: float, s: float) -> np.ndarray:
    n = len(d["y"])
    X = np.zeros((n, len(_COLS)))
    X[:, 0:3] = d["fixed"]
    X[:, 3] = np.maximum(d["tokens"], k)
    X[:, 4] = d["ctx"]
    on_pass = d["chunk_p"] <= s
    np.add.at(X[:, 5], d["chunk_row"][~on_pass], d["chunk_pairs"][~on_pass])
    np.add.at(X[:, 6], d["chunk_row"][on_pass], d["chunk_pass"][on_pass])
    return _nnls_rel(X, d["y"])


def fit_step_model(runs: Sequence[Sequence[Step]], knees: Sequence[int] = KNEES) -> StepModel:
    """The :class:`StepModel` that fits the single-chunk / single-decode rows of ``runs`` (module docstring)."""
    steps = [s for run in runs for s in run]
    d = _design(steps)
    thresholds = [0] + sorted({int(p) for p in d["chunk_p"] if p <= MAX_TILE_TOKENS})
    best, best_rms = None, math.inf
    for s in thresholds:
        for k in knees:
            coef = _fit_at(d, float(k), float(s))
            rms = float(np.sqrt(np.mean((_model_times(d, coef, float(k)) / d["y"] - 1.0) ** 2)))
            if rms < best_rms - 1e-12:
                best, best_rms = (coef, k), rms
    if best is None:
        raise ValueError("the step-time fit found no model: too few rows")
    coef, k = best
    return StepModel(knee_tokens=float(k), **dict(zip(_COLS, (float(v) for v in coef))))


@dataclass(frozen=True)
class FitReport:
    card: str
    model: StepModel
    per_run: Dict[str, np.ndarray]  # run file -> relative errors of its rows
    design_checks: Optional[np.ndarray]  # relative errors of the multi-chunk steps (H100 only)

    @property
    def all_rows(self) -> np.ndarray:
        return np.concatenate(list(self.per_run.values()))


def fit_card(fixture: dict, card: str) -> FitReport:
    """Fit ``card`` on all its runs' rows; errors per run and on the multi-chunk design checks."""
    runs = card_runs(fixture, card)
    model = fit_step_model(runs)
    per_run = {run["file"]: errors(model, steps) for run, steps in zip(fixture["cards"][card], runs)}
    dc = design_checks(fixture, card)
    return FitReport(card, model, per_run, errors(model, dc) if dc else None)


def _step_label(chunks, B, L) -> str:
    parts = [f"{p}+{c}" if c else f"{p}" for p, c in chunks]
    out = ("chunks " + ", ".join(parts)) if parts else ""
    if B:
        out += (" + " if out else "") + f"{B} x {L} decodes"
    return out


def _main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ray_geolb.engine.step_fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", help="a step-time JSON in the fixture's format (default: the committed one)")
    ap.add_argument("--brief", action="store_true", help="the constants and the summaries only, not every row")
    args = ap.parse_args(argv)
    fx = load_fixture(args.fixture)
    for card in fx["cards"]:
        rep = fit_card(fx, card)
        mdl = rep.model
        print(f"== {card}")
        print(f"   StepModel(overhead_s={mdl.overhead_s:.4e}, gemm_per_token_s={mdl.gemm_per_token_s:.4e}, "
              f"knee_tokens={mdl.knee_tokens:g},\n             decode_attn_per_ctx_token_s="
              f"{mdl.decode_attn_per_ctx_token_s:.4e}, prefill_attn_per_pair_s={mdl.prefill_attn_per_pair_s:.4e},"
              f"\n             lone_attn_per_ctx_token_s={mdl.lone_attn_per_ctx_token_s:.4e}, "
              f"chunk_overhead_s={mdl.chunk_overhead_s:.4e}, decode_overhead_s={mdl.decode_overhead_s:.4e})")
        m, q, a = mdl.lone_attn_per_ctx_token_s, mdl.prefill_attn_per_pair_s, mdl.decode_attn_per_ctx_token_s
        print(f"   m / q = {m / q if q else math.inf:.1f} tokens (a chunk with fewer new tokens pays one tile's "
              f"pass), m / a = {m / a if a else math.inf:.2f}")
        for run, (f, e) in zip(fx["cards"][card], rep.per_run.items()):
            print(f"   {f}: {len(e)} rows, max |error| {np.abs(e).max():.1%}, median {np.median(np.abs(e)):.1%}")
            if args.brief:
                continue
            for r, x in zip(run["rows"], e):
                (chunks, B, L, t) = _row_step(r)
                print(f"      {_step_label(chunks, B, L):<40} {t * 1e3:9.2f} ms measured "
                      f"{predict(mdl, (chunks, B, L, t)) * 1e3:9.2f} ms model {x:+6.1%}")
        allr = rep.all_rows
        print(f"   all {len(allr)} rows: max |error| {np.abs(allr).max():.1%}, median {np.median(np.abs(allr)):.1%}")
        if rep.design_checks is not None:
            dc = design_checks(fx, card)
            print(f"   design checks (multi-chunk steps, never fitted on, seen while the form was chosen): "
                  f"{len(dc)}, max |error| {np.abs(rep.design_checks).max():.1%}, median "
                  f"{np.median(np.abs(rep.design_checks)):.1%}")
            for s, x in zip(dc, rep.design_checks):
                chunks = s[0]
                label = (f"{len(chunks)} x ({chunks[0][0]}+{chunks[0][1]})" if len(set(chunks)) == 1
                         else ", ".join(f"{p}+{c}" for p, c in chunks))
                if s[1]:
                    label += f" + {s[1]} x {s[2]} decodes"
                print(f"      {label:<40} {s[3] * 1e3:9.2f} ms measured {predict(mdl, s) * 1e3:9.2f} ms model "
                      f"{x:+6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
