"""What layer 1 (the region layer) may ask of layer 2 (the local policy): :class:`LocalLayer`.

A :class:`~ray_geolb.policy.region.router.RegionRouter` and its peer selectors read the local layer
through these members only -- no attribute probing, no private calls. Two kinds of objects
implement it:

* every :class:`~ray_geolb.policy.base.Policy` (the simulator hands its RegionRouter the policy
  itself); the base class gives the documented defaults, the cost policies override them;
* the Serve ingress's local view (``LocalView`` in ``ray_geolb/serve/ingress/local_view.py``), which answers
  from the frozen snapshot the model deployment's router publishes after each event
  (``ray_geolb/serve/router_snapshot.py``): ``choose`` from its free slots, everything else from its
  per-replica load, pooled ``t_p`` and prefix index.

``LocalLoad`` is the part of the policy's :class:`~ray_geolb.policy.availability.LoadTracker` the
region layer reads.
"""

from __future__ import annotations

from typing import Collection, Hashable, Iterable, Optional, Protocol, Sequence, Tuple, runtime_checkable

from ..availability import ReplicaStats
from ..base import Decision, RouteRequest
from ..prefix_index import PrefixIndex

__all__ = ["LocalLoad", "LocalLayer"]


@runtime_checkable
class LocalLoad(Protocol):
    """Load of the local replicas (a ``LoadTracker``, or the ingress's ``TrackerView``)."""

    @property
    def available(self) -> Collection[Hashable]:
        """The replicas a request could be sent to now (only its size and emptiness are read)."""

    def stats(self, target: Hashable) -> Optional[ReplicaStats]:
        """The replica's last report, or None."""

    def unseen(self, target: Hashable) -> int:
        """Requests dispatched to ``target`` after its last report (which cannot count them)."""

    def outstanding(self, target: Hashable) -> int:
        """Requests this router has in flight at ``target``."""

    @property
    def share(self) -> Tuple[int, int]:
        """``(rank, n)``: this router is one of ``n`` that share the replicas (``LoadTracker.set_share``)."""


@runtime_checkable
class LocalLayer(Protocol):
    """The local layer as the region layer sees it.

    Defaults (``Policy``): ``index`` None (no prefix index), ``mean_prompt_tokens`` None (not
    tracked), ``infers_replies`` False, ``region_t_p()`` None (no TTFT model) and ``queued_tokens(t)``
    None (not estimated); for each None the cost selector takes its documented fallback (no local match;
    the request's own prompt length; its own prior t_p; reported waiting × mean prompt + unseen × mean
    prompt).
    """

    @property
    def targets(self) -> Sequence[Hashable]:
        """This region's replicas."""

    @property
    def tracker(self) -> LocalLoad:
        """Their load."""

    @property
    def index(self) -> Optional[PrefixIndex]:
        """The prefix index of what this LB sent to its replicas, or None."""

    @property
    def mean_prompt_tokens(self) -> Optional[float]:
        """The mean prompt length this policy has seen (tokens), or None."""

    @property
    def infers_replies(self) -> bool:
        """Whether a match covering a chat's previous turn counts its reply too (``matching.through_reply``);
        the region layer's local and peer matches follow the local policy (``Policy.infers_replies``)."""

    def choose(self, req: RouteRequest, now: float,
               candidates: Optional[Iterable[Hashable]] = None) -> Optional[Decision]:
        """A local replica for ``req`` now, or None: no local replica is available."""

    def on_dispatch(self, req: RouteRequest, target: Hashable, now: float) -> None:
        """``req`` was sent to local replica ``target``."""

    def region_t_p(self) -> Optional[float]:
        """Seconds per prefill token on this region's replicas as the policy prices them (its pooled
        fit, floor applied), or None without a TTFT model. Also advertised to peers (``t_p_s``)."""

    def queued_tokens(self, target: Hashable) -> Optional[float]:
        """Prefill tokens queued ahead of a new request at ``target``, or None if not estimated."""
