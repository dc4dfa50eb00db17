"""Ray Serve adapters: GeoPrefixRouter (router.py), emulated servers (llm_server.py), vLLM stats plugin.

Kept light on purpose: importing ``ray_geolb.serve`` imports nothing heavy. Import the submodules
you need (``ray_geolb.serve.router`` imports ``ray.serve``; ``ray_geolb.serve.llm_server`` imports
``ray.serve.llm``).

This module also holds the per-process router registry. It lives here, not in ``router.py``, because
Ray Serve cloudpickles a custom router class *together with its module by value*: in a replica
process the router class is a copy with its own module globals, so a registry defined in router.py
would be invisible to other code in that process. ``ray_geolb.serve`` is imported by reference,
so every copy of the router class writes to this one registry.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, List, Optional, Tuple

__all__ = ["hand_over", "register_router", "routers", "router_for", "take_over", "withdraw"]

_LOCK = threading.Lock()
# (app_name, deployment_name) -> list of weak references, oldest first
_ROUTERS: dict = {}
#: bumped at every registration: a cached router lookup is current while this is unchanged
GENERATION = 0


def register_router(key: Tuple[str, str], router: Any) -> None:
    global GENERATION
    with _LOCK:
        GENERATION += 1
        refs = [r for r in _ROUTERS.get(key, []) if r() is not None]
        refs.append(weakref.ref(router))
        _ROUTERS[key] = refs


def routers(app_name: Optional[str] = None, deployment_name: Optional[str] = None) -> List[Any]:
    """Live GeoPrefixRouter instances in this process, optionally for one app / deployment."""
    out = []
    with _LOCK:
        for (app, dep), refs in _ROUTERS.items():
            if app_name is not None and app != app_name:
                continue
            if deployment_name is not None and dep != deployment_name:
                continue
            out.extend(r() for r in refs if r() is not None)
    return out


def router_for(app_name: str, deployment_name: str) -> Optional[Any]:
    """The most recently created live router for that deployment in this process, or None."""
    rs = routers(app_name, deployment_name)
    return rs[-1] if rs else None


# ---------------------------------------------------------------------------------------------- hand-over
# The region ingress canonicalises each prompt (and may hash it into the local index's blocks while
# it prices staying); the GeoPrefixRouter of the same process would do both again for the same
# call. The ingress hands its RouteRequest over under an id it minted for the call (LocalSlot.call_id,
# sent as the request object's ``request_id``; never the client's x-request-id, which two requests
# may share), the router takes it when it first sees that call (request_book.py), and the ingress
# withdraws it when the call ends whatever happened, so nothing stays here. Plain dict operations:
# atomic under the GIL.
_HANDED: dict = {}


def hand_over(call_id: Optional[str], route_request: Any) -> None:
    if call_id:
        _HANDED[call_id] = route_request


def take_over(call_id: Optional[str]) -> Optional[Any]:
    return _HANDED.pop(call_id, None) if call_id else None


def withdraw(call_id: Optional[str]) -> None:
    if call_id:
        _HANDED.pop(call_id, None)


def handed_count() -> int:
    """Prompts handed over and not yet taken or withdrawn (0 when idle; leak checks)."""
    return len(_HANDED)
