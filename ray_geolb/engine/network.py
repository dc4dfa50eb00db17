"""Inter-region network model: region names + a symmetric RTT matrix in milliseconds.

``RegionNetwork.default()``: the SkyLB-style three regions, mapped to IBM Cloud VPC regions of the
shipped ``ray_geolb/data/ibm_cloud_inter_region_rtt_ms_2024-03-03.csv`` (average inter-region RTT,
3 Feb - 3 Mar 2024, from ``ibm-cloud-docs/vpc`` ``network-latency.md``):

    us   -> "Washington DC"   (US East)
    eu   -> "Frankfurt"
    asia -> "Tokyo"

giving us-eu 98 ms, us-asia 167 ms, eu-asia 237 ms.

``RegionNetwork.gorgo()``: the GORGO paper's setting (Ricci Toniolo, Dinesh & Thorstenson, "GORGO: Maximizing
KV-Cache Reuse While Minimizing Network Latency in Cross-Region LLM Load Balancing", §2 example): seen from the
US-West load balancer, Germany is 281 ms and Israel 183 ms away (measured RTT between load
balancers, §3), and the local region 3 ms. The paper does not report Germany<->Israel; the default
here (60 ms) is an assumption (typical public Frankfurt-Tel Aviv RTT), not a number from the paper.
The IBM table has no US-West/Israel regions, hence the paper's numbers.

The diagonal is the intra-region RTT (0 by default). ``rtt_s(a, b)`` / ``one_way_s(a, b)`` are in seconds.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
IBM_RTT_CSV = DATA_DIR / "ibm_cloud_inter_region_rtt_ms_2024-03-03.csv"
DEFAULT_MAPPING = {"us": "Washington DC", "eu": "Frankfurt", "asia": "Tokyo"}
GORGO_RTT_MS = {("us-west", "germany"): 281.0, ("us-west", "israel"): 183.0}
GORGO_LOCAL_MS = 3.0


class RegionNetwork:
    """Symmetric RTT matrix (ms) between named regions."""

    def __init__(self, regions: Sequence[str], rtt_ms: Sequence[Sequence[float]]):
        regions = list(regions)
        if len(set(regions)) != len(regions):
            raise ValueError(f"duplicate region names: {regions}")
        if not regions:
            raise ValueError("RegionNetwork needs at least one region")
        n = len(regions)
        if len(rtt_ms) != n or any(len(row) != n for row in rtt_ms):
            raise ValueError(f"RTT matrix must be {n}x{n} for regions {regions}")
        m = [[float(x) for x in row] for row in rtt_ms]
        for i in range(n):
            for j in range(n):
                if not math.isfinite(m[i][j]) or m[i][j] < 0:
                    raise ValueError(f"RTT {regions[i]}->{regions[j]} must be finite and >= 0, got {m[i][j]}")
                if m[i][j] != m[j][i]:
                    raise ValueError(f"RTT matrix not symmetric: {regions[i]}->{regions[j]}={m[i][j]}, "
                                     f"{regions[j]}->{regions[i]}={m[j][i]}")
        self._regions = regions
        self._idx = {r: i for i, r in enumerate(regions)}
        self._m = m

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_pairs(cls, regions: Sequence[str], pairs: Mapping[tuple[str, str], float],
                   intra_ms: float = 0.0) -> "RegionNetwork":
        """From ``{(a, b): rtt_ms}`` given once per unordered pair; the diagonal is ``intra_ms``."""
        regions = list(regions)
        idx = {r: i for i, r in enumerate(regions)}
        m = [[intra_ms if i == j else math.nan for j in range(len(regions))] for i in range(len(regions))]
        for (a, b), v in pairs.items():
            for r in (a, b):
                if r not in idx:
                    raise ValueError(f"unknown region {r!r} in pairs; regions: {regions}")
            m[idx[a]][idx[b]] = m[idx[b]][idx[a]] = float(v)
        for i, a in enumerate(regions):
            for j, b in enumerate(regions):
                if math.isnan(m[i][j]):
                    raise ValueError(f"no RTT given for {a!r}<->{b!r}")
        return cls(regions, m)

    @classmethod
    def from_csv(cls, path: str | Path, mapping: Mapping[str, str] | None = None, *,
                 symmetrize: str = "mean") -> "RegionNetwork":
        """From a ``src_region,dst_region,avg_rtt_ms`` CSV.

        ``mapping`` = {our region name: CSV region name}; ``None`` keeps all CSV regions under their
        own names. Asymmetric pairs are averaged (``symmetrize="mean"``) or rejected (``"error"``);
        the IBM table is asymmetric for some pairs (e.g. London->Tokyo vs Tokyo->London), not for the default three.
        """
        p = Path(path)
        if not p.exists():
            raise ValueError(f"{p}: file not found")
        table: dict[tuple[str, str], float] = {}
        with open(p, encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or [h.strip() for h in header] != ["src_region", "dst_region", "avg_rtt_ms"]:
                raise ValueError(f"{p}:1: expected header src_region,dst_region,avg_rtt_ms, got {header}")
            for lineno, row in enumerate(reader, 2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != 3:
                    raise ValueError(f"{p}:{lineno}: expected 3 columns, got {row!r}")
                try:
                    v = float(row[2])
                except ValueError:
                    raise ValueError(f"{p}:{lineno}: RTT {row[2]!r} is not a number") from None
                if not math.isfinite(v) or v < 0:
                    raise ValueError(f"{p}:{lineno}: RTT must be finite and >= 0, got {v}")
                table[(row[0].strip(), row[1].strip())] = v
        csv_regions = sorted({a for a, _ in table} | {b for _, b in table})
        mapping = dict(mapping) if mapping is not None else {r: r for r in csv_regions}
        unknown = [c for c in mapping.values() if c not in csv_regions]
        if unknown:
            raise ValueError(f"{p}: regions {unknown} not in the CSV; it has {csv_regions}")
        names = list(mapping)
        m = []
        for a in names:
            row = []
            for b in names:
                ca, cb = mapping[a], mapping[b]
                if ca == cb:
                    row.append(table.get((ca, cb), 0.0))
                    continue
                fwd, back = table.get((ca, cb)), table.get((cb, ca))
                if fwd is None and back is None:
                    raise ValueError(f"{p}: no RTT for {ca!r}<->{cb!r}")
                if fwd is not None and back is not None and fwd != back:
                    if symmetrize == "error":
                        raise ValueError(f"{p}: asymmetric RTT {ca!r}->{cb!r}={fwd}, back={back}")
                    row.append((fwd + back) / 2)
                else:
                    row.append(fwd if fwd is not None else back)
            m.append(row)
        return cls(names, m)

    @classmethod
    def default(cls) -> "RegionNetwork":
        """us / eu / asia = IBM Cloud Washington DC / Frankfurt / Tokyo (shipped CSV)."""
        return cls.from_csv(IBM_RTT_CSV, DEFAULT_MAPPING)

    @classmethod
    def gorgo(cls, germany_israel_ms: float = 60.0, intra_ms: float = 0.0) -> "RegionNetwork":
        """GORGO's us-west / germany / israel (paper: 281 and 183 ms from US-West; germany-israel assumed).

        ``intra_ms``: pass ``GORGO_LOCAL_MS`` (3 ms, the paper's US-West local latency) to model it.
        """
        pairs = dict(GORGO_RTT_MS)
        pairs[("germany", "israel")] = germany_israel_ms
        return cls.from_pairs(["us-west", "germany", "israel"], pairs, intra_ms=intra_ms)

    # ------------------------------------------------------------------ queries
    @property
    def regions(self) -> list[str]:
        return list(self._regions)

    def _i(self, r: str) -> int:
        try:
            return self._idx[r]
        except KeyError:
            raise ValueError(f"unknown region {r!r}; known: {self._regions}") from None

    def rtt_ms(self, a: str, b: str) -> float:
        return self._m[self._i(a)][self._i(b)]

    def rtt_s(self, a: str, b: str) -> float:
        return self.rtt_ms(a, b) / 1000.0

    def one_way_s(self, a: str, b: str) -> float:
        return self.rtt_s(a, b) / 2.0

    def nearest(self, region: str, candidates: Iterable[str]) -> str:
        """The candidate with the smallest RTT from ``region`` (ties: first in ``candidates``)."""
        cands = list(candidates)
        if not cands:
            raise ValueError("nearest: no candidates")
        return min(cands, key=lambda c: self.rtt_ms(region, c))  # min is stable: first wins ties

    def __contains__(self, region: object) -> bool:
        return region in self._idx

    def __repr__(self) -> str:
        pairs = ", ".join(f"{a}-{b}={self._m[i][j]:g}ms" for i, a in enumerate(self._regions)
                          for j, b in enumerate(self._regions) if i < j)
        return f"RegionNetwork({pairs})"
