"""Ray Serve LLM's direct streaming, which GeoPrefixRouter refuses.

With ``RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1`` (Ray 2.60) the LLM app routes through an internal
``LLMRouter`` that calls ``choose_replicas`` (``choose_replica(_reserve=False)``) and then streams
from vLLM's own FastAPI app: Ray never calls ``on_request_routed`` nor ``on_request_completed``.
GeoPrefixRouter's reservations and in-flight counts (what SP-P credits are computed from) would
never be released, and every replica would look busy forever. Supporting it would mean inferring
completions from the replicas' reports alone; we refuse it instead, with an error that names the
variable: at build time (the region-app builder and the servers' ``get_deployment_options``, which
run in the process that deploys) and when a router starts (its process may have the variable even
if the deploying one did not).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

__all__ = ["DIRECT_STREAMING_ENV", "DirectStreamingUnsupported", "direct_streaming_enabled",
           "refuse_direct_streaming", "routes_with_geoprefix"]

DIRECT_STREAMING_ENV = "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"
_FALSE = ("", "0", "false", "no", "off")


class DirectStreamingUnsupported(RuntimeError):
    pass


def direct_streaming_enabled(env: Optional[Mapping[str, str]] = None) -> bool:
    value = (os.environ if env is None else env).get(DIRECT_STREAMING_ENV)
    return value is not None and value.strip().lower() not in _FALSE


def _runtime_env_vars(llm_config: Any) -> Mapping[str, str]:
    """The env vars an LLMConfig asks its replicas' runtime env to set (both places it can say so)."""
    out = {}
    for env in (getattr(llm_config, "runtime_env", None),
                ((getattr(llm_config, "deployment_config", None) or {}).get("ray_actor_options") or {})
                .get("runtime_env")):
        if isinstance(env, dict):
            out.update(env.get("env_vars") or {})
    return out


def routes_with_geoprefix(llm_config: Any) -> bool:
    """True if ``llm_config``'s deployment uses GeoPrefixRouter (a class or its dotted path)."""
    rrc = ((getattr(llm_config, "deployment_config", None) or {}).get("request_router_config") or {})
    cls = rrc.get("request_router_class") if isinstance(rrc, dict) else getattr(rrc, "request_router_class", None)
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", "")
    return "GeoPrefixRouter" in (name or "")


def refuse_direct_streaming(where: str, llm_config: Any = None) -> None:
    """Raise :class:`DirectStreamingUnsupported` if direct streaming is on in this process or in the
    runtime env ``llm_config`` gives its replicas (only when ``llm_config`` routes with GeoPrefixRouter,
    if one is given)."""
    if llm_config is not None and not routes_with_geoprefix(llm_config):
        return
    in_replicas = llm_config is not None and direct_streaming_enabled(_runtime_env_vars(llm_config))
    if direct_streaming_enabled() or in_replicas:
        raise DirectStreamingUnsupported(
            f"{where}: {DIRECT_STREAMING_ENV} is set, and GeoPrefixRouter does not support Ray Serve LLM's direct "
            "streaming (Ray never calls on_request_routed/on_request_completed there, so its in-flight counts "
            f"would never be released). Unset {DIRECT_STREAMING_ENV} or use another request router.")
