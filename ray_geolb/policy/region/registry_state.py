"""The registry's state: the cross-region view every region's LB shares (pure Python, no Ray).

:class:`RegistryState` (pure Python, unit-testable) holds, per region:

* **availability** -- available replicas, LB queue length, and when it was last heard, aggregated
  over the region's ingress replicas (``source``): available = max over fresh sources (they watch
  the same replicas), queue = sum over fresh sources;
* **heartbeat extras** -- the numbers the region layer's ``cost`` selector prices a peer by
  (``queued_tokens``, ``inflight``, ``t_p_s``, ``replicas``; validated: at most 16 finite numbers
  >= 0), aggregated the same way (queued tokens and in-flight summed, replicas max, others mean)
  and relayed to every peer as ``PeerState.extra``;
* **prefix summaries** -- each source's hash-only Bloom filter of the prefixes its replicas hold
  (``policy/region/prefix_summary.py``; at most ``max_summary_bytes`` of JSON, validated by
  ``PrefixSummary.from_wire``), sent when it changed and kept until replaced; the table relays, per
  region, the freshest source's (filters of different sizes cannot be merged) as
  ``prefix_summaries[region]``;
* **measured RTTs** -- ``rtts[src][dst]`` in seconds, as each ingress measured them (EWMA of pings);
* **regional snapshots** -- what the region forwarded to each peer, mirrored by bounded deltas (at
  most ``max_snapshot_rows`` rows per heartbeat; ``policy/region/snapshot_sync.py`` has both ends of the protocol),
  kept per source, trimmed to ``max_snapshot_nodes`` (most recently used nodes kept, parents before
  children), so a restarted ingress reloads its snapshot. A heartbeat's reply acknowledges the
  version it now holds for the sender (``snapshot_acks``);
* **sibling inserts** -- with several ingress replicas in a region, each one's recent prefix inserts as
  hash-only rows, in a bounded ring per region: a heartbeat carrying ``sibling_cursor`` appends its rows
  (``sibling_inserts``) and gets its siblings' since that cursor (``table["sibling_inserts"][source]``;
  ``policy/region/sibling_inserts.py`` has both ends).

Memory and replies are bounded, whatever heartbeats arrive:

* **names** -- a region name is 1-:data:`MAX_REGION_NAME` (64) characters of ``A-Z a-z 0-9 _ . : -``
  (the region layer's ``REGION_PATTERN``), a source name 1-:data:`MAX_SOURCE_NAME` (128) of the same
  plus ``/`` (an ingress replica is ``<region>/<replica id>``); anything else is refused with
  :class:`HeartbeatRefused` ``bad_name``, its name shown cut to 40 characters;
* **regions** -- with the deployment's region list (``regions``: ``app.py`` passes it, and
  :meth:`RegistryState.add_regions` adds a redeployment's), a heartbeat from any other region is refused
  (``unknown_region``), and RTTs to unknown peers are dropped. Without a list (a bare ``RegistryState``)
  any well-formed name is taken, up to ``max_regions``: a full registry refuses a *new* region
  (``registry_full``) and never evicts a live one; regions leave only by not being heard from for
  ``drop_after_s``. Sources likewise: at most ``max_sources_per_region`` per region, a new one refused
  (``sources_full``) while the region's live sources keep their places;
* **numbers** -- counts at most :data:`MAX_COUNT`, other figures finite and at most :data:`MAX_NUMBER`;
  at most :data:`MAX_BATCH_ITEMS` heartbeats per call, at most 10 error lines of at most
  :data:`MAX_ERROR_CHARS` characters in a reply;
* **capacity** -- a heartbeat is checked against what the registry knows of its region's size, so that
  a buggy or stale ingress cannot claim capacity its region does not have and pull a whole region's
  traffic (the cost selector prices a peer by its available replicas and ``replicas``):

  - a region's **registered** replica count is the ceiling of what its heartbeats may claim. It is
    registered with ``regions`` as a mapping ``{region: num_replicas}`` (at construction or by
    :meth:`RegistryState.add_regions`; the latest registration wins, a list of names leaves the counts
    as they are). A heartbeat claiming more available replicas than that, or a larger
    ``extra["replicas"]``, is refused (``over_capacity``): refused, not clamped -- its figures are
    wrong, and its source's last accepted ones stay until they age. The registered count is the one
    figure no heartbeat can raise. The heartbeats' own ``extra["replicas"]`` cannot serve as the ceiling
    of available replicas: a stale ingress's figures agree with each other, and holding a source to
    its siblings' last counts would refuse an honest scale-up until the figures age. So a region
    without a registered count is not capped (only by :data:`MAX_COUNT`): register the deployment's
    counts to have it capped;
  - its **queue figures** are held to sane bounds that scale with ``max(1, R)``, ``R`` the region's
    replica count as far as the registry knows it (:meth:`RegistryState.replica_ceiling`: the
    registered count, else the largest ``extra["replicas"]`` this heartbeat and the region's fresh
    sources report): ``queue_len`` at most ``max_queue_per_replica`` (10,000; an ingress queues at most
    ``max_queue``, 256 by default) per replica, ``extra["inflight"]`` at most
    ``max_inflight_per_replica`` (10,000) per replica, and ``extra["queued_tokens"]`` at most
    ``max_tokens_per_request`` (2,000,000, above any model's context) for each request those two allow.
    More is refused (``queue_out_of_bounds``). With ``R`` unknown (no count registered or reported)
    they are not checked: there is nothing to scale them by;
* **the table** -- so every reply is at most :meth:`RegistryState.table_bound_bytes` bytes of JSON:
  ``n * (PER_REGION_BYTES + max_summary_bytes + n * PER_RTT_BYTES) + FIXED_BYTES`` for ``n`` regions
  (the configured ones, else ``max_regions``): 67,121 bytes for three regions and the default 16 KB
  summaries (a real summary is under 3.6 KB), 1,562,658 bytes for a registry without a region list
  at the default ``max_regions`` 64.

A refusal is typed (:class:`HeartbeatRefused`, ``code`` one of :data:`REFUSAL_CODES`), counted
(``stats()["refused"]``), logged the first time per code (then every 10x), and named in the reply:
``errors`` (the lines) and ``refused`` (``{code: count}`` for this call).

Snapshots: at most ``max_snapshot_nodes`` rows per copy, a few copies per region.

Ages, not timestamps, are returned (``age_s`` on the registry's clock), so clock skew between nodes
does not matter. An age counts from when the source measured its figures: a heartbeat
declares its one-way delay to the registry (``delay_s``, half the sender's last registry round trip), and
the reader subtracts its own leg back (``RegistryClient``: the table's ``made_at`` for
``peer_states_from_table``, ``policy/region/peer_table.py``).

The Serve deployment runs it inside a Ray actor (``serve/registry.py``: ``RegionRegistry``), and the
simulator runs the same class in virtual time. What the optional secret does and does not
protect: ``serve/registry.py``.
"""


