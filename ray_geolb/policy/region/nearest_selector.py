"""``remote="nearest"``: forward to the available peer with the lowest heartbeat RTT."""

from __future__ import annotations

from .peer_selector import PeerSelector, Selection, nearest_by_heartbeat_rtt

__all__ = ["NearestSelector"]


class NearestSelector(PeerSelector):
    def select(self, router, req, peers, now) -> Selection:
        return nearest_by_heartbeat_rtt(router, peers), 0, "nearest"
