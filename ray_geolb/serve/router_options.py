"""GeoPrefixRouter's ``request_router_kwargs`` as one typed model (:class:`RouterOptions`), and the
headroom share of a router that runs in one of several replicas (e.g. two ingress replicas of a
region, each with its own router over the same model replicas).

Ray cloudpickles the router module by value: this module stays light (pydantic and ``ray.serve``)."""

from __future__ import annotations

from typing import Any, Dict, Literal, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator
from ray import serve
from typing_extensions import Annotated

__all__ = ["RouterOptions", "holder_share"]

_PosInt = Annotated[int, Field(ge=1, strict=True)]
_PosFloat = Annotated[float, Field(gt=0, strict=True)]


class RouterOptions(BaseModel):
    """``request_router_kwargs`` of :class:`~ray_geolb.serve.router.GeoPrefixRouter`, validated once
    in ``initialize_state``. A bad option raises a ``ValueError`` (pydantic's ``ValidationError``)
    naming the key; an unknown key names itself and the known ones."""

    model_config = ConfigDict(frozen=True, extra="forbid", title="GeoPrefixRouter request_router_kwargs")

    policy: Union[StrictStr, Dict[str, Any], BaseModel, None] = Field(
        None, description="A ray_geolb policy name, a config dict or a policy config (checked by build_policy); "
                          "None = the router's DEFAULT_POLICY (geoprefix).")
    region: Optional[Annotated[str, Field(min_length=1, strict=True)]] = Field(
        None, description="This router's region: replicas whose replica_metadata['region'] differs are not "
                          "candidates (None = every replica is local).")
    queue_bound: Optional[_PosInt] = Field(
        1024, description="Requests waiting in the router (Ray's queue and the hold queue) before an arrival "
                          "is refused with RouterQueueFull; None = no bound.")
    queue_bound_tokens: Optional[_PosInt] = Field(
        None, description="Prompt tokens waiting in the router before an arrival is refused with "
                          "RouterQueueFull; None = no bound.")
    wait_limit_s: Optional[_PosFloat] = Field(
        60.0, description="Seconds a request may wait for an available replica before RouterWaitTimeout; "
                          "None = no limit.")
    retry_after_s: Annotated[float, Field(ge=0, strict=True)] = Field(
        1.0, description="Retry-After (s) carried by RouterQueueFull and RouterWaitTimeout.")
    error_delivery: Literal["wrap", "future"] = Field(
        "wrap", description="How a wait timeout reaches the caller: 'wrap' (the router's own timeout around "
                            "the routing task) or 'future' (set on the pending request's future).")
    decision_log_size: Annotated[int, Field(ge=0, strict=True)] = Field(
        10_000, description="Routing decisions (and reconciled records) kept for inspection.")
    stats_seen_margin_s: Annotated[float, Field(ge=0, strict=True)] = Field(
        0.05, description="Transport margin (s): a request dispatched less than this before a replica report "
                          "was measured does not count as seen by it (unless the policy config sets "
                          "seen_margin_s).")
    headroom_share: Union[Literal["auto"], Tuple[int, int], None] = Field(
        "auto", description="'auto' (1/N of each report's headroom, rank and N from the Serve replica "
                            "context), 'none' (all of it; stored as None) or [rank, n] with 0 <= rank < n.")
    load_signal_grace_s: _PosFloat = Field(
        30.0, description="Seconds a replica may report no load field (num_waiting / num_running) before "
                          "it is named once and counted in counters['no_load_signal'].")
    reconcile_after_s: Optional[_PosFloat] = Field(
        2.0, description="An idle-engine report releases in-flight records routed to that replica more than "
                         "this long before it (counters['reconciled']); None = off.")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = [f.alias or name for name, f in cls.model_fields.items()]
            unknown = sorted(k for k in data if k not in known)
            if unknown:
                raise ValueError(f"GeoPrefixRouter: unknown request_router_kwargs {unknown}; "
                                 f"known: {', '.join(known)}")
        return data

    @field_validator("headroom_share", mode="before")
    @classmethod
    def _share(cls, share: Any) -> Any:
        if share in ("auto", None, "none"):
            return None if share == "none" else share
        if isinstance(share, (list, tuple)) and len(share) == 2 \
                and all(isinstance(x, int) and not isinstance(x, bool) for x in share) and 0 <= share[0] < share[1]:
            return tuple(share)
        raise ValueError(f"GeoPrefixRouter: headroom_share must be 'auto', 'none' or [rank, n] with "
                         f"0 <= rank < n, got {share!r}")


def holder_share():
    """(rank, world size) of the Serve replica this router runs in (None outside a replica)."""
    try:
        ctx = serve.get_replica_context()
    except Exception:  # noqa: BLE001 - a driver or the HTTP proxy: the only router of its kind
        return None
    rank = getattr(ctx.rank, "rank", ctx.rank)
    n = int(getattr(ctx, "world_size", 1) or 1)
    if not isinstance(rank, int) or not 0 <= rank < n:
        return None
    return rank, n
