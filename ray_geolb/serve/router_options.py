"""GeoPrefixRouter's ``request_router_kwargs``: their checks, and the headroom share of a router that
runs in one of several replicas (e.g. two ingress replicas of a region, each with its own router over
the same model replicas)."""

from __future__ import annotations

from ray import serve

__all__ = ["KWARGS", "check_kwargs", "check_share", "holder_share"]

KWARGS = ("policy", "region", "queue_bound", "queue_bound_tokens", "wait_limit_s", "retry_after_s", "error_delivery",
           "decision_log_size", "stats_seen_margin_s", "headroom_share", "load_signal_grace_s", "reconcile_after_s")


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


def check_share(share):
    if share in ("auto", None, "none"):
        return None if share == "none" else share
    if isinstance(share, (list, tuple)) and len(share) == 2 and all(isinstance(x, int) for x in share) \
            and 0 <= share[0] < share[1]:
        return tuple(share)
    raise ValueError(f"GeoPrefixRouter: headroom_share must be 'auto', 'none' or [rank, n] with 0 <= rank < n, "
                     f"got {share!r}")


def check_kwargs(unknown: dict, queue_bound, wait_limit_s, error_delivery, region) -> None:
    """``request_router_kwargs`` errors, each naming the bad key (raised from ``initialize_state``)."""
    if unknown:
        raise ValueError(
            f"GeoPrefixRouter: unknown request_router_kwargs {sorted(unknown)}; known: {', '.join(KWARGS)}")
    if queue_bound is not None and (not isinstance(queue_bound, int) or queue_bound < 1):
        raise ValueError(f"GeoPrefixRouter: queue_bound must be a positive int or None, got {queue_bound!r}")
    if wait_limit_s is not None and not (isinstance(wait_limit_s, (int, float)) and wait_limit_s > 0):
        raise ValueError(f"GeoPrefixRouter: wait_limit_s must be > 0 or None, got {wait_limit_s!r}")
    if error_delivery not in ("wrap", "future"):
        raise ValueError(f"GeoPrefixRouter: error_delivery must be 'wrap' or 'future', got {error_delivery!r}")
    if region is not None and (not isinstance(region, str) or not region):
        raise ValueError(f"GeoPrefixRouter: region must be a non-empty string or None, got {region!r}")
