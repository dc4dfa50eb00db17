"""The one interface of layer 1's peer choice: :class:`PeerSelector`.

A :class:`~ray_geolb.policy.region.router.RegionRouter` asks its selector only when the local layer
found no available replica and at least one peer is available (fresh heartbeat, a free replica, an
LB queue no longer than ``tau``, allowed for the request). ``TwoLayerConfig.remote`` names the
selector (the table is ``router.PEER_SELECTORS``):

==========  =========================================================  ======================
remote      choice                                                     file
==========  =========================================================  ======================
prefix      SkyLB: longest prefix already forwarded there, else nearest  ``prefix_selector.py``
ring        SkyLB-CH: a hash ring over the regions                     ``ring_selector.py``
nearest     the lowest heartbeat RTT                                   ``nearest_selector.py``
cost        GORGO / GeoPrefix: TTFT cost of each peer vs. staying      ``cost_selector.py``
==========  =========================================================  ======================

RTT sources (unchanged by the move into this package; the router owns both): SkyLB's selectors read
the RTT of the peer's heartbeat (:meth:`RegionRouter.heartbeat_rtt`); the cost selector reads the
router's own measurement (:meth:`RegionRouter.measured_rtt`, an EWMA of ``observe_rtt`` samples),
else the heartbeat's, else ``unknown_rtt_s``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, List, Optional, Tuple

__all__ = ["PeerSelector", "Selection", "nearest_by_heartbeat_rtt"]

#: (peer region, matched prefix chars there, reason); region None: hold the request here
Selection = Tuple[Optional[str], int, str]


class PeerSelector(ABC):
    """Picks the peer region a request is forwarded to (or, for the cost selector, decides to hold)."""

    @abstractmethod
    def select(self, router, req, peers: List[str], now: float) -> Selection:
        """``router``: the asking RegionRouter (peer table, snapshot, ring, RTTs, local layer); ``peers``:
        the available peers, non-empty, in peer-table order."""


def nearest_by_heartbeat_rtt(router, regions: Iterable[str]) -> str:
    """The region with the lowest heartbeat RTT (unknown RTT: last), ties by name."""
    inf = float("inf")

    def key(r):
        v = router.heartbeat_rtt(r)
        return (v if v is not None else inf, r)

    return min(regions, key=key)
