"""The TTFT-SLO guard on forwards before saturation (:class:`SloGuard`, ``TwoLayerConfig.ttft_slo_s``).

The 'cost' selector's prices rank the choices; they are not TTFTs. Its stay price includes what a
long prefill costs the requests in flight beside it (``w_shared``), and its own-TTFT part overestimates
the realized TTFT 2-3x on the engine model (``benchmarks/RESULTS.md`` section 29). So on its own, the
rule forwards requests that would have met the SLO here, and the forward's RTT then misses it (at
P99 TTFT 0.3 s with GPUs to spare, every lost request was such a forward: section 27).

When the rule has chosen a forward before saturation, the guard compares two calibrated TTFTs and
keeps the request here when staying is expected to meet the SLO and the forward is expected to miss it.
(Otherwise the rule's choice stands: a forward expected to meet it, or a stay expected to miss it too,
is the rule's business -- its in-flight price is what balances loaded regions.)

* **The estimates** are the selector's own-TTFT parts, without the in-flight term: staying, the local
  queue ahead per replica plus the residual prefill, at the region's ``t_p``; forwarding, the peer's
  queue and residual prefill at its ``t_p`` (a home peer does not hold the prompt yet), plus the RTT.
* **The calibration** is what happened to requests that stayed here with a similar estimate: estimates
  fall into bins a factor ``sqrt(2)`` apart, and each bin keeps the realized TTFTs (dispatch to first
  token, as this LB saw them) of its last ``WINDOW`` stays; a bin with ``MIN_SAMPLES`` of them is read by
  its ``QUANTILE``. An unmeasured bin is read off its neighbours: no worse than the nearest measured bin
  above (a smaller estimate is not expected to do worse), and the nearest measured bin below scaled by
  ``estimate / its lower edge`` (realized TTFT taken to grow no faster than the estimate). A stay also
  meets when any bin of larger estimates does. A forward's peer part is read on the same bins (the peer
  runs the same engines; its own realized TTFTs are not seen here).
* **A region under pressure keeps nothing more.** The guard also reads the P99 of every local request's
  TTFT since it reached this LB (its wait here included: what the stays' own times cannot show, the wait
  they cause the requests behind them), over the last ``REGION_WINDOW``. While that misses the SLO,
  staying is not expected to meet it, and the rule decides.
* **Until a bin is measured** the guard says nothing: the rule decides as without a guard.

Tried and not kept (section 29): one multiplicative scale over all stays (its tail is set by the
smallest estimates, whose realized TTFT is mostly a fixed base latency: the guard never acted); also
keeping a request whose stay is expected to miss but to be faster than the forward (the SLO met at a
light load, lost requests doubled at a heavy one).

Cost per decision: a logarithm and a walk over at most ``BINS`` tail values; a bin's tail (and the
region's) is recomputed every ``REFRESH`` samples (a sort of ``WINDOW`` / ``REGION_WINDOW`` floats).
Memory: ``BINS × WINDOW + REGION_WINDOW`` floats and up to
``PENDING`` estimates awaiting their first token (the oldest are dropped: a request cancelled before
its first token leaves nothing behind). The Serve ingress sees a first token only in a stream, so there
non-streamed requests calibrate nothing and age out of that window.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Deque, List, Optional

__all__ = ["SloGuard"]

#: the quantile of realized TTFT a bin is judged by (the SLO is a P99 of TTFT)
QUANTILE = 0.99
#: realized TTFTs a bin keeps (its newest)
WINDOW = 128
#: samples a bin needs before it is read
MIN_SAMPLES = 32
#: new samples in a bin between two recomputations of its tail
REFRESH = 16
#: estimate bins: bin k holds estimates in [FLOOR_S * 2**(k/2), FLOOR_S * 2**((k+1)/2)), the last one the rest
BINS = 24
#: the smallest estimate told apart (s): 10 ms, so the bins reach FLOOR_S * 2**12 ~ 41 s
FLOOR_S = 0.01
#: local requests (stays or not, held at the LB or not) whose TTFT since arrival the region's tail is read on
REGION_WINDOW = 256
#: estimates kept while their requests wait for a first token
PENDING = 4096


def _bin(estimate_s: float) -> int:
    if not estimate_s > FLOOR_S:
        return 0
    return min(BINS - 1, int(2.0 * math.log2(estimate_s / FLOOR_S)))


def _quantile(values) -> float:
    """The ``QUANTILE`` of ``values`` (the order statistic at that rank; non-empty)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(QUANTILE * len(s)))]


