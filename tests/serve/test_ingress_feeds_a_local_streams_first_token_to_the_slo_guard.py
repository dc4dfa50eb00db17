"""The Serve ingress calibrates the region layer's TTFT-SLO guard (``two_layer.ttft_slo_s``) as the simulator
does: a local stream's first token is reported to ``RegionRouter.observe_local_ttft`` under the request's
id, with the time it waited at the ingress. No cluster: a ``RequestPath`` with its model call replaced by
a stream that answers at once."""

from __future__ import annotations

import asyncio
import json

import pytest

from ray_geolb.policy.region import REGION_LAYER
from ray_geolb.policy.region import slo_guard as G
from ray_geolb.serve.ingress import IngressConfig, RequestPath
from ray_geolb.serve.ingress.openai import parse_request


class _OneTokenModel:
    """A model whose stream yields one chunk after ``delay_s``."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    def stream(self, ctx, call_id=None):
        delay = self.delay_s

        async def gen():
            await asyncio.sleep(delay)
            yield 'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'

        return gen()


def _path(**two_layer):
    cfg = IngressConfig(region="us", registry=None, model_name="m",
                        two_layer={**REGION_LAYER.two_layer(), **two_layer})
    return cfg, RequestPath(cfg.model_dump(), geo_router=lambda: None)


def _stream(cfg, ing, rid: str):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ctx = parse_request(json.dumps(body).encode(), {}, "chat", cfg, origin="us", request_id=rid)

    async def run():
        meta, stream = await ing.process(ctx)
        chunks = [c async for c in stream]  # read to the end: the stream returns its slot
        return meta, chunks

    return asyncio.run(run())


def test_a_local_streams_first_token_calibrates_the_guard_under_its_request_id():
    cfg, ing = _path(ttft_slo_s=0.5)
    ing.llm = _OneTokenModel(0.05)
    guard = ing.router.selector.slo_guard
    assert guard is not None and guard.slo_s == 0.5
    guard.note_stay("s1", 0.2)  # as the selector does when it keeps a request here before saturation
    meta, chunks = _stream(cfg, ing, "s1")
    assert meta["route"] == "local" and len(chunks) == 1 and ing.accounting()["local_unrouted"] == 0
    window = guard._realized[G._bin(0.2)]
    assert len(window) == 1 and 0.05 <= window[0] < 5.0  # dispatch to first token, on the router's clock
    assert "s1" not in guard._pending
    assert len(guard._region) == 1 and guard._region[0] >= window[0]  # since arrival: its wait here included


def test_without_the_slo_there_is_no_guard_and_a_bad_slo_is_named():
    cfg, ing = _path()
    assert ing.router.selector.slo_guard is None
    ing.llm = _OneTokenModel(0.0)
    assert _stream(cfg, ing, "s2")[0]["route"] == "local"  # the first-token report is a no-op
    with pytest.raises(ValueError, match="two_layer.ttft_slo_s"):
        _path(ttft_slo_s=-1)
