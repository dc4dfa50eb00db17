"""``ray_geolb.aio.within``: a timeout that, unlike ``asyncio.wait_for`` on Python <= 3.11, never swallows the
caller's cancellation -- a loop that awaits it (the registry client's ticks, the RTT prober) stops when it is
cancelled, even when the awaited call finishes in the same loop turn as the cancellation arrives."""

from __future__ import annotations

import asyncio

import pytest

from ray_geolb.aio import within


def test_the_result_passes_and_a_timeout_raises_and_cancels_the_awaited_call():
    async def main():
        assert await within(asyncio.sleep(0, result=7), 1.0) == 7
        assert await within(asyncio.sleep(0, result=8), None) == 8
        cancelled = asyncio.Event()

        async def slow():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        with pytest.raises(asyncio.TimeoutError):
            await within(slow(), 0.01)
        assert cancelled.is_set()

    asyncio.run(main())


def test_a_loop_cancelled_as_its_call_completes_stops():
    """The race that made wait_for swallow cancellations: the awaited future is resolved in the same loop
    turn as the task is cancelled. Each round resolves the future and cancels the looping task together;
    the loop must end with CancelledError every time, never tick on."""

    async def main():
        loop = asyncio.get_running_loop()
        for _ in range(50):
            ticks = 0
            fut = loop.create_future()

            async def looping():
                nonlocal ticks, fut
                while True:
                    await within(fut, 5.0)
                    ticks += 1
                    fut = loop.create_future()

            task = loop.create_task(looping())
            await asyncio.sleep(0)  # the task now waits on fut
            fut.set_result(None)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 2.0)
            assert task.cancelled() and ticks <= 1

    asyncio.run(main())