from __future__ import annotations

import hmac
import json
import logging
import math
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from pydantic import ValidationError

from ray_geolb.policy.region.heartbeat import (
    MAX_COUNT,
    MAX_DELAY_S,
    MAX_EXTRA_KEY_LEN,
    MAX_EXTRA_KEYS,
    MAX_NUMBER,
    MAX_REGION_NAME,
    MAX_SOURCE_NAME,
    Heartbeat,
    first_error,
    number_adapter,
    region_name_adapter,
    show,
    show_num,
    validate_extra,
)
from ray_geolb.policy.region.prefix_summary import PrefixSummary
from ray_geolb.policy.region.sibling_inserts import SiblingRing
from ray_geolb.policy.region.snapshot_sync import DEFAULT_MAX_ROWS, SnapshotStore, trim_snapshot

logger = logging.getLogger("ray_geolb.registry")

__all__ = [
    "HeartbeatRefused",
    "MAX_COUNT",
    "MAX_NUMBER",
    "MAX_REGION_NAME",
    "MAX_SOURCE_NAME",
    "REFUSAL_CODES",
    "RegistryState",
    "MAX_DELAY_S",
    "registry_leg",
    "SECRET_ENV",
    "trim_snapshot",
    "validate_extra",
    "validate_region_name",
]

