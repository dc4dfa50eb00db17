"""What others read of a GeoPrefixRouter (the region ingress's ``LocalView``, heartbeats, leak checks,
tests): counts and figures of its request book, replica set and policy. Read-only and safe to call from
another thread: each figure is read whole, and nothing here changes state.

A mixin of :class:`~ray_geolb.serve.router.GeoPrefixRouter`; it reads ``policy``, ``book``,
``replicas``, ``region`` and ``queue_len()``.
"""

from __future__ import annotations

from typing import List, Optional

from ray_geolb.serve.clock import policy_now

__all__ = ["RouterViews"]


class RouterViews:
    """See the module docstring."""

    def held_len(self) -> int:
        return len(self.book.held)

    def num_local_replicas(self) -> int:
        return len(self.replicas.local_ids)

    def num_available(self) -> int:
        return len(self.policy.tracker.available)

    def free_slots(self) -> int:
        """Requests the policy may still place before it needs newer reports (``LoadTracker.free_slots``)."""
        return self.policy.tracker.free_slots()

    def queued_tokens(self) -> float:
        """Prompt tokens of the requests waiting in this router: held ones by their size, those Ray
        has not handed to ``choose_replicas`` yet at the policy's mean prompt length (the region
        layer's ``Q_lb``). Safe to call from another thread (the held queue's count and token sum
        are each read whole)."""
        held = self.book.held
        n = len(held)
        tok = float(held.tokens)
        rest = self.queue_len() - n
        if rest > 0:
            mean = self.policy.mean_prompt_tokens
            tok += rest * float(mean or self.policy.tracker.request_tokens)
        return tok

    def heartbeat_info(self) -> dict:
        return {
            "region": self.region,
            "available_replicas": self.num_available(),
            "queue_len": self.queue_len(),
            "local_replicas": self.num_local_replicas(),
            "timestamp": policy_now(),
        }

    def decision(self, request_id: str) -> Optional[dict]:
        """Routing decision of a request, by Serve ``request_id`` or ``internal_request_id``."""
        return self.book.decisions.get(request_id)

    def local_replica_ids(self) -> List[str]:
        return list(self.replicas.local_ids)

    def accounting(self) -> dict:
        """What requests hold in this router right now (leak checks; any thread). Idle values: every
        count 0, ``unavailable`` 0 once fresh reports arrived, ``engines`` all ``[0, 0]``."""
        tr = self.policy.tracker
        book = self.book
        return {
            "router_pending": self.queue_len(),  # Ray's pending requests for this deployment
            "router_entries": len(book.entries),  # requests choose_replicas saw, not yet routed
            "router_held": len(book.held),
            "router_inflight": len(book.inflight),  # routed, not completed
            "tracker_outstanding": tr.total_outstanding(),  # reservations + in flight, per policy
            "unavailable": len(self.replicas.local_ids) - len(tr.available),
            "distrusted_reports": tr.distrusted_reports,
            "engines": self.replicas.reported_load(),
            # the oldest few in-flight requests ([request id, replica]): what a leak holds
            "oldest_inflight": book.oldest_inflight(3),
            # the prefix tree's nodes (bounded by the policy's prefix.max_nodes): what memory holds
            "index_nodes": getattr(getattr(self.policy, "index", None), "num_nodes", None),
        }
