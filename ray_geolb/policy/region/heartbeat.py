"""The one heartbeat message a region's LB sends to the registry: :func:`heartbeat_message`.

Built here for both drivers -- the Serve ingress (``serve/ingress/peers.py``: ``PeerMesh.heartbeat``, sent
by ``RegistryClient``) and the simulator's LB (``sim/region_lb.py``) -- so the registry reads the same
fields from both (``RegistryState.heartbeat_batch`` validates them).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

__all__ = ["heartbeat_message"]


def heartbeat_message(region: str, source: str, available_replicas: int, queue_len: int,
                      rtts: Mapping[str, float], extra: Optional[Mapping[str, Any]] = None,
                      prefix_summary: Optional[dict] = None, delay_s: Optional[float] = None) -> Dict[str, Any]:
    """This region's heartbeat: its figures (available replicas, LB queue length), the RTTs it measured to
    its peers (``RegionRouter.measured_rtts``), the cost selector's ``extra`` (left out when empty), its
    prefix summary in wire form when this heartbeat carries one (``SummarySendRule.wire``), and
    ``delay_s``, the one-way delay to the registry it declares (half its last registry round trip; left
    out until known -- ``RegistryClient`` adds it to the ingress's heartbeats)."""
    hb: Dict[str, Any] = {"region": region, "source": source, "available_replicas": available_replicas,
                          "queue_len": queue_len, "rtts": rtts}
    if delay_s is not None:
        hb["delay_s"] = delay_s
    if extra:
        hb["extra"] = dict(extra)
    if prefix_summary is not None:
        hb["prefix_summary"] = prefix_summary
    return hb
