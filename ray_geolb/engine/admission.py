"""Which requests an engine can ever run, and what SGLang reserves when it admits one.

Pure functions of an :class:`~ray_geolb.engine.profiles.EngineProfile` or
:class:`~ray_geolb.engine.engine.EngineConfig` (anything with their fields). Both engine models
(engine.py, sglang.py) and the simulator's client-side rejection use them, so the rule is written
once; this module imports neither model.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["max_new", "max_req_len", "request_fits", "sglang_reservation"]


def max_req_len(cfg) -> int:
    return min(cfg.max_model_len - 1, cfg.num_gpu_blocks * cfg.block_tokens - 1)


def max_new(cfg, prompt_tokens: int, max_new_tokens: Optional[int]) -> int:
    """SGLang's max_new_tokens of a request (``scheduler.py:1019-1026``)."""
    return max_new_tokens if max_new_tokens is not None else max_req_len(cfg) - prompt_tokens - 1


def sglang_reservation(cfg, prompt_tokens: int, max_new_tokens: Optional[int]) -> int:
    """Output tokens SGLang reserves when it admits the request: ``min(max_new, clip)``."""
    return min(max_new(cfg, prompt_tokens, max_new_tokens), cfg.sgl_clip_max_new_tokens)


def request_fits(cfg, prompt_tokens: int, output_tokens: int, max_new_tokens: Optional[int] = None) -> bool:
    """Whether an engine with ``cfg`` (an :class:`EngineProfile` or :class:`EngineConfig`) can ever run
    the request: ``prompt + output <= max_model_len``, its KV fits the cache and, in SGLang mode, its
    admission reservation fits an empty cache (engine/sglang.py). ``add_request`` rejects the rest."""
    B = cfg.block_tokens
    if prompt_tokens + output_tokens > cfg.max_model_len:
        return False
    if (prompt_tokens + output_tokens - 1 + B - 1) // B > cfg.num_gpu_blocks:
        return False
    if cfg.admission == "sglang":
        return prompt_tokens + sglang_reservation(cfg, prompt_tokens, max_new_tokens) < cfg.num_gpu_blocks * B
    return True
