"""End to end: LLMConfig(server_cls=EmulatedLLMServer) + build_openai_app (stock OpenAiIngress) with
request_router_class=GeoPrefixRouter, over HTTP on the Serve proxy port; plus the vLLM stat-logger
plugin on CPU."""

import json
import time
import urllib.request

import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from ray_geolb.serve.llm_server import GUARD_HOOK, guard_broken_torch_extras  # noqa: E402

guard_broken_torch_extras()  # this venv: CUDA torchvision / torchaudio 2.11 over torch 2.13+cpu
pytest.importorskip("vllm")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def _post(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.headers.get("content-type", ""), r.read().decode()


def test_stat_logger_plugin_records_scheduler_stats():
    from vllm.v1.metrics.stats import SchedulerStats

    from ray_geolb.serve import stats_plugin as sp

    sp.reset_stats()
    assert sp.latest_stats() == {}
    lg = sp.GeoStatLogger(vllm_config=None, engine_index=0)
    lg.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.25), None)
    s = sp.latest_stats()
    assert s["num_waiting"] == 2 and s["num_running"] == 3 and s["kv_cache_usage"] == 0.25
    assert abs(s["timestamp"] - time.time()) < 5
    lg.record(None, None)  # iteration-only record: keeps the last scheduler stats
    assert sp.latest_stats()["num_waiting"] == 2
    from ray_geolb.policy import ReplicaStats

    rs = ReplicaStats.from_dict(s)
    assert (rs.num_waiting, rs.num_running, rs.kv_cache_usage) == (2, 3, 0.25)


def test_stat_logger_plugin_ttft_samples_from_finished_requests():
    """vLLM 0.29 has no per-request TTFT field: the sample is queued_time + prefill_time (engine core)
    with uncached = num_prompt_tokens - num_cached_tokens, taken once per report."""
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

    from ray_geolb.policy import ReplicaStats
    from ray_geolb.serve import stats_plugin as sp

    sp.reset_stats()
    lg = sp.GeoStatLogger(vllm_config=None, engine_index=0)
    cold = IterationStats()  # the engine's first iteration (its cold step), well before these requests
    cold.iteration_timestamp -= 10.0
    lg.record(SchedulerStats(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.1), cold)
    it = IterationStats()

    def fin(**kw):
        base = dict(finish_reason=None, num_prompt_tokens=1000, num_generation_tokens=8, e2e_latency=0.5,
                    queued_time=0.02, prefill_time=0.08, num_cached_tokens=256)
        base.update(kw)
        return FinishedRequestStats(**base)

    it.finished_requests = [
        fin(),
        fin(num_prompt_tokens=300, num_cached_tokens=0, queued_time=0.0, prefill_time=0.03),
        fin(num_generation_tokens=0, prefill_time=-5.0),  # aborted before its first token: skipped
        fin(queued_time=0.0, prefill_time=81234.5),  # no SCHEDULED event (ts 0.0): longer than e2e, skipped
    ]
    lg.record(SchedulerStats(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.1), it)
    samples = sp.take_ttft_samples()
    assert samples == [[744, pytest.approx(0.1)], [300, pytest.approx(0.03)]]
    assert sp.take_ttft_samples() == []  # only since the previous report
    lg.record(None, it)  # an iteration-only record still yields samples
    assert len(sp.take_ttft_samples()) == 2
    rs = ReplicaStats.from_dict({**sp.latest_stats(), "ttft_samples": samples})
    assert rs.ttft_samples == ((744.0, pytest.approx(0.1)), (300.0, pytest.approx(0.03)))
    sp.reset_stats()


def test_stat_logger_plugin_entry_point_is_discoverable():
    from importlib.metadata import entry_points

    from vllm.v1.metrics.loggers import load_stat_logger_plugin_factories

    from ray_geolb.serve.stats_plugin import GeoStatLogger

    eps = [e for e in entry_points(group="vllm.stat_logger_plugins") if e.name == "ray_geolb"]
    assert eps, "entry point missing: run `pip install -e .` in the repository"
    assert eps[0].load() is GeoStatLogger
    assert GeoStatLogger in load_stat_logger_plugin_factories()  # vLLM's own loader accepts it


def test_geo_vllm_server_class_builds():
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    from ray_geolb.serve.stats_plugin import GeoVLLMServer

    assert issubclass(GeoVLLMServer, LLMServer)
    assert GeoVLLMServer.__module__ == "ray_geolb.serve.stats_plugin"


# this module's cluster (conftest.serve_cluster), with a job-level hook: a per-replica runtime_env hook
# did not run before the OpenAiIngress replica unpickled its class (which imports vLLM) in Ray 2.60
SERVE_CLUSTER = {"prefix": "rgL", "runtime_env": {"worker_process_setup_hook": GUARD_HOOK}}


@pytest.fixture(scope="module")
def llm_app(serve_cluster):
    from ray_geolb.serve.llm_server import build_emulated_openai_app, emulated_llm_config

    cfg = emulated_llm_config("emu-llama", num_replicas=2, router_kwargs={"policy": "skylb"},
                              time_scale=0.01, output_tokens=6)
    serve.run(build_emulated_openai_app([cfg]), name="llm", route_prefix="/")
    yield serve_cluster


