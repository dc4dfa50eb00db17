"""The asyncio wall-clock driver of the engine model (no Ray)."""

from __future__ import annotations

import asyncio
import time

import pytest

from ray_geolb.engine.driver import AsyncEngineDriver
from ray_geolb.engine.engine import EngineConfig, EngineModel, EngineRequest
from ray_geolb.engine.profiles import get_profile

PROFILE = get_profile("mistral-7b-a100")


def engine(**over) -> EngineModel:
    return EngineModel(PROFILE, EngineConfig.from_profile(PROFILE, **over))


async def collect(drv, req, stamps=None):
    out = []
    async for tok in drv.generate(req):
        out.append(tok)
        if stamps is not None:
            stamps.append(time.perf_counter())
    return out


def test_streams_right_number_of_tokens_concurrently():
    async def main():
        drv = AsyncEngineDriver(engine(), time_scale=0.01)
        reqs = [EngineRequest(f"r{i}", 50 + 10 * i, 5 + 3 * i) for i in range(8)]
        outs = await asyncio.gather(*(collect(drv, r) for r in reqs))
        st = drv.stats()
        await drv.close()
        return outs, st

    outs, st = asyncio.run(main())
    for i, toks in enumerate(outs):
        assert toks == list(range(5 + 3 * i))
    assert st["num_running"] == 0 and st["kv_cache_usage"] == 0.0
    assert abs(st["timestamp"] - time.time()) < 60


@pytest.mark.parametrize("scale", [0.02, 0.1])
def test_honours_time_scale(scale):
    # one request, 40 output tokens: engine time = TTFT (overhead + prefill) + 39 decodes
    p, o = 1000, 40
    eng = engine()
    expected_engine_s = PROFILE.ttft_overhead_s + PROFILE.step_time([(p, 0)])
    expected_engine_s += sum(PROFILE.step_time((), [p + k]) for k in range(1, o))

    async def main():
        drv = AsyncEngineDriver(eng, time_scale=scale)
        stamps = []
        t0 = time.perf_counter()
        toks = await collect(drv, EngineRequest("a", p, o), stamps)
        await drv.close()
        return toks, t0, stamps

    toks, t0, stamps = asyncio.run(main())
    assert len(toks) == o
    wall = stamps[-1] - t0
    expected_wall = expected_engine_s * scale
    # Pacing: never faster than the scaled engine time; slower only by scheduling noise (the
    # upper bound is loose because CI machines are loaded -- this is a correctness check, not a
    # speed measurement).
    assert expected_wall * 0.9 < wall < expected_wall * 2 + 0.1
    ttft_wall = stamps[0] - t0
    expected_ttft = (0.15072 + 0.0938e-3 * p) * scale
    assert expected_ttft * 0.9 < ttft_wall < expected_ttft * 2 + 0.05


def test_cancellation_aborts_in_engine():
    eng = engine()

    async def main():
        drv = AsyncEngineDriver(eng, time_scale=0.01)
        got = []

        async def consumer():
            async for tok in drv.generate(EngineRequest("long", 100, 10_000)):
                got.append(tok)

        task = asyncio.create_task(consumer())
        while len(got) < 5:
            await asyncio.sleep(0.001)
        assert eng.stats()["num_running"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        st = drv.stats()
        # the driver keeps serving other requests afterwards
        toks = await collect(drv, EngineRequest("next", 10, 3))
        await drv.close()
        return st, toks

    st, toks = asyncio.run(main())
    assert st["num_running"] == 0 and st["num_waiting"] == 0 and st["kv_cache_usage"] == 0.0
    assert not eng.has_work()
    assert toks == [0, 1, 2]


def test_early_close_of_generator_aborts():
    eng = engine()

    async def main():
        drv = AsyncEngineDriver(eng, time_scale=0.01)
        gen = drv.generate(EngineRequest("g", 10, 1000))
        assert await gen.__anext__() == 0
        await gen.aclose()
        await drv.close()

    asyncio.run(main())
    assert not eng.has_work()


def test_bad_request_raises_and_close_fails_streams():
    async def main():
        drv = AsyncEngineDriver(engine(), time_scale=0.01)
        with pytest.raises(ValueError):
            await collect(drv, EngineRequest("bad", 0, 3))
        task = asyncio.create_task(collect(drv, EngineRequest("x", 10, 100_00)))
        await asyncio.sleep(0.05)
        await drv.close()
        with pytest.raises(RuntimeError, match="closed"):
            await task

    asyncio.run(main())