def _lower_edge(b: int) -> float:
    return FLOOR_S * 2.0 ** (b / 2.0)


class SloGuard:
    """See the module docstring. ``slo_s``: the P99 TTFT target (seconds, > 0)."""

    def __init__(self, slo_s: float):
        if not (isinstance(slo_s, (int, float)) and math.isfinite(slo_s) and slo_s > 0):
            raise ValueError(f"ttft_slo_s must be a positive finite number of seconds, got {slo_s!r}")
        self.slo_s = float(slo_s)
        self._pending: "OrderedDict[str, int]" = OrderedDict()  # request id -> its estimate's bin
        self._realized: List[Deque[float]] = [deque(maxlen=WINDOW) for _ in range(BINS)]
        self._fresh = [0] * BINS
        #: per bin, its QUANTILE of realized TTFT (None: fewer than MIN_SAMPLES samples)
        self.tail: List[Optional[float]] = [None] * BINS
        self._region: Deque[float] = deque(maxlen=REGION_WINDOW)  # every local request's TTFT since its arrival
        self._region_fresh = 0
        self.region_tail: Optional[float] = None
        self.kept = 0  # forwards the cost rule chose that the guard kept here (the selector counts them)

    def predict(self, estimate_s: float) -> Optional[float]:
        """The expected ``QUANTILE`` of realized TTFT of a stay with this own-TTFT estimate: its bin's tail;
        with its bin unmeasured, the smaller of the nearest measured bin's above (a smaller estimate is not
        expected to do worse) and the nearest measured bin's below scaled by ``estimate / that bin's lower
        edge``; None while no bin is measured."""
        b = _bin(estimate_s)
        tail = self.tail
        if tail[b] is not None:
            return tail[b]
        above = next((t for t in tail[b + 1:] if t is not None), None)
        below = next((t * max(FLOOR_S, estimate_s) / _lower_edge(j)
                      for j in range(b - 1, -1, -1) if (t := tail[j]) is not None), None)
        return min((x for x in (above, below) if x is not None), default=None)

    def observe_region(self, ttft_s: float) -> None:
        """Any local request's first token, ``ttft_s`` after it reached this LB (its wait here included): the
        region's own tail (``region_tail``), read by :meth:`meets`."""
        if not (isinstance(ttft_s, (int, float)) and math.isfinite(ttft_s) and ttft_s >= 0):
            return
        w = self._region
        w.append(float(ttft_s))
        self._region_fresh += 1
        if len(w) >= MIN_SAMPLES and (self.region_tail is None or self._region_fresh >= REFRESH):
            self.region_tail = _quantile(w)
            self._region_fresh = 0

    def meets(self, estimate_s: float) -> bool:
        """True if a stay with this own-TTFT estimate is expected to meet the SLO: :meth:`predict` says so,
        or a bin of larger estimates has a measured tail within it (a larger estimate is not expected to do
        better). False while nothing is measured."""
        slo = self.slo_s
        if self.region_tail is not None and self.region_tail > slo:
            return False  # this region already misses the SLO for its own requests: no more work kept here
        p = self.predict(estimate_s)
        if p is not None and p <= slo:
            return True
        return any(t is not None and t <= slo for t in self.tail[_bin(estimate_s) + 1:])

    def meets_after(self, estimate_s: float, rtt_s: float) -> bool:
        """True if a forward paying ``rtt_s`` and then a peer's own-TTFT ``estimate_s`` (calibrated as a
        stay here) is expected to meet the SLO; True while unmeasured (the guard then says nothing)."""
        p = self.predict(estimate_s)
        return p is None or rtt_s + p <= self.slo_s

    def note_stay(self, request_id: str, estimate_s: float) -> None:
        """A request stays with this estimate; :meth:`observe` pairs it with its first token."""
        p = self._pending
        p[request_id] = _bin(estimate_s)
        if len(p) > PENDING:
            p.popitem(last=False)

    def observe(self, request_id: str, ttft_s: float) -> None:
        """A stayed request's first token, ``ttft_s`` after its dispatch. Unknown ids are ignored (a request
        not decided before saturation, or dropped from the pending window)."""
        b = self._pending.pop(request_id, None)
        if b is None or not (isinstance(ttft_s, (int, float)) and math.isfinite(ttft_s) and ttft_s >= 0):
            return
        w = self._realized[b]
        w.append(float(ttft_s))
        self._fresh[b] += 1
        if len(w) >= MIN_SAMPLES and (self.tail[b] is None or self._fresh[b] >= REFRESH):
            self.tail[b] = _quantile(w)
            self._fresh[b] = 0
