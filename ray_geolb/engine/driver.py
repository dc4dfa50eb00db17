"""Drive an :class:`EngineModel` in (scaled) wall-clock time with asyncio (no Ray).

One background task loops::

    out = engine.step(now); sleep(out.duration * time_scale); deliver out's tokens

and sleeps on an ``asyncio.Event`` when the engine is idle.  This is what the emulated
Ray Serve replica wraps.

Clock: the engine runs in *engine seconds*; ``time_scale`` wall seconds elapse per engine
second (``time_scale=0.01`` runs 100x faster than real time).  While the engine is busy,
steps are scheduled back to back in virtual time (``now_{k+1} = now_k + duration_k``) and
the loop sleeps until the wall-clock deadline of each step's end; if that deadline is
less than ~1 ms away (asyncio's timer resolution) it only yields instead of sleeping, so
small scaled step times do not accumulate timer overshoot: the virtual clock stays
within ~1 ms (wall) of ``t0 + now * time_scale``.  When the engine goes idle and later
receives work, the virtual clock jumps forward to the current wall time.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Optional

from ray_geolb.aio import wait_or_timeout

from .engine import EngineModel, EngineRequest

__all__ = ["AsyncEngineDriver"]

_MIN_SLEEP_WALL_S = 0.001
_END = object()


class AsyncEngineDriver:
    def __init__(self, engine: EngineModel, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        self.engine = engine
        self.time_scale = float(time_scale)
        self._queues: dict[str, asyncio.Queue] = {}
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None
        self._t0: Optional[float] = None  # loop time at engine time 0
        self._vnow = 0.0  # virtual engine time of the next step
        self._closed = False
        self._error: Optional[BaseException] = None

    # -------------------------------------------------------------- clock
    def now(self) -> float:
        """Current engine time derived from the wall clock."""
        loop = asyncio.get_running_loop()
        if self._t0 is None:
            self._t0 = loop.time()
        return (loop.time() - self._t0) / self.time_scale

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("AsyncEngineDriver is closed")
        if self._error is not None:
            raise RuntimeError("engine loop failed") from self._error
        if self._task is None:
            self._wake = asyncio.Event()
            self.now()  # fix t0
            self._task = asyncio.get_running_loop().create_task(self._loop())

    # -------------------------------------------------------------- API
    async def generate(self, req: EngineRequest) -> AsyncIterator[int]:
        """Yield the index (0, 1, ...) of each output token as the engine produces it.

        Closing/cancelling the consumer aborts the request in the engine.
        """
        self._ensure_started()
        rid = req.request_id
        if rid in self._queues:
            raise ValueError(f"duplicate request id {rid!r}: already streaming")
        now = max(self.now(), self._vnow if self.engine.has_work() else 0.0)
        self.engine.add_request(req, now)  # raises ValueError on bad input
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        self._wake.set()
        finished = False
        try:
            i = 0
            while True:
                item = await q.get()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                for _ in range(item):
                    yield i
                    i += 1
        finally:
            self._queues.pop(rid, None)
            if not finished:
                self.engine.abort(rid, self._vnow)

    def stats(self) -> dict:
        st = self.engine.stats()
        st["timestamp"] = time.time()
        work = st.get("engine_work")
        if work is not None:  # busy time on the report's clock (wall seconds), like its timestamp
            st["engine_work"] = dict(work, busy_s=work["busy_s"] * self.time_scale)
        return st

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        err = RuntimeError("AsyncEngineDriver closed")
        for rid, q in list(self._queues.items()):
            self.engine.abort(rid, self._vnow)
            q.put_nowait(err)
        self._queues.clear()

    # -------------------------------------------------------------- loop
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        eng = self.engine
        scale = self.time_scale
        busy = False
        try:
            while True:
                nxt = eng.next_ready_time()
                if nxt is None:
                    busy = False
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                wall_now = self.now()
                if not busy:
                    self._vnow = max(self._vnow, wall_now)
                if nxt > self._vnow:
                    # only pending requests (inside their TTFT overhead): wait for the
                    # first to become ready, or for new work
                    busy = False
                    self._wake.clear()
                    delay = (nxt - wall_now) * scale
                    woke = await wait_or_timeout(self._wake, delay) if delay > 0 else False
                    # woken by new work: resync to the wall clock; timed out: jump to nxt
                    self._vnow = max(self._vnow, self.now() if woke else nxt)
                    continue
                out = eng.step(self._vnow)
                if out.duration <= 0.0:
                    if out.preempted:
                        continue
                    busy = False  # nothing schedulable (should not happen): back off
                    await asyncio.sleep(_MIN_SLEEP_WALL_S)
                    continue
                busy = True
                end = self._vnow + out.duration
                self._vnow = end
                delay = self._t0 + end * scale - loop.time()
                if delay > _MIN_SLEEP_WALL_S:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)
                self._deliver(out)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # propagate engine bugs to every consumer
            self._error = e
            for q in self._queues.values():
                q.put_nowait(RuntimeError(f"engine loop failed: {e!r}"))
            raise

    def _deliver(self, out) -> None:
        queues = self._queues
        if queues:
            for rid in out.tokens:
                q = queues.get(rid)
                if q is not None:
                    q.put_nowait(1)
            for rid in out.finished:
                q = queues.get(rid)
                if q is not None:
                    q.put_nowait(_END)