#: the environment variable holding the deployment's registry secret (in every ingress replica's and
#: the registry actor's environment, e.g. the nodes' env or a runtime_env): when the registry has one,
#: only heartbeats that carry it (``token``) are applied. A guard against accidents (two deployments in
#: one namespace), not security: any process of the Ray cluster can read it (module docstring, "Trust")
SECRET_ENV = "GEOLB_REGISTRY_SECRET"

#: heartbeats per call (a client sends one), error lines per reply and their length
MAX_BATCH_ITEMS = 32
MAX_ERRORS = 10
MAX_ERROR_CHARS = 300
#: why a heartbeat was refused (``HeartbeatRefused.code``; a reply's ``refused`` counts them by code)
REFUSAL_CODES = ("bad_name", "unknown_region", "registry_full", "sources_full", "unauthenticated", "malformed",
                 "batch_too_large", "over_capacity", "queue_out_of_bounds")
#: the table's JSON size bound (``RegistryState.table_bound_bytes``), per part, for names and numbers at
#: their bounds. A region's entry: its name (64 + 4) and four figures (~110), and up to 16 extras of a
#: 64-character name and a number (16 * 93); one measured RTT (a peer's name + a number, 64 + 4 + 24);
#: the rest of a reply: the keys, uptime, up to MAX_BATCH_ITEMS snapshot acknowledgements (source name +
#: version) and MAX_ERRORS error lines, and the ``refused`` counts


class HeartbeatRefused(ValueError):
    """A heartbeat the registry refused, and why: ``code`` is one of :data:`REFUSAL_CODES`."""

    def __init__(self, code: str, message: str):
        assert code in REFUSAL_CODES, code
        super().__init__(f"{code}: {message}")
        self.code = code


def validate_region_name(name, what: str = "region") -> str:
    """A region name within the registry's bounds (``heartbeat.RegionName``: 1-:data:`MAX_REGION_NAME`
    characters matching ``REGION_PATTERN``), else :class:`HeartbeatRefused` ``bad_name``."""
    try:
        return region_name_adapter.validate_python(name)
    except ValidationError as e:
        raise HeartbeatRefused(*first_error(e, what, fields=0)) from None


#: the table's compact-JSON size bound (``RegistryState.table_bound_bytes``), by part, with every name and
#: number at its bound (a name: its characters + 3 for the quotes and colon; a number: at most 25).
#: Per region: its entry (name, four figures ~120, and MAX_EXTRA_KEYS extras of a 64-character name and a
#: number: 16 * 93), the key of its RTT row (70), its snapshot version (89) and the key of its prefix
#: summary (68) -- the summary itself is ``max_summary_bytes`` more:
PER_REGION_BYTES = (MAX_REGION_NAME + 3 + 120 + MAX_EXTRA_KEYS * (MAX_EXTRA_KEY_LEN + 3 + 26)) + 70 + 89 + 68
#: per measured RTT (a peer's name and a number): a region's row holds one per known peer
PER_RTT_BYTES = MAX_REGION_NAME + 3 + 26
#: the rest of a reply: its keys and uptime (~200), up to MAX_BATCH_ITEMS snapshot acknowledgements (a
#: source's name and a version), MAX_ERRORS error lines of MAX_ERROR_CHARS ASCII characters (each at most
#: doubled by JSON's escapes) and the ``refused`` counts (~300)
FIXED_BYTES = 200 + MAX_BATCH_ITEMS * (MAX_SOURCE_NAME + 3 + 22) + MAX_ERRORS * (2 * MAX_ERROR_CHARS + 3) + 300
#: how a numeric extra is combined over a region's fresh sources (ingress replicas); others: mean.
#: Each ingress replica has its own router (its own queue and in-flight requests) over the same
#: replicas: queues and in-flight counts add up, the replica count does not.
EXTRA_AGG = {"queued_tokens": "sum", "inflight": "sum", "replicas": "max"}


def registry_leg(round_trip_s: float) -> float:
    """A client's one-way delay to the registry from its last call's round trip: half of it (capped at
    :data:`MAX_DELAY_S`). Its next heartbeat declares it as ``delay_s``, and the table that call returned
    was made that long before it arrived (``RegistryClient``; the simulator's LB alike)."""
    return min(MAX_DELAY_S, max(0.0, round_trip_s) / 2.0)


