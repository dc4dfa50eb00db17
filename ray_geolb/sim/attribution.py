"""Where the lost requests' time went: :func:`attribute` splits each SLO miss's TTFT into its parts.

A request's TTFT in the simulator is the sum of

* ``lb_wait``: waiting in an LB's queue -- its home router's, and a peer's when it was forwarded (a
  per-region router holds a request when no local replica may take it; a central LB when none may);
* ``network``: the one-way delays on the way to the replica and the first token's way back (client -> LB,
  LB -> peer LB, LB -> replica; a central LB's clients cross the WAN to reach it);
* ``engine_queue``: waiting inside the replica's engine before its first step (vLLM's ``queued_s``): a
  replica granted more than it can start at once;
* ``prefill``: from its first scheduled step to its first token (vLLM's ``prefill_s``): its own uncached
  prompt tokens, and the steps it shares with the others in the batch;
* ``other``: the rest -- the engine's fixed per-request overhead, and a refused request's retry back-off.

A request *lost* at an SLO is one whose TTFT is over it, or one sent without a first token by the run's
cut-off (``missed``: counted, not split). A request still decoding at the cut-off has its TTFT
(``SimResult.unfinished``): it counts as answered (``completed``; ``decoding`` of them). For each run the
lost requests' seconds are summed per part, and each lost request is also counted under its largest part
(``dominant``), beside the same means over every answered request. Read from
:class:`~ray_geolb.sim.simulator.SimResult`'s ``requests`` and ``breakdown`` (and ``unfinished``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

__all__ = ["PARTS", "attribute", "merge", "attribution_rows"]

PARTS = ("lb_wait", "network", "engine_queue", "prefill", "other")


def _parts(rec: tuple, bd: tuple) -> Dict[str, float]:
    ttft, lb_wait = rec[1], rec[5]
    net, queued, prefill = bd[0], bd[1], bd[2]
    return {"lb_wait": lb_wait, "network": net, "engine_queue": queued, "prefill": prefill,
            "other": max(0.0, ttft - lb_wait - net - queued - prefill)}


def attribute(res, slo_ttft_s: float, sent: Optional[int] = None) -> Dict[str, Any]:
    """One run's attribution (module docstring). ``sent``: requests sent (None: the completed ones only)."""
    recs, bds = res.answered()  # field 2 (e2e or TPOT so far) is not read here
    decoding = res.unfinished or ()
    if len(bds) != len(recs):
        raise ValueError(f"attribute: {len(recs)} request records but {len(bds)} breakdowns "
                         "(run with keep_requests on)")
    lost = {p: 0.0 for p in PARTS}
    every = {p: 0.0 for p in PARTS}
    dominant = {p: 0 for p in PARTS}
    n_lost = n_lost_cross = 0
    uncached_lost = 0
    for rec, bd in zip(recs, bds):
        parts = _parts(rec, bd)
        for p, v in parts.items():
            every[p] += v
        if rec[1] > slo_ttft_s:
            n_lost += 1
            n_lost_cross += bool(rec[6])
            uncached_lost += bd[3]
            for p, v in parts.items():
                lost[p] += v
            dominant[max(PARTS, key=lambda p: parts[p])] += 1
    missed = max(0, (sent if sent is not None else len(recs)) - len(recs))
    return {"completed": len(recs), "decoding": len(decoding), "lost": n_lost, "lost_cross_region": n_lost_cross,
            "missed": missed, "lost_s": lost, "all_s": every, "dominant": dominant,
            "lost_uncached_tokens": uncached_lost}


def merge(items: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Several runs' attributions (e.g. one per seed) summed."""
    out: Dict[str, Any] = {"completed": 0, "decoding": 0, "lost": 0, "lost_cross_region": 0, "missed": 0,
                           "lost_s": {p: 0.0 for p in PARTS}, "all_s": {p: 0.0 for p in PARTS},
                           "dominant": {p: 0 for p in PARTS}, "lost_uncached_tokens": 0}
    for a in items:
        for k in ("completed", "decoding", "lost", "lost_cross_region", "missed", "lost_uncached_tokens"):
            out[k] += a.get(k, 0)
        for k in ("lost_s", "all_s", "dominant"):
            for p in PARTS:
                out[k][p] += a[k][p]
    return out


def attribution_rows(by_system: Dict[str, Dict[str, Any]]) -> List[List[str]]:
    """A table, one row per part: per system, the lost requests' mean seconds in it (its share of their
    TTFT), how many lost requests had it as their largest part, and every completed request's mean."""
    rows = [["part"] + [f"{s}: {h}" for s in by_system for h in ("lost mean s (share)", "largest in", "all mean s")]]
    for p in PARTS:
        row = [p]
        for a in by_system.values():
            n, c = a["lost"], a["completed"] or 1
            tot = sum(a["lost_s"].values()) or 1.0
            row += [f"{a['lost_s'][p] / n:.3f} ({a['lost_s'][p] / tot:.0%})" if n else "-",
                    str(a["dominant"][p]), f"{a['all_s'][p] / c:.3f}"]
        rows.append(row)
    rows.append(["lost (cross-region) / missed / answered"] + [
        x for a in by_system.values()
        for x in (f"{a['lost']} ({a['lost_cross_region']})", str(a["missed"]), str(a["completed"]))])
    return rows
