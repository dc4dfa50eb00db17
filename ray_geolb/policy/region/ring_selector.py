"""``remote="ring"`` (SkyLB-CH's region layer): a consistent-hash ring over the peer regions, keyed by
the session key (else the first 256 characters of the prompt), walking past unavailable peers.
The ring is the router's (``RegionRouter.ring``: a peer joins it with its first heartbeat)."""

from __future__ import annotations

from .peer_selector import PeerSelector, Selection

__all__ = ["RingSelector"]


class RingSelector(PeerSelector):
    def select(self, router, req, peers, now) -> Selection:
        key = req.session_key or req.text[:256]
        return router.ring.next_available(key, set(peers)), 0, "ring"
