"""Reading the registry's peer table: ``PeerState`` per peer region, dated on the reader's clock.

The Serve ingress (``serve/registry_client.py``, ``RegistryClient``) and the simulator's region LBs
read the table that :class:`~ray_geolb.policy.region.registry_state.RegistryState` makes with this one
function, so a peer's figures, age, RTT and prefix summary mean the same in both.
"""

from __future__ import annotations

from ray_geolb.policy.region.prefix_summary import PrefixSummary
from ray_geolb.policy.region.registry_state import logger, validate_extra
from ray_geolb.policy.region.router import PeerState

__all__ = ["peer_states_from_table"]


def peer_states_from_table(table: dict, made_at: float, own_region: str):
    """``PeerState`` objects for every other region of a registry table made at ``made_at`` on the
    caller's clock (the table's arrival less its way back, half the caller's registry round trip).

    ``timestamp`` = ``made_at - age_s``: when the peer measured its figures (``age_s`` counts from there
    when its heartbeat declared its delay to the registry, ``delay_s``); ``rtt_s`` = what *this* region
    measured to the peer (``rtts[own][peer]``), else the peer's measurement back, else None;
    ``prefix_summary`` = the peer's hash-only prefix summary (``prefix_summaries[peer]``), else None.
    """
    rtts = table.get("rtts", {})
    mine = rtts.get(own_region, {})
    out = []
    for region, e in table.get("regions", {}).items():
        if region == own_region:
            continue
        rtt = mine.get(region)
        if rtt is None:
            rtt = rtts.get(region, {}).get(own_region)
        extra = {"sources": e.get("sources", 0)}
        ex = e.get("extra")
        if ex:
            try:
                ex = validate_extra(ex, f"registry table regions[{region!r}].extra")
            except ValueError as err:  # a registry of another version: use the rest of the entry
                logger.warning("ignoring %s", err)
                ex = {}
            if isinstance(ex.get("replicas"), float) and ex["replicas"].is_integer():
                ex["replicas"] = int(ex["replicas"])  # the cost selector reads it as a count
            extra.update(ex)
        out.append(PeerState(region=region, available_replicas=int(e["available_replicas"]),
                             queue_len=int(e["queue_len"]),
                             timestamp=made_at - float(e["age_s"]),
                             rtt_s=rtt, extra=extra, prefix_summary=_summary(table, region)))
    return out


def _summary(table: dict, region: str):
    """The region's prefix summary from a registry table (``PrefixSummary``), or None (none sent, or
    malformed: a registry of another version; the rest of the entry is used)."""
    wire = (table.get("prefix_summaries") or {}).get(region)
    if wire is None:
        return None
    try:
        return PrefixSummary.from_wire(wire)
    except (ValueError, TypeError) as err:
        logger.warning("ignoring the prefix summary of %s: %s", region, err)
        return None
