"""Pydantic models shared by the policies' configs (no registry: names map to classes in ``factory.py``).

Each algorithm declares ``Config`` (a subclass of :class:`PolicyConfig` whose ``name`` is a literal)
and parses it itself (:meth:`Policy.parse_config <ray_geolb.policy.base.Policy.parse_config>`).
Invalid values raise a pydantic ``ValidationError`` naming the field (e.g. ``prefix.block_chars``).
"""

from __future__ import annotations

from typing import Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .prefix_index import PrefixIndex

__all__ = ["AvailabilityConfig", "PrefixIndexConfig", "PolicyConfig"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AvailabilityConfig(_Strict):
    """Selective pushing (see ``availability.py``). ``mode=None`` means the algorithm's own default."""

    mode: Optional[Literal["bp", "sp-o", "sp-p"]] = None
    max_outstanding: int = Field(8, ge=1, description="SP-O: cap on router-side in-flight requests per replica")
    unknown_headroom: int = Field(1, ge=1, description="SP-P: requests a replica may take per report when the report "
                                                       "has no capacity fields")
    max_burst: Optional[int] = Field(None, ge=1, description="SP-P: safety cap on requests sent to one replica "
                                                             "between two reports (None: the algorithm's "
                                                             "default, 32)")
    seen_margin_s: float = Field(0.0, ge=0.0, description="SP-P: a request dispatched less than this before a report "
                                                          "was measured is not assumed to be counted by it (0 in the "
                                                          "simulator, where reports are exact; GeoPrefixRouter "
                                                          "defaults it to 0.05 s for the API-server/transport delay)")
    stale_report_s: Optional[float] = Field(5.0, gt=0.0, description="SP-P: a report that says requests wait is "
                                                                      "ignored once its figures have not changed for "
                                                                      "this long while this router had nothing in "
                                                                      "flight at that replica (a frozen report of an "
                                                                      "idle engine); None: always trusted")
    pending_allowance: Optional[int] = Field(
        None, ge=0, le=1024,
        description="SP-P: a report with at most this many requests waiting still grants slots (less the waiting "
                    "ones); 0 = SkyLB's rule, anything waiting holds new requests at the router until the next "
                    "report (None: the algorithm's default, 0; GeoPrefix 8)")
    prefill_budget_reports: Optional[float] = Field(
        None, gt=0.0, allow_inf_nan=False,
        description="SP-P's unreported-work cap: a replica takes no new request once the uncached prompt tokens sent "
                    "to it since its last report reach this many report intervals of prefill at its rate (a cost "
                    "policy's fitted t_p; other policies: no cap); None: off")
    gate: Literal["replica", "region"] = Field(
        "replica",
        description="SP-P: 'replica' (SkyLB's rule): a request goes only to a replica with a slot left; 'region': "
                    "the router still holds every request while no replica has a slot left, but while one has, the "
                    "policy picks among every replica with room (KV budget, and several routers' fixed part of the "
                    "slots), a replica past max_burst or the waiting allowance priced by its queue; such a send "
                    "spends a slot of the replica with the most, so the region sends no more than its slots")
    slots_by_uncached_share: Optional[bool] = Field(
        None,
        description="SP-P: a request spends the share of its prompt a replica does not hold of a report's slot (at "
                    "least 1/4), so a replica holding many conversations keeps taking their turns at a peak; a new "
                    "prompt spends a whole slot (False: one slot per request, SkyLB's rule; None: the algorithm's "
                    "default, False; GeoPrefix True)")
    request_tokens: int = Field(1024, ge=1, description="SP-P: a typical request's KV tokens: spent per dispatch when "
                                                        "its prompt size is unknown, and the least KV budget a replica "
                                                        "must have left to stay available")


class PrefixIndexConfig(_Strict):
    block_chars: int = Field(64, ge=1, description="first block size (bytes of canonical text)")
    growth: float = Field(0.125, ge=0.0, le=1.0,
                          description="later blocks are this fraction of their offset (0: fixed blocks)")
    max_nodes: Optional[int] = Field(200_000, ge=1, description="global node budget (None: no node bound)")
    max_chars: Optional[int] = Field(None, ge=1, description="global budget of stored characters summed over targets")
    max_entries: Optional[int] = Field(1_000_000, ge=1, description="global budget of (node, target) entries: what "
                                                                    "the index's memory grows with (~0.3 KB each) "
                                                                    "when many targets share nodes (None: no entry "
                                                                    "bound)")
    store_text: bool = Field(False, description="keep raw block text (debugging); False keeps hashes only")

    def build(self, clock: Callable[[], float] = None) -> PrefixIndex:
        kw = {} if clock is None else {"clock": clock}
        return PrefixIndex(self.block_chars, self.growth, self.max_nodes, self.max_chars, self.store_text,
                           max_entries=self.max_entries, **kw)


class PolicyConfig(_Strict):
    name: str
    seed: int = Field(0, description="seed of the policy's tie-breaking random generator")
    availability: AvailabilityConfig = AvailabilityConfig()
