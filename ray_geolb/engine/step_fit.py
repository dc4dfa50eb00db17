"""Fit the step-time roofline (:mod:`.step_model`) to measured GPU step times.

    python -m ray_geolb.engine.step_fit            # fit every card of the committed fixture, print
                                                   # the constants, every row's error, the held-out steps

The fixture (``ray_geolb/data/gpu_step_times/llama3.1-8b_steps.json``, source and license inside) holds
single-chunk rows ``[P, c, B, L, median_s]`` per card and run, and, for one H100 run, a ``validation``
list of steps with several prefill chunks that no fit reads.

How the constants are fitted (numpy only, deterministic):

1. ``m``, a lone sequence's K/V read per context token: the only rows where one sequence alone reads a
   long K/V are the decode batches of one (``B = 1``), so ``m`` is their slope in ``L`` (least squares,
   one intercept per run), and never below ``a``. A chunk over a cached context is compute-bound in
   every other row of the grid (``P >= 512``), so those rows cannot tell ``m`` apart.
2. For each knee ``k`` of a grid, the other constants (``o, k_c, k_d, g, a, q``) by least squares on the
   relative error (each row weighted by ``1 / t``), non-negative (a negative one is dropped and the rest
   refitted); the two ``max`` terms are resolved by fixed-point iteration (a row's decode or chunk
   term that is read-bound at the current constants is moved to the known side).
3. The knee with the smallest root-mean-square relative error wins.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .step_model import StepModel

__all__ = ["FIXTURE", "Step", "load_fixture", "fit_card", "fit_lone_read", "fit_step_model", "errors",
           "validation_steps", "FitReport"]

FIXTURE = "gpu_step_times/llama3.1-8b_steps.json"

#: one measured step: prefill chunks [(P_i, c_i)], decodes B of context L each, seconds
Step = Tuple[Tuple[Tuple[int, int], ...], int, int, float]


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
    """The single-chunk rows of ``card``, one list per measurement run."""
    try:
        runs = fixture["cards"][card]
    except KeyError:
        raise ValueError(f"no card {card!r} in the step-time fixture; cards: {sorted(fixture['cards'])}") from None
    return [[_row_step(r) for r in run["rows"]] for run in runs]


def validation_steps(fixture: dict, card: str = "h100-sxm") -> List[Step]:
    """The held-out multi-chunk steps of ``card`` (never fitted on)."""
    out: List[Step] = []
    for run in fixture["cards"][card]:
        for v in run.get("validation", ()):
            out.append((tuple((int(p), int(c)) for p, c in v["chunks"]), int(v["B"]), int(v["L"]),
                        float(v["median_s"])))
    return out


def predict(model: StepModel, step: Step) -> float:
    chunks, B, L, _t = step
    return model.time(chunks, [L] * B)


def errors(model: StepModel, steps: Sequence[Step]) -> np.ndarray:
    """Relative errors (predicted / measured - 1) of ``steps``."""
    return np.array([predict(model, s) / s[3] - 1.0 for s in steps])


def fit_lone_read(runs: Sequence[Sequence[Step]]) -> float:
    """``m``: slope in L of the single-decode rows (``B = 1``, no chunk), one intercept per run."""
    xs, ys, run_ids = [], [], []
    for i, run in enumerate(runs):
        for chunks, B, L, t in run:
            if not chunks and B == 1:
                xs.append(L)
                ys.append(t)
                run_ids.append(i)
    if len({x for x in xs}) < 2:
        return 0.0
    X = np.zeros((len(xs), 1 + len(runs)))
    X[:, 0] = xs
    for r, i in enumerate(run_ids):
        X[r, 1 + i] = 1.0
    coef, *_ = np.linalg.lstsq(X, np.asarray(ys), rcond=None)
    return max(0.0, float(coef[0]))


_COLS = ("overhead_s", "chunk_overhead_s", "decode_overhead_s", "gemm_per_token_s",
         "decode_attn_per_ctx_token_s", "prefill_attn_per_pair_s")


def _fit_at(steps: Sequence[Step], k: float, m: float) -> Optional[StepModel]:
    y = np.array([s[3] for s in steps])
    w = 1.0 / y
    base = np.zeros((len(steps), len(_COLS)))
    lone_dec = np.zeros(len(steps))  # m * max L of a decode batch
    chunk_read = [[m * (c + p) for p, c in s[0]] for s in steps]
    pairs = [[p * (c + 0.5 * p) for p, c in s[0]] for s in steps]
    for i, (chunks, B, L, _t) in enumerate(steps):
        T = sum(p for p, _ in chunks) + B
        base[i, 0] = 1.0
        base[i, 1] = len(chunks)
        base[i, 2] = 1.0 if B else 0.0
        base[i, 3] = max(k, T)
        lone_dec[i] = m * L if B else 0.0
    a, q = math.inf, math.inf  # first pass: every term in its bandwidth / compute regime
    active = list(range(len(_COLS)))
    coef = np.zeros(len(_COLS))
    for _ in range(8):
        X = base.copy()
        known = np.zeros(len(steps))
        for i, (chunks, B, L, _t) in enumerate(steps):
            if B:
                if a * B * L >= lone_dec[i]:
                    X[i, 4] = B * L
                else:
                    known[i] += lone_dec[i]
            for pr, rd in zip(pairs[i], chunk_read[i]):
                if q * pr >= rd:
                    X[i, 5] += pr
                else:
                    known[i] += rd
        while True:
            sub = X[:, active] * w[:, None]
            sol, *_ = np.linalg.lstsq(sub, (y - known) * w, rcond=None)
            if (sol >= 0).all() or len(active) == 1:
                break
            active.pop(int(np.argmin(sol)))
        coef = np.zeros(len(_COLS))
        coef[active] = np.maximum(sol, 0.0)
        if abs(coef[4] - a) <= 1e-3 * max(a, 1e-15) and abs(coef[5] - q) <= 1e-3 * max(q, 1e-18):
            break
        a, q = float(coef[4]), float(coef[5])
    vals = dict(zip(_COLS, (float(v) for v in coef)))
    return StepModel(knee_tokens=float(k), lone_attn_per_ctx_token_s=max(m, vals["decode_attn_per_ctx_token_s"]),
                     **vals)


def fit_step_model(runs: Sequence[Sequence[Step]], knees: Sequence[int] = tuple(range(16, 513, 2))) -> StepModel:
    """The :class:`StepModel` that fits the single-chunk rows of ``runs`` (module docstring)."""
    steps = [s for run in runs for s in run]
    m = fit_lone_read(runs)
    best, best_rms = None, math.inf
    for k in knees:
        model = _fit_at(steps, k, m)
        if model is None:
            continue
        rms = float(np.sqrt(np.mean(errors(model, steps) ** 2)))
        if rms < best_rms:
            best, best_rms = model, rms
    if best is None:
        raise ValueError("the step-time fit found no model: too few rows")
    return best


@dataclass(frozen=True)
class FitReport:
    card: str
    model: StepModel
    per_run: Dict[str, np.ndarray]  # run file -> relative errors of its rows
    validation: Optional[np.ndarray]  # relative errors of the held-out steps (H100 only)


def fit_card(fixture: dict, card: str) -> FitReport:
    """Fit ``card`` on all its runs' single-chunk rows; errors per run and on the held-out steps."""
    runs = card_runs(fixture, card)
    model = fit_step_model(runs)
    per_run = {run["file"]: errors(model, steps) for run, steps in zip(fixture["cards"][card], runs)}
    val = validation_steps(fixture, card)
    return FitReport(card, model, per_run, errors(model, val) if val else None)


def _main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ray_geolb.engine.step_fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", help="a step-time JSON in the fixture's format (default: the committed one)")
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
        for f, e in rep.per_run.items():
            print(f"   {f}: {len(e)} rows, max |error| {np.abs(e).max():.1%}, median {np.median(np.abs(e)):.1%}")
        if rep.validation is not None:
            print(f"   held-out multi-chunk steps: {len(rep.validation)}, max |error| "
                  f"{np.abs(rep.validation).max():.1%}: " + " ".join(f"{x:+.1%}" for x in rep.validation))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