def test_openai_chat_non_streaming_over_http(llm_app):
    body = {"model": "emu-llama", "messages": [{"role": "user", "content": "hello " * 50}], "max_tokens": 5}
    st, ct, text = _post(llm_app + "/v1/chat/completions", body)
    assert st == 200 and "json" in ct
    out = json.loads(text)
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["content"].count("tok") == 5
    assert out["usage"]["completion_tokens"] == 5
    assert out["system_fingerprint"].startswith("geolb-")


def test_openai_chat_streaming_and_affinity_over_http(llm_app):
    sys_prompt = "You are terse. " * 100
    fps = []
    for turn in range(3):
        msgs = [{"role": "system", "content": sys_prompt}]
        for k in range(turn + 1):
            msgs.append({"role": "user", "content": f"question {k} " * 20})
            if k < turn:
                msgs.append({"role": "assistant", "content": "tok0 tok1 tok2 "})
        body = {"model": "emu-llama", "messages": msgs, "max_tokens": 3, "stream": True}
        st, ct, text = _post(llm_app + "/v1/chat/completions", body)
        assert st == 200 and "text/event-stream" in ct
        events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert content.count("tok") == 3
        fps.append(chunks[0]["system_fingerprint"])
    # turns of one conversation stay on one replica (the router lives in the ingress replica)
    assert len(set(fps)) == 1, fps


def test_openai_completions_over_http(llm_app):
    st, _, text = _post(llm_app + "/v1/completions",
                        {"model": "emu-llama", "prompt": "once upon a time", "max_tokens": 4})
    out = json.loads(text)
    assert st == 200 and out["choices"][0]["text"].count("tok") == 4


def test_vllm_path_reports_an_idle_engine_as_idle():
    """vLLM records stats only when its engine steps. Real ``SchedulerStats`` through the plugin: while
    the server has requests in flight the last record stands; once it has had none for the grace
    period, the report says idle with a fresh timestamp (a last record of "1 waiting" cannot freeze
    the replica); malformed records are ignored and counted."""
    from vllm.v1.metrics.stats import SchedulerStats

    from ray_geolb.policy import ReplicaStats
    from ray_geolb.serve import stats_plugin as sp

    sp.reset_stats()
    lg = sp.GeoStatLogger(vllm_config=None, engine_index=0)
    lg.record(SchedulerStats(num_running_reqs=0, num_waiting_reqs=1, kv_cache_usage=0.05), None)
    last = sp.latest_stats()
    assert last["num_waiting"] == 1
    now = last["timestamp"] + 30.0
    busy = sp.routing_stats(last, active=1, idle_since=float("-inf"), now=now)
    assert busy["num_waiting"] == 1 and busy["timestamp"] == last["timestamp"]
    just_idle = sp.routing_stats(last, active=0, idle_since=now - 0.1, now=now)
    assert just_idle["num_waiting"] == 1  # within the grace period: the abort may still be in flight
    idle = sp.routing_stats(last, active=0, idle_since=now - 1.0, now=now)
    rs = ReplicaStats.from_dict(idle, now=now)
    assert (rs.num_waiting, rs.num_running, rs.timestamp) == (0, 0, now)
    lg.record(SchedulerStats(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=float("nan")), None)
    assert lg.bad_records == 1 and sp.latest_stats()["num_waiting"] == 1  # the bad record was dropped
    sp.reset_stats()


def test_stock_llmserver_reports_no_load_and_the_router_says_so(llm_app):
    """Ray Serve LLM's stock ``record_routing_stats`` (here over the emulated engine:
    ``StockStatsLLMServer`` changes nothing else) carries no load figures, so selective pushing would
    run blind: GeoPrefixRouter names each such replica in a warning once and counts it. The router
    runs in this process (the handle's), so its counters are read directly."""
    import asyncio

    from ray.serve.llm import build_llm_deployment

    from ray_geolb.serve.llm_server import emulated_llm_config, llm_protocol
    from ray_geolb.serve.router import GeoPrefixRouter

    cfg = emulated_llm_config("emu-stock", num_replicas=2, server_cls="StockStatsLLMServer",
                              router_kwargs={"policy": "skylb", "load_signal_grace_s": 1.0},
                              time_scale=0.01, output_tokens=2)
    handle = serve.run(build_llm_deployment(cfg), name="stock", route_prefix=None)
    req = llm_protocol().ChatCompletionRequest.model_validate(
        {"model": "emu-stock", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})

    async def one():
        gen = handle.options(stream=True).chat.remote(req, None)
        return await gen.__anext__()

    try:
        deadline = time.time() + 30
        while True:
            asyncio.run(one())  # each call lets the router look at the reports again
            routers = GeoPrefixRouter.instances("stock")
            blind = sum(r.counters.get("no_load_signal", 0) for r in routers)
            if blind >= 2:
                break
            assert time.time() < deadline, [r.counters for r in routers]
            time.sleep(0.5)
        (router,) = routers
        assert router.counters["no_load_signal"] == 2  # both replicas, each counted once
        assert not router.replicas.loaded  # no report from either replica carried a load field
        assert len(router.replicas.blind) == 2
    finally:
        serve.delete("stock")
