"""Open-loop arrivals from ServeGen per-client 10-minute rate windows, shifted per region time zone."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np

from .conversation import conversation_turn_call
from .datasets import ServeGenWindow, load_conversations, load_servegen
from .model import OpenLoopSpec, Program, Workload
from .text import rng_for

DEFAULT_TZ = {"us": -5.0, "eu": 1.0, "asia": 9.0}


def _iats(w: ServeGenWindow, rate: float, n_hint: int, rng: np.random.Generator, iat: str) -> np.ndarray:
    """Inter-arrival times with mean 1/rate: exponential, or the window's Gamma/Weibull shape rescaled."""
    if iat == "exponential" or w.iat_dist is None or w.shape <= 0:
        return rng.exponential(1.0 / rate, size=n_hint)
    k = w.shape
    if w.iat_dist == "Gamma":
        return rng.gamma(k, 1.0 / k, size=n_hint) / rate
    return rng.weibull(k, size=n_hint) / math.gamma(1.0 + 1.0 / k) / rate  # Weibull


def window_arrivals(w: ServeGenWindow, rate: float, length_s: float, rng: np.random.Generator,
                    iat: str = "dist") -> np.ndarray:
    """Arrival offsets in [0, length_s) for one window (each window starts afresh at its start)."""
    if rate <= 0:
        return np.empty(0)
    out, t = [], 0.0
    while True:
        n = max(16, int(rate * (length_s - t) * 1.5) + 16)
        ts = t + np.cumsum(_iats(w, rate, n, rng, iat))
        inside = ts[ts < length_s]
        out.append(inside)
        if len(inside) < n:
            break
        t = float(ts[-1])
    return np.concatenate(out)


class _PromptWalk:
    """Per client: conversation turns in order (turn 1, 2, ... of one conversation, then the next),
    conversations in a seeded per-client order; the first user message is salted with the client id
    and cycle so different clients never send identical text, while a client's consecutive
    requests extend each other like a real chat session."""

    def __init__(self, convs, client_id: int, seed: int):
        self.convs, self.cid, self.seed = convs, client_id, seed
        self.cycle, self.order, self.ci, self.turn = -1, [], 0, 0
        self._next_cycle()

    def _next_cycle(self):
        self.cycle += 1
        self.order = list(range(len(self.convs)))
        random.Random(f"{self.seed}:servegen:{self.cid}:{self.cycle}").shuffle(self.order)
        self.ci, self.turn = 0, 0

    def next(self):
        conv = self.convs[self.order[self.ci]]
        k = self.turn
        result = (conv, k, self.cycle)
        self.turn += 1
        if self.turn >= len(conv.turns):
            self.turn, self.ci = 0, self.ci + 1
            if self.ci >= len(self.order):
                self._next_cycle()
        return result


def servegen(path: str | Path | None = None, hours: float = 24.0, tz_offsets: dict[str, float] | None = None,
             scale: float | None = None, prompt_source: str = "sharegpt", seed: int = 0, *,
             mean_rps: float = 1.0, clients: list[int] | None = None, iat: str = "dist",
             prompt_path: str | Path | None = None, start_hour_utc: float = 0.0) -> Workload:
    """Open-loop ServeGen replay. Sim t=0 is ``start_hour_utc`` o'clock UTC.

    * Clients (sorted ids, or ``clients``) go to regions round-robin in ``tz_offsets`` order; a client in
      a region with offset h at sim time t uses the window of local time ``(t + start + h*3600) mod span``
      (span = the file's length, 1 day for the fixture), so regions peak at different UTC hours.
    * Rates are multiplied by ``scale``; if ``scale`` is None it is set so that the mean aggregate rate
      of the chosen clients over the file equals ``mean_rps``.
    * ``iat="dist"``: the window's Gamma/Weibull shape rescaled to the rate (exponential when the
      window has none); ``iat="exponential"``: Poisson arrivals. Draws for a window are seeded by
      (seed, client, data window, day) so the same local window yields the same offsets in any region.
    * Each arrival is a one-call program: the next turn (with full history) of the client's
      conversation walk (see ``_PromptWalk``); ``session_key`` = salted conversation key, ``tenant`` = client.
    """
    if iat not in ("dist", "exponential"):
        raise ValueError(f"iat must be 'dist' or 'exponential', got {iat!r}")
    if hours <= 0:
        raise ValueError("hours must be > 0")
    tz = dict(DEFAULT_TZ if tz_offsets is None else tz_offsets)
    regions = list(tz)
    data = load_servegen(path)
    ids = sorted(data) if clients is None else list(clients)
    unknown = [c for c in ids if c not in data]
    if unknown:
        raise ValueError(f"servegen: clients {unknown} not in {path or 'the shipped fixture'}")
    win = 600.0
    span = max(w.window_start_s for c in ids for w in data[c]) + win
    if scale is None:
        total = sum(w.rate_rps * win for c in ids for w in data[c])
        scale = mean_rps * span / total if total > 0 else 0.0
    convs = load_conversations(prompt_source, prompt_path)
    if not convs:
        raise ValueError("servegen: no prompt conversations")
    T = hours * 3600.0
    t0 = start_hour_utc * 3600.0
    events: list[tuple[float, int, int]] = []  # (time, client, seq-in-window) before prompt assignment
    for n, cid in enumerate(ids):
        region = regions[n % len(regions)]
        by_start = {int(w.window_start_s // win): w for w in data[cid]}
        shift = t0 + tz[region] * 3600.0  # local = sim + shift
        first = math.floor(shift / win)
        last = math.ceil((T + shift) / win)
        for lw in range(first, last):
            day, wi = divmod(lw * win, span)
            w = by_start.get(int(wi // win))
            if w is None or w.rate_rps <= 0:
                continue
            rng = rng_for(seed, cid, int(wi // win), int(day) + 1000)
            offs = window_arrivals(w, w.rate_rps * scale, win, rng, iat)
            base = lw * win - shift
            for o in offs:
                t = base + float(o)
                if 0.0 <= t < T:
                    events.append((t, cid, n))
    events.sort(key=lambda e: (e[0], e[1]))
    walks: dict[int, _PromptWalk] = {}
    arrivals = []
    for k, (t, cid, n) in enumerate(events):
        region = regions[n % len(regions)]
        walk = walks.get(cid)
        if walk is None:
            walk = walks[cid] = _PromptWalk(convs, cid, seed)
        conv, turn, cycle = walk.next()
        tag = f"#client{cid}.c{cycle}"
        call = conversation_turn_call(conv, turn, salt=f"[client {cid}#{cycle}] ",
                                      session_key=conv.session_key + tag, tenant=f"servegen-{cid}")
        arrivals.append((t, Program(f"servegen:{k}", region, [call])))
    return Workload(
        name="servegen",
        description=(f"ServeGen open loop, {len(ids)} clients over {hours} h, tz {tz}, scale {scale:.3g}, "
                     f"prompts from {prompt_source}"),
        open=OpenLoopSpec(arrivals),
        meta={"scale": scale, "tz_offsets": tz, "clients": {c: regions[i % len(regions)] for i, c in enumerate(ids)},
              "span_s": span, "seed": seed},
    )