def _aggregate_extra(extras: List[Dict[str, float]]) -> Dict[str, float]:
    keys = set()
    for e in extras:
        keys.update(e)
    out = {}
    for k in sorted(keys):
        vals = [e[k] for e in extras if k in e]
        how = EXTRA_AGG.get(k, "mean")
        out[k] = sum(vals) if how == "sum" else max(vals) if how == "max" else sum(vals) / len(vals)
    return out


def _finite_nonneg(x, what):
    """A registry setting: a finite number in [0, MAX_NUMBER] (``heartbeat.Number``)."""
    try:
        return number_adapter.validate_python(x)
    except ValidationError as e:
        raise ValueError(first_error(e, what, fields=0)[1]) from None


def _num(x) -> str:
    """A figure as an error line shows it: an integer whole, a float in 6 digits."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _clip(msg: str) -> str:
    """An error line as a reply carries it: ASCII (escapes for the rest), at most MAX_ERROR_CHARS."""
    return ascii(msg[: MAX_ERROR_CHARS])[1:-1][: MAX_ERROR_CHARS]


class RegistryState:
    """The registry's data and rules, without Ray (see the module docstring)."""

    def __init__(
        self,
        max_regions: int = 64,
        max_sources_per_region: int = 32,
        fresh_s: float = 3.0,
        drop_after_s: float = 60.0,
        max_snapshot_nodes: int = 20_000,
        max_snapshot_rows: int = 5 * DEFAULT_MAX_ROWS,
        max_summary_bytes: int = 16 * 1024,
        clock: Callable[[], float] = time.monotonic,
        secret: Optional[str] = None,
        regions: Union[None, Iterable[str], Mapping[str, int]] = None,
        max_queue_per_replica: int = 10_000,
        max_inflight_per_replica: int = 10_000,
        max_tokens_per_request: int = 2_000_000,
    ):
        """``regions``: the deployment's regions (``app.py`` passes them); a heartbeat from any other
        region is refused. None: any well-formed region name, at most ``max_regions`` of them. A mapping
        ``{region: num_replicas}`` also registers each region's replica count, the ceiling of the
        available replicas its heartbeats may claim (module docstring, "capacity").
        ``max_queue_per_replica`` / ``max_inflight_per_replica`` / ``max_tokens_per_request``: the queue
        figures' bounds (same place). ``secret``: see :data:`SECRET_ENV` (a guard against accidents, not
        security)."""
        for name, v in (("max_regions", max_regions), ("max_sources_per_region", max_sources_per_region),
                        ("max_snapshot_nodes", max_snapshot_nodes), ("max_snapshot_rows", max_snapshot_rows),
                        ("max_summary_bytes", max_summary_bytes), ("max_queue_per_replica", max_queue_per_replica),
                        ("max_inflight_per_replica", max_inflight_per_replica),
                        ("max_tokens_per_request", max_tokens_per_request)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        _finite_nonneg(fresh_s, "fresh_s")
        _finite_nonneg(drop_after_s, "drop_after_s")
        self.max_regions = max_regions
        self.max_sources = max_sources_per_region
        self.fresh_s = float(fresh_s)
        self.drop_after_s = float(drop_after_s)
        self.max_snapshot_nodes = max_snapshot_nodes
        self.max_queue_per_replica = max_queue_per_replica
        self.max_inflight_per_replica = max_inflight_per_replica
        self.max_tokens_per_request = max_tokens_per_request
        if secret is not None and (not isinstance(secret, str) or len(secret) < 16):
            raise ValueError("the registry secret must be a string of at least 16 characters")
        self._secret = secret.encode() if secret else None
        self._clock = clock
        # region -> source -> {"available_replicas", "queue_len", "t"}
        self._sources: Dict[str, Dict[str, dict]] = {}
        self._rtts: Dict[str, Dict[str, float]] = {}
        self._snapshots = SnapshotStore(max_snapshot_nodes, max_snapshot_rows)
        #: the sibling routers' prefix inserts, per region (``sibling_inserts.py``)
        self._siblings = SiblingRing()
        self.max_summary_bytes = max_summary_bytes
        self._summaries: Dict[str, Dict[str, tuple]] = {}  # region -> source -> (wire dict, time)
        self.regions: Optional[frozenset] = None
        #: region -> its registered replica count (``regions`` given as a mapping): the capacity ceiling
        self.replicas_registered: Dict[str, int] = {}
        if regions is not None:
            self.add_regions(regions)
        self.started_at = clock()
        self.heartbeats = 0
        self.rejected = 0
        self.unauthenticated = 0
        self.refused: Dict[str, int] = {}  # code -> heartbeats refused for it (HeartbeatRefused)

    def add_regions(self, regions: Union[Iterable[str], Mapping[str, int]]) -> List[str]:
        """Add the deployment's regions to the ones this registry serves (a redeployment may add some;
        the list only grows, and regions nobody hears from are forgotten after ``drop_after_s`` anyway).
        On a registry without a list (any name) this sets it: regions it holds that are not listed are
        forgotten. A mapping ``{region: num_replicas}`` also (re)registers those regions' replica counts
        (the latest registration wins; a list of names leaves registered counts as they are). Returns the
        list now served. Raises ValueError for a bad name, a count that is not an integer in
        [1, :data:`MAX_COUNT`], or more than ``max_regions`` regions; it changes nothing then."""
        if isinstance(regions, str) or not isinstance(regions, Iterable):
            raise ValueError(f"regions must be a list of region names or a dict {{region: num_replicas}}, "
                             f"got {type(regions).__name__}")
        names = [validate_region_name(r, "regions[]") for r in regions]
        counts: Dict[str, int] = {}
        if isinstance(regions, Mapping):
            for r in names:
                n = regions[r]
                if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_COUNT:
                    raise ValueError(f"regions[{r!r}]: num_replicas must be an integer in [1, {MAX_COUNT}], "
                                     f"got {show_num(n)}")
                counts[r] = n
        merged = set(self.regions or ()) | set(names)
        if not merged:
            raise ValueError("regions must name at least one region (or be None: any region)")
        if len(merged) > self.max_regions:
            raise ValueError(f"regions: {len(merged)} regions; this registry holds at most max_regions="
                             f"{self.max_regions}")
        self.regions = frozenset(merged)
        self.replicas_registered.update(counts)
        for r in [r for r in self._sources if r not in self.regions]:
            self._forget(r)
        return sorted(self.regions)

    def table_bound_bytes(self) -> int:
        """The most bytes a reply (:meth:`heartbeat_batch`'s table, compact JSON) can take, whatever
        heartbeats arrive: ``n * (PER_REGION_BYTES + max_summary_bytes + n * PER_RTT_BYTES) + FIXED_BYTES``
        for ``n`` regions (the configured ones, else ``max_regions``)."""
        n = len(self.regions) if self.regions is not None else self.max_regions
        return n * (PER_REGION_BYTES + self.max_summary_bytes + n * PER_RTT_BYTES) + FIXED_BYTES

    def _refuse(self, e: HeartbeatRefused, counts: Dict[str, int]) -> str:
        self.refused[e.code] = n = self.refused.get(e.code, 0) + 1
        counts[e.code] = counts.get(e.code, 0) + 1
        line = _clip(str(e))
        if n == 1 or (n >= 10 and math.log10(n).is_integer()):  # once per code, then at 10, 100, ...
            logger.warning("registry refused a heartbeat (%d so far for %s): %s", n, e.code, line)
        return line

    # ------------------------------------------------------------ updates
    def heartbeat_batch(self, items: Iterable[dict]) -> dict:
        """Apply a batch of heartbeats; return the table (so one call both reports and reads).

        An item: ``{"region", "source", "available_replicas", "queue_len"}`` plus optional
        ``"delay_s"`` (the sender's estimate of this heartbeat's one-way delay to the registry, half its
        last registry round trip, at most :data:`MAX_DELAY_S`: the figures are dated that much before they
        arrived, so a table's ``age_s`` is the age of the measurement, not of the registry's receipt),
        ``"rtts": {peer: seconds}``, ``"extra": {name: number >= 0}`` (the region layer's cost inputs:
        queued_tokens, inflight, t_p_s, replicas), ``"prefix_summary"`` and ``"snapshot_delta"``
        (``snapshot_sync.SnapshotDelta``). Each item is read as a ``heartbeat.Heartbeat`` (every field and
        its bounds). A refused item is skipped (and counted in ``refused``, named in ``errors``); the rest
        of the batch still applies.
        """
        now = self._clock()
        errors: List[str] = []
        counts: Dict[str, int] = {}
        acks: Dict[str, Optional[int]] = {}
        siblings: Dict[str, dict] = {}
        if not isinstance(items, (list, tuple)):
            items = [items]
        if len(items) > MAX_BATCH_ITEMS:
            errors.append(self._refuse(HeartbeatRefused(
                "batch_too_large", f"{len(items)} heartbeats in one call; the first {MAX_BATCH_ITEMS} were "
                                   f"read, the rest refused"), counts))
            items = items[:MAX_BATCH_ITEMS]
        for item in items:
            if self._secret is not None and not self._authentic(item):
                self.unauthenticated += 1
                who = show(item.get("source")) if isinstance(item, dict) else "?"
                errors.append(self._refuse(HeartbeatRefused(
                    "unauthenticated", f"heartbeat from {who}: missing or wrong registry token ({SECRET_ENV})"),
                    counts))
                continue
            try:
                region, source, notes = self._apply(item, now)
                self.heartbeats += 1
            except HeartbeatRefused as e:
                self.rejected += 1
                errors.append(self._refuse(e, counts))
                continue
            except (ValueError, TypeError, KeyError, ArithmeticError) as e:
                self.rejected += 1
                counts["malformed"] = counts.get("malformed", 0) + 1
                self.refused["malformed"] = self.refused.get("malformed", 0) + 1
                errors.append(_clip(str(e)))
                continue
            errors.extend(notes)
            if item.get("prefix_summary") is not None:
                err = self._apply_summary(region, source, item["prefix_summary"], now)
                if err:
                    errors.append(_clip(err))
            if "snapshot" in item:
                errors.append("heartbeat.snapshot (a whole snapshot) is not accepted: send snapshot_delta")
            if item.get("snapshot_delta") is not None:
                try:
                    acks[source], err = self._snapshots.apply(region, source, item["snapshot_delta"], now)
                except ArithmeticError as e:  # e.g. a huge integer where a float is read
                    acks[source], err = self._snapshots.held(region, source), f"snapshot_delta refused: {e}"
                if err:
                    errors.append(_clip(err))
            else:
                acks[source] = self._snapshots.held(region, source)
            if "sibling_cursor" in item:  # one of several routers of its region: share prefix inserts
                siblings[source], err = self._siblings.exchange(region, source, item.get("sibling_inserts"),
                                                                item["sibling_cursor"])
                if err:
                    errors.append(_clip(err))
        self._prune(now)
        table = self.table(now)
        if acks:
            table["snapshot_acks"] = acks
        if siblings:
            table["sibling_inserts"] = siblings
        if errors:
            table["errors"] = errors[:MAX_ERRORS]
        if counts:
            table["refused"] = counts
        return table

    def _authentic(self, item) -> bool:
        token = item.get("token") if isinstance(item, dict) else None
        return isinstance(token, str) and hmac.compare_digest(token.encode(), self._secret)

    def _apply(self, item: dict, now: float):
        """Validate and store one heartbeat; returns ``(region, source, notes)`` (notes: lines for the
        reply about parts dropped, e.g. RTTs to unknown peers). The item is read as a :class:`Heartbeat`
        (``heartbeat.py``: every field and its bounds); a field out of them is :class:`HeartbeatRefused`
        with the model's code (``bad_name``, ``unknown_region``, else ``malformed``) and a message naming
        the field. Raises having changed nothing."""
        try:
            hb = Heartbeat.model_validate(item, context={"regions": self.regions, "max_regions": self.max_regions})
        except ValidationError as e:
            raise HeartbeatRefused(*first_error(e, "heartbeat")) from None
        region, source, delay = hb.region, hb.source or hb.region, hb.delay_s
        avail, qlen, clean_rtts, extra = hb.available_replicas, hb.queue_len, hb.rtts, hb.extra
        self._check_capacity(hb, source, now)
        # the RTTs the model left out (to a bad name, or a region this registry does not serve), named below
        dropped = [p for p in (item.get("rtts") or ()) if p != region and p not in clean_rtts]
        # room: a full registry refuses a new region or source; it never evicts a live one
        if region not in self._sources and len(self._sources) >= self.max_regions:
            self._prune(now)
            if len(self._sources) >= self.max_regions:
                raise HeartbeatRefused("registry_full", f"new region {region!r} refused: the registry holds "
                                                        f"max_regions={self.max_regions} regions")
        srcs = self._sources.get(region, {})
        if source not in srcs and len(srcs) >= self.max_sources:
            self._prune(now)
            srcs = self._sources.get(region, {})
            if len(srcs) >= self.max_sources:
                raise HeartbeatRefused("sources_full", f"new source {source!r} of {region!r} refused: the region "
                                                       f"has max_sources_per_region={self.max_sources} sources")
        # validated: now mutate
        srcs = self._sources.setdefault(region, {})
        # "t": when the source measured these figures, on this clock (its heartbeat's delay_s back from now)
        srcs[source] = {"available_replicas": avail, "queue_len": qlen, "t": now - (delay or 0.0), "extra": extra}
        if clean_rtts:
            mine = self._rtts.setdefault(region, {})
            mine.update(clean_rtts)
            if len(mine) > self.max_regions:
                for peer in [p for p in mine if p not in self._sources][: len(mine) - self.max_regions]:
                    del mine[peer]
        notes = []
        if dropped:
            notes.append(_clip(f"heartbeat.rtts from {source!r}: {len(dropped)} peer(s) dropped (not a known "
                               f"region name), e.g. {show(dropped[0])}"))
        return region, source, notes

    def replica_ceiling(self, region: str, reported: Optional[float] = None,
                        now: Optional[float] = None) -> Tuple[Optional[float], str]:
        """``(R, where from)``: how many replicas ``region`` has, as far as this registry knows (module
        docstring, "capacity") -- its registered count (``"registered"``); else the largest
        ``extra["replicas"]`` among ``reported`` (a heartbeat's own, about to be applied) and the region's
        fresh sources (``"reported"``); else ``(None, "unknown")``. Only a registered count caps the
        available replicas a heartbeat may claim; either scales the queue figures' bounds."""
        if region in self.replicas_registered:
            return self.replicas_registered[region], "registered"
        now = self._clock() if now is None else now
        seen = [v["extra"]["replicas"] for v in self._sources.get(region, {}).values()
                if now - v["t"] <= self.fresh_s and "replicas" in (v.get("extra") or {})]
        if reported is not None:
            seen.append(reported)
        return (max(seen), "reported") if seen else (None, "unknown")

    def _check_capacity(self, hb: Heartbeat, source: str, now: float) -> None:
        """Refuse (:class:`HeartbeatRefused`) a heartbeat claiming more than its region has: more
        available replicas or ``replicas`` than its registered count ``over_capacity``, queue figures
        past their bounds ``queue_out_of_bounds`` (module docstring, "capacity"). Changes nothing."""
        region, extra = hb.region, hb.extra
        reported = extra.get("replicas")
        ceiling, origin = self.replica_ceiling(region, reported, now)
        if ceiling is None:
            return
        known = (f"{_num(ceiling)} replica(s) of region {region!r}, "
                 + ("its registered count" if origin == "registered" else "the most its sources report"))
        who = f"heartbeat from {source!r}"
        if origin == "registered":
            for field, value in (("available_replicas", hb.available_replicas), ("extra['replicas']", reported)):
                if value is not None and value > ceiling:
                    raise HeartbeatRefused("over_capacity", f"{who}: {field}={_num(value)} exceeds the {known}")
        r = max(1, ceiling)
        per_request = self.max_queue_per_replica + self.max_inflight_per_replica
        bounds = (("queue_len", hb.queue_len, self.max_queue_per_replica * r, "max_queue_per_replica"),
                  ("extra['inflight']", extra.get("inflight"), self.max_inflight_per_replica * r,
                   "max_inflight_per_replica"),
                  ("extra['queued_tokens']", extra.get("queued_tokens"), self.max_tokens_per_request * per_request * r,
                   "max_tokens_per_request x (max_queue_per_replica + max_inflight_per_replica)"))
        for field, value, bound, rule in bounds:
            if value is not None and value > bound:
                raise HeartbeatRefused("queue_out_of_bounds", f"{who}: {field}={_num(value)} exceeds {_num(bound)}: "
                                                              f"{rule} x max(1, the {known})")

    def _apply_summary(self, region: str, source: str, wire, now: float) -> Optional[str]:
        """Store a source's prefix summary (the rest of the heartbeat applies whatever happens here)."""
        try:
            size = len(json.dumps(wire, separators=(",", ":")))
            if size > self.max_summary_bytes:
                raise ValueError(f"{size} bytes of JSON; at most {self.max_summary_bytes}")
            PrefixSummary.from_wire(wire)  # validates: version, geometry, sizes, base64
        except (ValueError, TypeError) as e:
            self.rejected += 1
            return f"heartbeat.prefix_summary from {source!r} refused: {e}"
        srcs = self._summaries.setdefault(region, {})
        srcs[source] = (wire, now)
        if len(srcs) > self.max_sources:
            del srcs[min(srcs, key=lambda s: srcs[s][1])]
        return None

    def _forget(self, region: str) -> None:
        self._sources.pop(region, None)
        self._rtts.pop(region, None)
        self._snapshots.forget(region)
        self._siblings.forget(region)
        self._summaries.pop(region, None)
        for m in self._rtts.values():
            m.pop(region, None)

    def _prune(self, now: float) -> None:
        for region in list(self._sources):
            srcs = self._sources[region]
            for s in [s for s, v in srcs.items() if now - v["t"] > self.drop_after_s]:
                del srcs[s]
                self._summaries.get(region, {}).pop(s, None)
            if not srcs:
                self._forget(region)

    # ------------------------------------------------------------ queries
    def table(self, now: Optional[float] = None) -> dict:
        now = self._clock() if now is None else now
        regions = {}
        summaries = {}
        for region, srcs in self._sources.items():
            fresh = [v for v in srcs.values() if now - v["t"] <= self.fresh_s]
            if not fresh:
                fresh = [max(srcs.values(), key=lambda v: v["t"])]
            regions[region] = {
                "available_replicas": max(v["available_replicas"] for v in fresh),
                "queue_len": sum(v["queue_len"] for v in fresh),
                "age_s": max(0.0, now - max(v["t"] for v in fresh)),
                "sources": len(srcs),
            }
            sums = self._summaries.get(region)
            if sums:
                summaries[region] = max(sums.values(), key=lambda x: x[1])[0]
            extras = [v["extra"] for v in fresh if v.get("extra")]
            if extras:
                regions[region]["extra"] = _aggregate_extra(extras)
        return {
            "regions": regions,
            "rtts": {r: dict(m) for r, m in self._rtts.items()},
            "snapshot_versions": self._snapshots.versions(),
            "prefix_summaries": summaries,
            "uptime_s": now - self.started_at,
        }

    def snapshot(self, region: str) -> Optional[dict]:
        return self._snapshots.snapshot(region)

    def stats(self) -> dict:
        return {
            "regions": len(self._sources),
            "sources": sum(len(s) for s in self._sources.values()),
            "snapshot_nodes": self._snapshots.nodes(),
            "snapshot_rows_received": self._snapshots.rows_received,
            "snapshot_deltas_refused": self._snapshots.refused,
            "sibling_rows": self._siblings.rows(),
            "sibling_rows_received": self._siblings.rows_received,
            "sibling_rows_relayed": self._siblings.rows_relayed,
            "heartbeats": self.heartbeats,
            "rejected": self.rejected,
            "unauthenticated": self.unauthenticated,
            "refused": dict(self.refused),
            "regions_configured": None if self.regions is None else sorted(self.regions),
            "replicas_registered": dict(self.replicas_registered),
            "table_bound_bytes": self.table_bound_bytes(),
            "uptime_s": self._clock() - self.started_at,
        }
