"""The explicit engine factory: which engine model a profile's ``admission`` mode selects.

``admission="vllm"`` -> :class:`~ray_geolb.engine.engine.EngineModel` (vLLM v1's scheduler);
``admission="sglang"`` -> :class:`~ray_geolb.engine.sglang.SGLangEngineModel`. The config's mode
wins over the profile's. The simulator and the emulated replicas build engines here.
"""

from __future__ import annotations

from typing import Optional

from .engine import EngineConfig, EngineModel
from .profiles import EngineProfile, get_profile
from .sglang import SGLangEngineModel

__all__ = ["ENGINE_MODELS", "make_engine"]

ENGINE_MODELS = {"vllm": EngineModel, "sglang": SGLangEngineModel}


def make_engine(profile: EngineProfile | str, config: Optional[EngineConfig] = None) -> EngineModel:
    """The engine model for ``profile`` (a profile or its name) with ``config`` (default: the
    profile's own)."""
    if isinstance(profile, str):
        profile = get_profile(profile)
    mode = config.admission if config is not None else profile.admission
    return ENGINE_MODELS[mode](profile, config)
