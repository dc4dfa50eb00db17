"""Region registry: the cross-region view every region's ingress shares.

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
  most ``max_snapshot_rows`` rows per heartbeat; ``snapshot_sync.py`` has both ends of the protocol),
  kept per source, trimmed to ``max_snapshot_nodes`` (most recently used nodes kept, parents before
  children), so a restarted ingress reloads its snapshot. A heartbeat's reply acknowledges the
  version it now holds for the sender (``snapshot_acks``).

Memory is bounded: at most ``max_regions`` regions, ``max_sources_per_region`` sources each (oldest
dropped), ``max_snapshot_nodes`` per snapshot, and a region not heard from for ``drop_after_s`` is
forgotten. Ages, not timestamps, are returned (``age_s`` on the registry's clock), so clock skew
between nodes does not matter. An age counts from when the source measured its figures: a heartbeat
declares its one-way delay to the registry (``delay_s``, half the sender's last registry round trip), and
the reader subtracts its own leg back (``RegistryClient``: the table's ``made_at`` for
``peer_states_from_table``).

:class:`RegionRegistry` is the Ray actor around it: detached, named, ``max_restarts=-1``,
``num_cpus=0`` (:func:`get_or_create_registry`). It is *stateless-restartable*: after a restart it is
empty and is rebuilt by the next heartbeats (every ``period_s``) -- nothing in it is precious.

The client each ingress runs is :class:`~ray_geolb.serve.registry_client.RegistryClient`.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from ray_geolb.policy.region.prefix_summary import PrefixSummary
from ray_geolb.serve.snapshot_sync import DEFAULT_MAX_ROWS, SnapshotStore, trim_snapshot

logger = logging.getLogger("ray_geolb.registry")

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_NAMESPACE",
    "RegistryState",
    "RegionRegistry",  # noqa: F822 - built lazily by __getattr__ (importing this module must not import ray)
    "get_or_create_registry",
    "MAX_DELAY_S",
    "registry_leg",
    "SECRET_ENV",
    "trim_snapshot",
    "validate_extra",
]

DEFAULT_NAME = "geolb_registry"
DEFAULT_NAMESPACE = "geolb"
#: the environment variable holding the deployment's registry secret (in every ingress replica's and
#: the registry actor's environment, e.g. the nodes' env or a runtime_env): when the registry has one,
#: only heartbeats that carry it (``token``) are applied
SECRET_ENV = "GEOLB_REGISTRY_SECRET"


#: heartbeat ``extra`` limits: keys per region, key length
MAX_EXTRA_KEYS = 16
MAX_EXTRA_KEY_LEN = 64
#: how a numeric extra is combined over a region's fresh sources (ingress replicas); others: mean.
#: Each ingress replica has its own router (its own queue and in-flight requests) over the same
#: replicas: queues and in-flight counts add up, the replica count does not.
EXTRA_AGG = {"queued_tokens": "sum", "inflight": "sum", "replicas": "max"}
#: the largest one-way delay a heartbeat may declare (``delay_s``): a registry call times out long before
MAX_DELAY_S = 10.0


def registry_leg(round_trip_s: float) -> float:
    """A client's one-way delay to the registry from its last call's round trip: half of it (capped at
    :data:`MAX_DELAY_S`). Its next heartbeat declares it as ``delay_s``, and the table that call returned
    was made that long before it arrived (``RegistryClient``; the simulator's LB alike)."""
    return min(MAX_DELAY_S, max(0.0, round_trip_s) / 2.0)


def validate_extra(extra, what: str = "heartbeat.extra") -> Dict[str, float]:
    """A heartbeat's ``extra``: ``{name: finite number >= 0}``, at most :data:`MAX_EXTRA_KEYS` names of
    at most :data:`MAX_EXTRA_KEY_LEN` characters. Raises ValueError naming the problem."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ValueError(f"{what} must be a dict {{name: number}}, got {type(extra).__name__}")
    if len(extra) > MAX_EXTRA_KEYS:
        raise ValueError(f"{what} has {len(extra)} fields; at most {MAX_EXTRA_KEYS}")
    out = {}
    for k, v in extra.items():
        if not isinstance(k, str) or not k or len(k) > MAX_EXTRA_KEY_LEN:
            raise ValueError(f"{what}: field names must be strings of 1-{MAX_EXTRA_KEY_LEN} characters, got {k!r}")
        out[k] = _finite_nonneg(v, f"{what}[{k!r}]")
    return out


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
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {x!r}")
    return x


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
    ):
        for name, v in (("max_regions", max_regions), ("max_sources_per_region", max_sources_per_region),
                        ("max_snapshot_nodes", max_snapshot_nodes), ("max_snapshot_rows", max_snapshot_rows),
                        ("max_summary_bytes", max_summary_bytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        _finite_nonneg(fresh_s, "fresh_s")
        _finite_nonneg(drop_after_s, "drop_after_s")
        self.max_regions = max_regions
        self.max_sources = max_sources_per_region
        self.fresh_s = float(fresh_s)
        self.drop_after_s = float(drop_after_s)
        self.max_snapshot_nodes = max_snapshot_nodes
        if secret is not None and (not isinstance(secret, str) or len(secret) < 16):
            raise ValueError("the registry secret must be a string of at least 16 characters")
        self._secret = secret.encode() if secret else None
        self._clock = clock
        # region -> source -> {"available_replicas", "queue_len", "t"}
        self._sources: Dict[str, Dict[str, dict]] = {}
        self._rtts: Dict[str, Dict[str, float]] = {}
        self._snapshots = SnapshotStore(max_snapshot_nodes, max_snapshot_rows)
        self.max_summary_bytes = max_summary_bytes
        self._summaries: Dict[str, Dict[str, tuple]] = {}  # region -> source -> (wire dict, time)
        self.started_at = clock()
        self.heartbeats = 0
        self.rejected = 0
        self.unauthenticated = 0

    # ------------------------------------------------------------ updates
    def heartbeat_batch(self, items: Iterable[dict]) -> dict:
        """Apply a batch of heartbeats; return the table (so one call both reports and reads).

        An item: ``{"region", "source", "available_replicas", "queue_len"}`` plus optional
        ``"delay_s"`` (the sender's estimate of this heartbeat's one-way delay to the registry, half its
        last registry round trip, at most :data:`MAX_DELAY_S`: the figures are dated that much before they
        arrived, so a table's ``age_s`` is the age of the measurement, not of the registry's receipt),
        ``"rtts": {peer: seconds}``, ``"extra": {name: number >= 0}`` (the region layer's cost inputs:
        queued_tokens, inflight, t_p_s, replicas; see :func:`validate_extra`) and
        ``"snapshot": PrefixIndex.snapshot()`` (+ ``"snapshot_version"``).
        A malformed item is skipped (and counted in ``errors``); the rest of the batch still applies.
        """
        now = self._clock()
        errors: List[str] = []
        acks: Dict[str, Optional[int]] = {}
        if not isinstance(items, (list, tuple)):
            items = [items]
        for item in items:
            if self._secret is not None and not self._authentic(item):
                self.unauthenticated += 1
                errors.append(f"heartbeat from {item.get('source') if isinstance(item, dict) else '?'!r}: "
                              f"missing or wrong registry token ({SECRET_ENV})")
                continue
            try:
                self._apply(item, now)
                self.heartbeats += 1
            except (ValueError, TypeError, KeyError) as e:
                self.rejected += 1
                errors.append(str(e))
                continue
            region, source = item["region"], str(item.get("source") or item["region"])
            if item.get("prefix_summary") is not None:
                err = self._apply_summary(region, source, item["prefix_summary"], now)
                if err:
                    errors.append(err)
            if "snapshot" in item:
                errors.append("heartbeat.snapshot (a whole snapshot) is not accepted: send snapshot_delta")
            if item.get("snapshot_delta") is not None:
                acks[source], err = self._snapshots.apply(region, source, item["snapshot_delta"], now)
                if err:
                    errors.append(err)
            else:
                acks[source] = self._snapshots.held(region, source)
        self._prune(now)
        table = self.table(now)
        if acks:
            table["snapshot_acks"] = acks
        if errors:
            table["errors"] = errors[:10]
        return table

    def _authentic(self, item) -> bool:
        token = item.get("token") if isinstance(item, dict) else None
        return isinstance(token, str) and hmac.compare_digest(token.encode(), self._secret)

    def _apply(self, item: dict, now: float) -> None:
        if not isinstance(item, dict):
            raise TypeError(f"heartbeat must be a dict, got {type(item).__name__}")
        region = item.get("region")
        if not isinstance(region, str) or not region:
            raise ValueError(f"heartbeat.region must be a non-empty string, got {region!r}")
        source = str(item.get("source") or region)
        avail = item.get("available_replicas")
        qlen = item.get("queue_len", 0)
        for name, v in (("available_replicas", avail), ("queue_len", qlen)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"heartbeat.{name} must be an integer >= 0, got {v!r}")
        rtts = item.get("rtts") or {}
        if not isinstance(rtts, dict) or len(rtts) > self.max_regions:
            raise ValueError(f"heartbeat.rtts must be a dict {{peer: seconds}} of at most {self.max_regions} peers")
        clean_rtts = {peer: float(_finite_nonneg(v, f"heartbeat.rtts[{peer!r}]"))
                      for peer, v in rtts.items() if isinstance(peer, str) and peer != region}
        extra = validate_extra(item.get("extra"))
        delay = item.get("delay_s")
        if delay is not None:
            delay = _finite_nonneg(delay, "heartbeat.delay_s")
            if delay > MAX_DELAY_S:
                raise ValueError(f"heartbeat.delay_s must be at most {MAX_DELAY_S:g} s, got {delay!r}")
        # validated: now mutate
        if region not in self._sources and len(self._sources) >= self.max_regions:
            oldest = min(self._sources, key=lambda r: max(s["t"] for s in self._sources[r].values()))
            self._forget(oldest)
        srcs = self._sources.setdefault(region, {})
        if source not in srcs and len(srcs) >= self.max_sources:
            del srcs[min(srcs, key=lambda s: srcs[s]["t"])]
        # "t": when the source measured these figures, on this clock (its heartbeat's delay_s back from now)
        srcs[source] = {"available_replicas": avail, "queue_len": qlen, "t": now - (delay or 0.0), "extra": extra}
        if clean_rtts:
            mine = self._rtts.setdefault(region, {})
            mine.update(clean_rtts)
            if len(mine) > self.max_regions:
                for peer in [p for p in mine if p not in self._sources][: len(mine) - self.max_regions]:
                    del mine[peer]

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
        self._summaries.pop(region, None)
        for m in self._rtts.values():
            m.pop(region, None)

    def _prune(self, now: float) -> None:
        for region in list(self._sources):
            srcs = self._sources[region]
            for s in [s for s, v in srcs.items() if now - v["t"] > self.drop_after_s]:
                del srcs[s]
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
            "heartbeats": self.heartbeats,
            "rejected": self.rejected,
            "unauthenticated": self.unauthenticated,
            "uptime_s": self._clock() - self.started_at,
        }


# ---------------------------------------------------------------------------------------------- actor
def _actor_class():
    import ray

    @ray.remote(num_cpus=0, max_restarts=-1)
    class RegionRegistry:
        """Ray actor around :class:`RegistryState` (detached and named; see get_or_create_registry)."""

        def __init__(self, config: Optional[dict] = None):
            cfg = dict(config or {})
            cfg.setdefault("secret", os.environ.get(SECRET_ENV) or None)  # never passed as an argument
            self.state = RegistryState(**cfg)

        def heartbeat_batch(self, items: List[dict]) -> dict:
            return self.state.heartbeat_batch(items)

        def table(self) -> dict:
            return self.state.table()

        def snapshot(self, region: str) -> Optional[dict]:
            return self.state.snapshot(region)

        def stats(self) -> dict:
            return self.state.stats()

        def ping(self) -> str:
            return "ok"

    return RegionRegistry


_ACTOR_CLS = None


def __getattr__(name):  # lazy: importing this module must not import ray
    global _ACTOR_CLS
    if name == "RegionRegistry":
        if _ACTOR_CLS is None:
            _ACTOR_CLS = _actor_class()
        return _ACTOR_CLS
    raise AttributeError(name)


def get_or_create_registry(name: str = DEFAULT_NAME, namespace: str = DEFAULT_NAMESPACE,
                           config: Optional[dict] = None, label_selector: Optional[dict] = None):
    """The named detached registry actor, created if it does not exist (race-free: ``get_if_exists``)."""
    if config is not None:
        RegistryState(**config)  # validate here, with a clear error, not in the actor
    cls = __getattr__("RegionRegistry")
    opts: Dict[str, Any] = dict(name=name, namespace=namespace, lifetime="detached", get_if_exists=True)
    if label_selector:
        opts["label_selector"] = dict(label_selector)
    return cls.options(**opts).remote(config)
