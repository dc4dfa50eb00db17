"""asyncio helpers shared by ``engine/`` and ``serve/``: :func:`wait_or_timeout`, a timer, not ``wait_for``."""

from __future__ import annotations

import asyncio

__all__ = ["wait_or_timeout"]


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
