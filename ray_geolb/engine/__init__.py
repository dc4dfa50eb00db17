"""The emulated LLM engine: one engine model, two clocks.

Parts:
  engine.py    :class:`EngineModel`, a vLLM-v1-style replica as a pure state machine
               (continuous batching, paged KV cache, prefix cache), stepped with an explicit ``now``
  sglang.py    SGLang's scheduler (KV reserved for expected output, new-token ratio, retraction)
  admission.py which requests an engine can ever run; SGLang's output reservation
  factory.py   :func:`make_engine`: the model a profile's ``admission`` ("vllm"/"sglang") selects
  profiles.py  calibrated per-GPU performance profiles (step time, KV blocks, TTFT overhead)
  tokens.py    text -> token counts and prompt block hashes (what the prefix cache keys on)
  network.py   inter-region RTT model (:class:`RegionNetwork`, the shipped IBM Cloud table)
  driver.py    :class:`AsyncEngineDriver`, the wall-clock asyncio driver

The same :class:`EngineModel` runs on two clocks: the simulator (``ray_geolb.sim``) steps it in
virtual time; the Ray Serve adapters (``ray_geolb.serve``) step it in (scaled) wall-clock time
through ``driver.py``. Both import this package and stand side by side; nothing here imports
``ray_geolb.sim``, ``ray_geolb.serve`` or Ray.
"""
