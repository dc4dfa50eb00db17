"""Ray Serve LLM with GeoPrefixRouter: ``LLMConfig(..., deployment_config={"request_router_config": ...})``.

Real vLLM (needs a GPU)::

    python examples/llmconfig_geoprefix.py --model Qwen/Qwen2.5-0.5B-Instruct --region us

CPU only, emulated engines (the calibrated engine model behind Ray Serve LLM's stock LLMServer /
OpenAiIngress)::

    python examples/llmconfig_geoprefix.py --emulated

Then: ``curl localhost:8000/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model": "<model>", "messages": [{"role": "user", "content": "hi"}]}'``.

The router runs inside the OpenAiIngress replica (it holds the handle to the LLMServer deployment).
Per-replica engine load for selective pushing comes from ``record_routing_stats``; with real vLLM it
is fed by ray_geolb's vLLM stat-logger plugin (entry point ``vllm.stat_logger_plugins``), with
emulated engines by the engine model itself. The router's region is the replicas' node label
``ray.io/availability-region`` (replicas without one count as local).
"""

import argparse
import time

ROUTER = {
    "request_router_class": "ray_geolb.serve.router.GeoPrefixRouter",
    "request_router_kwargs": {
        "policy": "geoprefix",      # the default; or "skylb", "skylb_ch", "ray_prefix",
                                    # {"name": "skylb", "min_match_chars": 256}, ...
        "region": None,             # None = every replica is local; set e.g. "us" in a multi-region cluster
        "queue_bound": 1024,        # requests that may wait in the router (then RouterQueueFull)
        "wait_limit_s": 60.0,       # longest wait in the router (then RouterWaitTimeout)
    },
    "request_routing_stats_period_s": 0.5,
    "request_routing_stats_timeout_s": 5.0,
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--region", default=None, help="router region (None: all replicas local)")
    ap.add_argument("--emulated", action="store_true", help="CPU only: emulated engines instead of vLLM")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)

    import ray
    from ray import serve

    router = dict(ROUTER, request_router_kwargs=dict(ROUTER["request_router_kwargs"], region=args.region))
    runtime_env = {}
    if args.emulated:
        # CPU-only venvs often carry CUDA builds of torchvision/torchaudio that crash `import vllm`
        # (pulled in by ray.serve.llm); the guard blocks them in this process and in every worker
        # (including the Serve controller, which unpickles the LLM app).
        from ray_geolb.serve.llm_server import GUARD_HOOK, guard_broken_torch_extras

        guard_broken_torch_extras()
        runtime_env = {"worker_process_setup_hook": GUARD_HOOK}
    ray.init(address="local", include_dashboard=False, runtime_env=runtime_env)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    if args.emulated:
        from ray_geolb.serve.llm_server import build_emulated_openai_app, emulated_llm_config

        cfg = emulated_llm_config(model_id=args.model, num_replicas=args.replicas,
                                  router_kwargs=router["request_router_kwargs"], time_scale=1.0)
        app = build_emulated_openai_app([cfg])
    else:
        from ray.serve.llm import LLMConfig, build_openai_app

        cfg = LLMConfig(
            model_loading_config={"model_id": args.model, "model_source": args.model},
            # vLLM's LLMServer + the stat logger that puts the engine's load in its routing stats
            server_cls="ray_geolb.serve.stats_plugin:GeoVLLMServer",
            engine_kwargs={"max_model_len": 8192, "enable_prefix_caching": True},
            deployment_config={
                "num_replicas": args.replicas,
                "request_router_config": router,
            },
        )
        app = build_openai_app({"llm_configs": [cfg]})
    serve.run(app, name="llm", route_prefix="/")
    print(f"serving {args.model} at http://127.0.0.1:{args.port}/v1 (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
