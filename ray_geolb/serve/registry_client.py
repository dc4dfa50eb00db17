"""The registry client each region's ingress runs (the registry itself: ``registry.py``).

:class:`RegistryClient` runs in each ingress process: one background asyncio task sends this region's
heartbeat (plus RTTs and, when changed, the snapshot) in one batched call and gets the peer table back
in the reply, every ``period_s``. Nothing on the request path ever waits for it. Every call has a
timeout; while the registry is unreachable the last table is kept, and its entries age (their
timestamps are when the peer measured them: when the table was made, minus the age the registry
reported, which counts from the measurement -- see ``heartbeat_batch``'s ``delay_s``), so after
``TwoLayerConfig.peer_stale_s`` every peer is stale and the region routes locally -- degraded, never
stopped. After ``reresolve_after`` failed calls the client re-resolves the named actor (creating it
again if it is gone for good).

A heartbeat the registry refuses (its reply's ``refused``, ``{code: count}``, and ``errors``) is counted
(``status()["refused"]``, ``last_refusal``) and logged once per streak. If the refusal is
``unknown_region`` -- a registry created, or restarted by Ray, with an older deployment's region list --
and this client's ``registry_config["regions"]`` lists its region, it adds that list to the registry
(``add_regions``) and the next heartbeat is taken.

**Standby registries** (``standbys``: ``RegistryOptions.standbys``, ``RegionLayerSettings.registry_standbys``).
Each tick's heartbeat also goes to every standby registry -- a registry actor of its own, pinned to
another region -- without the snapshot delta (the primary alone mirrors the snapshot) and with the
one-way delay to that standby. Each standby's table is handed to ``on_standby_table``; the ingress applies
it like the primary's, a peer's freshest state winning (``RegionRouter.update_peer``). A standby call
never delays the tick: one call per standby is in flight at most (a tick skips a standby whose last call
is still pending), each with the same timeout. So the regions keep forwarding through the loss of the
primary's region, and nothing has to fail over or back.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

from ray_geolb.aio import within
from ray_geolb.policy.region.peer_table import peer_states_from_table
from ray_geolb.policy.region.registry_state import SECRET_ENV, logger, registry_leg
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.registry import DEFAULT_NAME, DEFAULT_NAMESPACE, get_or_create_registry

__all__ = ["RegistryClient", "peer_states_from_table"]

#: heartbeat fields the primary registry alone reads: the snapshot mirror, the sibling routers' inserts
#: (standbys relay peers' figures only), and the delay measured on the primary's link
_PRIMARY_ONLY = ("snapshot_delta", "delay_s", "sibling_cursor", "sibling_inserts")


class _StandbyLink:
    """One standby registry: its actor, the call in flight, the one-way delay its heartbeats declare."""

    __slots__ = ("name", "label_selector", "handle", "task", "delay_s", "successes", "failures",
                 "consecutive_failures", "last_error", "resolves")

    def __init__(self, name: str, label_selector: Optional[dict]):
        self.name = name
        self.label_selector = label_selector
        self.handle = None
        self.task: Optional[asyncio.Task] = None
        self.delay_s: Optional[float] = None
        self.successes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.last_error: Optional[str] = None
        self.resolves = 0

    def status(self) -> dict:
        return {"connected": self.successes > 0 and self.consecutive_failures == 0,
                "successes": self.successes, "failures": self.failures, "resolves": self.resolves,
                "last_error": self.last_error}


def _count_failure(link, error: Exception, reresolve_after: int, what: str, source: str) -> bool:
    """Book one failed registry call on ``link`` (the client itself or a :class:`_StandbyLink`: both count
    ``failures``, ``consecutive_failures`` and ``last_error``) and log the 1st, 10th and every 100th in a
    row. True when the link should drop its actor handle and re-resolve the name (it may have been
    re-created)."""
    link.failures += 1
    link.consecutive_failures += 1
    link.last_error = f"{type(error).__name__}: {error}"[:300]
    n = link.consecutive_failures
    if n in (1, 10) or n % 100 == 0:
        logger.warning("%s unreachable from %s (%d failures in a row): %s", what, source, n, link.last_error)
    return n % reresolve_after == 0


class RegistryClient:
    """Background heartbeat + peer-table refresh for one ingress (see the module docstring).

    ``provider()`` returns this source's heartbeat fields: ``available_replicas``, ``queue_len`` and
    optionally ``rtts`` ({peer: seconds}) and ``snapshot`` / ``snapshot_version`` (send them only when
    changed). ``on_table(table, made_at)`` is called with each table, ``made_at`` on this policy clock
    (``serve/clock.py``: wall time, the clock the ingress prices peers' ages on): when the registry made
    the table, i.e. its arrival less half the call's round trip. Each heartbeat after the
    first declares that half round trip as its ``delay_s``, so the registry dates its figures to when
    they were measured (``RegistryState.heartbeat_batch``).
    """

    def __init__(
        self,
        region: str,
        source: str,
        provider: Callable[[], dict],
        on_table: Callable[[dict, float], None],
        *,
        name: str = DEFAULT_NAME,
        namespace: str = DEFAULT_NAMESPACE,
        period_s: float = 0.25,
        timeout_s: float = 1.0,
        reresolve_after: int = 2,
        create_if_missing: bool = True,
        registry_config: Optional[dict] = None,
        clock: Callable[[], float] = policy_now,
        standbys: Sequence[Tuple[str, Optional[dict]]] = (),
        on_standby_table: Optional[Callable[[dict, float], None]] = None,
    ):
        if not (isinstance(period_s, (int, float)) and period_s > 0):
            raise ValueError(f"period_s must be > 0, got {period_s!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.region = region
        self.source = source
        self.provider = provider
        self.on_table = on_table
        self.name = name
        self.namespace = namespace
        self.period_s = float(period_s)
        self.timeout_s = float(timeout_s)
        self.reresolve_after = max(1, int(reresolve_after))
        self.create_if_missing = create_if_missing
        self.registry_config = registry_config
        self._clock = clock
        self._token = os.environ.get(SECRET_ENV) or None  # the deployment's registry secret, if it has one
        self._handle = None
        self._task: Optional[asyncio.Task] = None
        self.last_ok: Optional[float] = None
        self.last_table: Optional[dict] = None
        self.consecutive_failures = 0
        self.failures = 0
        self.successes = 0
        self.resolves = 0
        self.last_error: Optional[str] = None
        self.last_call_s = 0.0  # the last registry call's round trip (resolution left out)
        self.refused = 0  # heartbeats the registry answered but refused (reply's "refused")
        self.refused_in_a_row = 0
        self.last_refusal: Optional[str] = None
        #: the one-way delay to the registry this source declares in its heartbeats (``delay_s``): half
        #: its last heartbeat's round trip; None until one succeeded
        self.delay_s: Optional[float] = None
        #: the standby registries (module docstring): actor name, label selector it is created with
        self.standbys: Dict[str, _StandbyLink] = {n: _StandbyLink(n, sel) for n, sel in standbys}
        self.on_standby_table = on_standby_table or on_table

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        t, self._task = self._task, None
        tasks = [t] + [link.task for link in self.standbys.values()]
        for link in self.standbys.values():
            link.task = None
        for t in tasks:
            if t is None:
                continue
            t.cancel()
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass

    @property
    def connected(self) -> bool:
        return self.consecutive_failures == 0 and self.last_ok is not None

    def status(self) -> dict:
        now = self._clock()
        return {
            "connected": self.connected,
            "since_last_ok_s": None if self.last_ok is None else round(now - self.last_ok, 3),
            "successes": self.successes,
            "failures": self.failures,
            "resolves": self.resolves,  # the primary's; each standby counts its own
            "last_error": self.last_error,
            "refused": self.refused,
            "last_refusal": self.last_refusal,
            "standbys": {n: link.status() for n, link in self.standbys.items()},
        }

    # ------------------------------------------------------------ calls
    async def _resolve(self, name: Optional[str] = None, label_selector: Optional[dict] = None):
        """The named registry actor (this client's primary unless ``name`` says which standby), created
        if missing and allowed."""
        import ray

        loop = asyncio.get_running_loop()
        name = self.name if name is None else name

        def get():
            if self.create_if_missing:
                return get_or_create_registry(name, self.namespace, self.registry_config, label_selector)
            return ray.get_actor(name, namespace=self.namespace)

        # get_actor / actor creation are blocking GCS calls: keep them off the event loop.
        return await within(loop.run_in_executor(None, get), self.timeout_s * 5)

    async def call(self, method: str, *args):
        """One registry call with a timeout (resolving the actor first if needed). ``last_call_s`` is then
        the call's round trip, resolution left out."""
        if self._handle is None:
            self._handle = await self._resolve()
            self.resolves += 1
        out, self.last_call_s = await self._timed(self._handle, method, *args)
        return out

    async def _timed(self, handle, method: str, *args) -> tuple:
        """(the answer, its round trip) of one actor call, within ``timeout_s``."""
        t0 = self._clock()
        ref = getattr(handle, method).remote(*args)
        try:
            out = await within(ref, self.timeout_s)
            return out, max(0.0, self._clock() - t0)
        except asyncio.TimeoutError:
            import ray

            ray.cancel(ref)  # best effort; never blocks
            raise

    async def tick(self) -> bool:
        """One heartbeat + table refresh. Returns True on success. Never raises (except cancel)."""
        try:
            hb = dict(self.provider())
            hb.setdefault("region", self.region)
            hb.setdefault("source", self.source)
            if self._token:
                hb["token"] = self._token
            self._send_to_standbys(hb)
            if self.delay_s is not None:
                hb.setdefault("delay_s", self.delay_s)
            table = await self.call("heartbeat_batch", [hb])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - unreachable/restarting registry: degrade, retry
            if _count_failure(self, e, self.reresolve_after, "registry", self.source):
                self._handle = None
            return False
        received = self._clock()
        self.successes += 1
        self.consecutive_failures = 0
        self.last_ok = received
        self.last_table = table
        self.delay_s = registry_leg(self.last_call_s)
        try:
            self.on_table(table, received - self.delay_s)
        except Exception:  # noqa: BLE001
            logger.exception("on_table callback failed")
        await self._on_refused(table.get("refused") if isinstance(table, dict) else None, table)
        return True

    def _send_to_standbys(self, hb: dict) -> None:
        """This tick's heartbeat to every standby whose last call is done (module docstring)."""
        for link in self.standbys.values():
            if link.task is not None and not link.task.done():
                continue
            msg = {k: v for k, v in hb.items() if k not in _PRIMARY_ONLY}
            if link.delay_s is not None:
                msg["delay_s"] = link.delay_s
            link.task = asyncio.get_running_loop().create_task(self._standby_call(link, msg))

    async def _standby_call(self, link: _StandbyLink, hb: dict) -> None:
        """One heartbeat to a standby, its table to ``on_standby_table``. Never raises (except cancel)."""
        try:
            if link.handle is None:
                link.handle = await self._resolve(link.name, link.label_selector)
                link.resolves += 1
            table, round_trip = await self._timed(link.handle, "heartbeat_batch", [hb])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a standby down or restarting: the others carry on
            if _count_failure(link, e, self.reresolve_after, f"standby registry {link.name}", self.source):
                link.handle = None
            return
        link.successes += 1
        link.consecutive_failures = 0
        link.delay_s = registry_leg(round_trip)
        try:
            self.on_standby_table(table, self._clock() - link.delay_s)
        except Exception:  # noqa: BLE001
            logger.exception("on_standby_table callback failed")

    async def _on_refused(self, refused, table: dict) -> None:
        """Count and log a refused heartbeat; on ``unknown_region`` add this deployment's regions."""
        if not refused:
            self.refused_in_a_row = 0
            return
        self.refused += 1
        self.refused_in_a_row += 1
        self.last_refusal = "; ".join(str(e) for e in (table.get("errors") or [])[:3])[:500] or str(refused)
        streak = self.refused_in_a_row
        if streak == 1 or streak % 100 == 0:
            logger.warning("registry refused the heartbeat of %s (%d in a row): %s", self.source, streak,
                           self.last_refusal)
        regions = (self.registry_config or {}).get("regions")
        if ("unknown_region" in refused and regions and self.region in regions
                and (streak == 1 or streak % 20 == 0)):
            try:
                now = await self.call("add_regions", list(regions))
                logger.warning("registry did not know region %s: added this deployment's regions, it now "
                               "serves %s", self.region, now)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - e.g. the registry is full: the refusal stays visible
                self.last_error = f"add_regions: {type(e).__name__}: {e}"[:300]

    async def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            await self.tick()
            await asyncio.sleep(max(0.0, self.period_s - (time.monotonic() - t0)))

    async def fetch_snapshot(self, region: str) -> Optional[dict]:
        """The region's mirrored snapshot, or None (unreachable or none stored)."""
        try:
            return await self.call("snapshot", region)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            self.last_error = f"{type(e).__name__}: {e}"[:300]
            return None
