"""Inter-region latency injection for cross-region hops of a local (one-machine) deployment.

On one machine every "region" is a Ray node on localhost, so a forward from ``us`` to ``eu`` costs
nothing. :class:`LatencyInjector` adds what the WAN would add: the one-way latency (RTT / 2) before a
cross-region call reaches the peer, and again on the way back -- for a stream, each chunk is
delivered one-way latency after the peer produced it (not merely "the first chunk late").

RTTs come from :meth:`ray_geolb.engine.network.RegionNetwork.default` (us / eu / asia from the
shipped IBM Cloud RTT table), or from an explicit ``rtt_ms`` table. ``scale`` multiplies every
latency (tests use e.g. 0.1; 0 disables injection). Intra-region calls are never delayed.

Faults, for chaos tests and drills (:meth:`LatencyInjector.set_faults`, reached through the ingress's
``inject_faults`` handle method): per peer region, extra one-way latency (``extra_ms``) and the share
of crossings towards it that are dropped (``drop``, 0..1). A dropped crossing raises
:class:`HopDropped` *before* the request leaves, so nothing reached the peer and the origin may try
elsewhere; a reply is delayed, never dropped (a lost reply is silence, bounded by the request's
deadline). ``drop=1`` partitions the region from this ingress (its RTT probes fail too).

The injector is plain data (picklable): it is built from a JSON-able spec in each ingress replica.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any, AsyncIterator, Dict, Iterable, Mapping, Optional, Tuple

__all__ = ["FALLBACK_RTT_MS", "HopDropped", "LatencyInjector", "default_rtt_table"]


class HopDropped(ConnectionError):
    """An injected fault dropped a crossing before it reached the peer (see the module docstring)."""

#: used only if ``ray_geolb.engine.network`` cannot be imported
FALLBACK_RTT_MS = {("us", "eu"): 98.0, ("us", "asia"): 167.0, ("eu", "asia"): 230.0}


def default_rtt_table() -> Dict[Tuple[str, str], float]:
    """``{(a, b): rtt_ms}`` for the default regions, once per unordered pair."""
    try:
        from ray_geolb.engine.network import RegionNetwork
    except ImportError:  # pragma: no cover - the module ships with the package
        return dict(FALLBACK_RTT_MS)
    net = RegionNetwork.default()
    regs = net.regions
    return {(a, b): net.rtt_ms(a, b) for i, a in enumerate(regs) for b in regs[i + 1:]}


def _parse_table(rtt_ms: Any) -> Dict[Tuple[str, str], float]:
    """Accept ``{(a, b): ms}``, ``{"a-b": ms}`` / ``{"a,b": ms}`` or ``{a: {b: ms}}``."""
    out: Dict[Tuple[str, str], float] = {}

    def put(a, b, v):
        if not isinstance(a, str) or not isinstance(b, str) or not a or not b:
            raise ValueError(f"rtt_ms: region names must be non-empty strings, got {a!r}, {b!r}")
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"rtt_ms[{a}->{b}] must be a number, got {v!r}") from None
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"rtt_ms[{a}->{b}] must be finite and >= 0, got {v}")
        key = (a, b) if a <= b else (b, a)
        if key in out and out[key] != v:
            raise ValueError(f"rtt_ms: conflicting RTTs for {a}<->{b}: {out[key]} and {v}")
        out[key] = v

    if not isinstance(rtt_ms, Mapping):
        raise ValueError(f"rtt_ms must be a mapping, got {type(rtt_ms).__name__}")
    for k, v in rtt_ms.items():
        if isinstance(v, Mapping):
            for b, vv in v.items():
                if b != k:
                    put(k, b, vv)
        elif isinstance(k, (tuple, list)) and len(k) == 2:
            put(k[0], k[1], v)
        elif isinstance(k, str) and ("-" in k or "," in k):
            a, b = k.split("," if "," in k else "-", 1)
            put(a.strip(), b.strip(), v)
        else:
            raise ValueError(f"rtt_ms: cannot read key {k!r} (use (a, b), 'a-b' or {{a: {{b: ms}}}})")
    return out


class LatencyInjector:
    """Sleeps one-way latency around cross-region hops (see the module docstring)."""

    def __init__(self, rtt_ms: Optional[Mapping] = None, scale: float = 1.0):
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale < 0:
            raise ValueError(f"latency scale must be a finite number >= 0, got {scale!r}")
        self.scale = float(scale)
        table = default_rtt_table() if rtt_ms is None else _parse_table(rtt_ms)
        self._rtt_ms = {}
        for (a, b), v in table.items():
            self._rtt_ms[(a, b)] = self._rtt_ms[(b, a)] = float(v)
        self._faults: Dict[str, Tuple[float, float]] = {}  # region -> (drop probability, extra one-way s)
        self._rng = random.Random()
        self.dropped = 0

    def set_faults(self, faults: Optional[Mapping[str, Mapping[str, float]]]) -> None:
        """Replace the injected faults: ``{region: {"drop": 0..1, "extra_ms": >= 0}}`` (None or {}: heal)."""
        out: Dict[str, Tuple[float, float]] = {}
        for region, f in (faults or {}).items():
            if not isinstance(region, str) or not isinstance(f, Mapping) or set(f) - {"drop", "extra_ms"}:
                raise ValueError(f"faults must be {{region: {{'drop': p, 'extra_ms': ms}}}}, got {region!r}: {f!r}")
            drop, extra = f.get("drop", 0.0), f.get("extra_ms", 0.0)
            for name, v, hi in (("drop", drop, 1.0), ("extra_ms", extra, math.inf)):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
                    raise ValueError(f"faults[{region!r}].{name} must be a number in [0, {hi:g}], got {v!r}")
            out[region] = (float(drop), float(extra) / 1000.0)
        self._faults = out

    @property
    def faults(self) -> Dict[str, dict]:
        return {r: {"drop": d, "extra_ms": e * 1000.0} for r, (d, e) in self._faults.items()}

    # ------------------------------------------------------------ construction
    @classmethod
    def from_spec(cls, spec: Any) -> "LatencyInjector":
        """``None`` / ``{}`` -> default table, scale 1; ``{"scale": s, "rtt_ms": {...}}``; or an injector."""
        if isinstance(spec, LatencyInjector):
            return spec
        if spec is None:
            return cls()
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            return cls(scale=spec)
        if not isinstance(spec, Mapping):
            raise ValueError(f"latency spec must be a dict like {{'scale': 0.1}}, got {type(spec).__name__}")
        unknown = set(spec) - {"scale", "rtt_ms"}
        if unknown:
            raise ValueError(f"latency spec: unknown keys {sorted(unknown)} (allowed: scale, rtt_ms)")
        return cls(rtt_ms=spec.get("rtt_ms"), scale=spec.get("scale", 1.0))

    def to_spec(self) -> dict:
        seen = {}
        for (a, b), v in self._rtt_ms.items():
            if a <= b:
                seen[f"{a},{b}"] = v
        return {"scale": self.scale, "rtt_ms": seen}

    def check_regions(self, regions: Iterable[str]) -> None:
        """Raise ``ValueError`` naming a pair of ``regions`` with no RTT (when injection is on)."""
        if self.scale == 0:
            return
        regions = list(regions)
        for i, a in enumerate(regions):
            for b in regions[i + 1:]:
                if (a, b) not in self._rtt_ms:
                    raise ValueError(
                        f"no inter-region RTT for {a!r}<->{b!r}; give latency={{'rtt_ms': {{'{a},{b}': ms}}}} "
                        f"or latency={{'scale': 0}} to disable injection")

    # ------------------------------------------------------------ queries
    def rtt_s(self, a: str, b: str) -> float:
        """Injected RTT in seconds (already scaled); 0 within a region or for an unknown pair."""
        if a == b or self.scale == 0:
            return 0.0
        return self._rtt_ms.get((a, b), 0.0) * self.scale / 1000.0

    def one_way_s(self, a: str, b: str) -> float:
        d = self.rtt_s(a, b) / 2.0
        if self._faults and a != b:
            d += max(self._faults.get(a, (0, 0.0))[1], self._faults.get(b, (0, 0.0))[1])
        return d

    # ------------------------------------------------------------ injection
    async def hop(self, a: str, b: str) -> None:
        """One crossing from ``a`` to ``b`` (request or response direction). Raises :class:`HopDropped`
        when an injected fault drops a crossing towards a faulted region ``b``."""
        d = self.one_way_s(a, b)
        if d > 0:
            await asyncio.sleep(d)
        if self._faults and a != b:
            p = self._faults.get(b, (0.0, 0.0))[0]
            if p > 0 and self._rng.random() < p:
                self.dropped += 1
                raise HopDropped(f"injected fault: the crossing {a} -> {b} was dropped")

    async def relay(self, agen: AsyncIterator, src: str, dst: str) -> AsyncIterator:
        """Re-yield a stream produced in ``src`` as ``dst`` would see it: each item one-way later."""
        d = self.one_way_s(src, dst)
        if d <= 0:
            async for item in agen:
                yield item
            return
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump():
            try:
                async for item in agen:
                    queue.put_nowait((time.monotonic() + d, item, None))
                queue.put_nowait((time.monotonic() + d, done, None))
            except BaseException as e:  # noqa: BLE001 - re-raised on the consumer side
                queue.put_nowait((time.monotonic() + d, done, e))

        task = asyncio.ensure_future(pump())
        try:
            while True:
                at, item, err = await queue.get()
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if item is done:
                    if err is not None and not isinstance(err, asyncio.CancelledError):
                        raise err
                    return
                yield item
        finally:
            if not task.done():
                task.cancel()

    def __repr__(self) -> str:
        pairs = ", ".join(f"{a}-{b}={v:g}ms" for (a, b), v in sorted(self._rtt_ms.items()) if a < b)
        return f"LatencyInjector(scale={self.scale:g}, {pairs})"
