"""``remote="prefix"`` (SkyLB §4.1): the regional snapshot -- the peer this LB already forwarded the
longest prefix of the request to (ties: lower heartbeat RTT, then name); no match: the nearest peer.

The snapshot is the router's (``RegionRouter.snapshot``, filled by ``on_forward`` in every mode);
the request's text is hashed for it once (``req.prepared_for(router.snapshot)``)."""

from __future__ import annotations

from .peer_selector import PeerSelector, Selection, nearest_by_heartbeat_rtt

__all__ = ["PrefixSelector"]


class PrefixSelector(PeerSelector):
    def select(self, router, req, peers, now) -> Selection:
        best, matched = router.snapshot.longest(req.prepared_for(router.snapshot), peers)
        if best:
            return nearest_by_heartbeat_rtt(router, best), matched, "snapshot"
        return nearest_by_heartbeat_rtt(router, peers), 0, "nearest"
