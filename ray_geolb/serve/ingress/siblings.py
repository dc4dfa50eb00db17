"""One affinity view for a region with several ingress replicas: :class:`SiblingChannel`, this replica's end
of the sibling-insert channel (``policy/region/sibling_inserts.py`` has the rows, the ring and the bounds).

Each ingress replica runs its own GeoPrefixRouter (layer 2) and RegionRouter (layer 1). When the region has
several (Serve's replica context says N > 1), each heartbeat to the primary registry carries this
replica's new inserts -- the router's dispatches (``GeoPrefixRouter.sibling_outbox``) and the region
layer's forwards (``RegionRouter.sibling_outbox``) -- and a cursor; the reply (``table["sibling_inserts"]``)
brings the sibling replicas' rows since that cursor. Forwards go into the regional snapshot here, on the
ingress's loop; dispatches go to the router's ``sibling_inbox``, which the router learns on its own loop
(``GeoPrefixRouter.publish``): nothing crosses threads but a ``deque``.

A row reaches a sibling within one heartbeat period plus two registry legs (``RegistryOptions.period_s``:
the sender's next tick, then the reader's). This replica's router is created with the first local request,
after the channel opened, so it keeps its dispatches' rows from its first one. Dispatch rows that arrive
before the router exists are dropped and counted.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from ray_geolb.policy.region import RegionRouter
from ray_geolb.policy.region.sibling_inserts import SiblingOutbox, learn_rows, take_rows
from ray_geolb.serve import open_sibling_channel
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.router_options import holder_share

__all__ = ["SiblingChannel"]


class SiblingChannel:
    """This ingress replica's end of the sibling channel (module docstring). ``geo_router()`` returns the
    GeoPrefixRouter of this process, or None; ``replicas()`` how many ingress replicas the region has."""

    def __init__(self, router: RegionRouter, geo_router: Callable[[], Optional[Any]],
                 replicas: Callable[[], int] = lambda: (holder_share() or (0, 1))[1], enabled: bool = True):
        self.router = router
        self.geo_router = geo_router
        self.replicas = replicas
        self.enabled = enabled
        self.cursor = None  # the registry's cursor of the last reply (None: from the ring's start)
        #: rows sent; rows learned (forwards here, dispatches passed to the router, which counts its own
        #: ``sibling_inserts_learned``); unusable (another geometry); dispatches before the router existed
        self.counts: Dict[str, int] = {"rows_sent": 0, "rows_learned": 0, "rows_unusable": 0,
                                       "rows_before_router": 0}
        if enabled:  # a router this process creates from now on keeps its first dispatches for the siblings
            open_sibling_channel()

    def active(self) -> bool:
        """True while the region has several ingress replicas (and sharing is on): re-read each heartbeat,
        so a region scaled to one replica stops sending, and one scaled out starts."""
        on = self.enabled and self.replicas() > 1
        if on and self.router.sibling_outbox is None:
            self.router.sibling_outbox = SiblingOutbox()
        elif not on:
            self.router.sibling_outbox = None
        geo = self.geo_router()
        if geo is not None:
            geo.sibling_outbox.enabled = on  # the router keeps its dispatches' rows only while they are taken
        return on

    def outgoing(self) -> Optional[dict]:
        """The heartbeat's fields: ``sibling_cursor`` and this replica's new rows (forwards, then the
        router's dispatches, at most ``MAX_ROWS_PER_HEARTBEAT``); None when the channel is not active."""
        if not self.active():
            return None
        geo = self.geo_router()
        rows = take_rows(self.router.sibling_outbox, None if geo is None else geo.sibling_outbox)
        self.counts["rows_sent"] += len(rows)
        return {"sibling_cursor": self.cursor, "sibling_inserts": rows}

    def incoming(self, reply) -> None:
        """The registry's reply for this replica: its new cursor, and the siblings' rows learned -- forwards
        here, dispatches passed to the router's ``sibling_inbox`` (dropped and counted before it exists)."""
        if not isinstance(reply, dict):
            return
        self.cursor = reply.get("cursor")
        rows = reply.get("rows") or ()
        geo = self.geo_router()
        if geo is None:
            self.counts["rows_before_router"] += sum(1 for row in rows if row[0] == "d")
            rows = [row for row in rows if row[0] == "f"]
        learned, unusable = learn_rows(rows, self.router, policy_now(),
                                       dispatch=None if geo is None else geo.sibling_inbox.append)
        self.counts["rows_learned"] += learned
        self.counts["rows_unusable"] += unusable
        if geo is not None and rows:
            geo.publish_soon_threadsafe()
