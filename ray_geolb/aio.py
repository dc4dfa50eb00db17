"""asyncio helpers shared by ``engine/`` and ``serve/``: :func:`wait_or_timeout` and :func:`within`, timeouts
that never swallow a cancellation, unlike ``asyncio.wait_for`` on Python <= 3.11."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Optional

__all__ = ["wait_or_timeout", "within"]


async def wait_or_timeout(ev: asyncio.Event, timeout: float) -> bool:
    """Wait until ``ev`` is set (True) or ``timeout`` seconds pass (False; the timer then sets ``ev``).

    Cancellable at any moment. Not ``asyncio.wait_for(ev.wait(), timeout)``: on Python <= 3.11 that
    returns normally -- swallowing the task's cancellation -- when the event is set in the same loop turn
    as the cancellation arrives, so a cancelled waiter (a client gone, a driver closed) would go on."""
    timed_out = False

    def expire():
        nonlocal timed_out
        timed_out = True
        ev.set()

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        await ev.wait()
    finally:
        timer.cancel()
    return not timed_out


async def within(aw: Awaitable[Any], timeout: Optional[float]) -> Any:
    """``await aw``, raising ``asyncio.TimeoutError`` (and cancelling ``aw``) after ``timeout`` seconds; None: no
    bound. Cancellable at any moment: a cancellation of the caller always propagates. Not ``asyncio.wait_for``:
    on Python <= 3.11 it returns ``aw``'s result -- swallowing the cancellation -- when ``aw`` finishes in the
    same loop turn as the cancellation arrives, and a loop awaiting it (a registry client, an RTT prober) then
    went on ticking after it was cancelled: its stop, and an event loop's shutdown, waited for ever."""
    if timeout is None:
        return await aw
    timer = getattr(asyncio, "timeout", None)  # Python >= 3.11
    if timer is None:
        return await asyncio.wait_for(aw, timeout)
    async with timer(timeout):
        return await aw
