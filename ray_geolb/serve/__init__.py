"""Ray Serve adapters: GeoPrefixRouter (router.py), emulated servers (llm_server.py), vLLM stats plugin.

Kept light on purpose: importing ``ray_geolb.serve`` imports nothing heavy. Import the submodules
you need (``ray_geolb.serve.router`` imports ``ray.serve``; ``ray_geolb.serve.llm_server`` imports
``ray.serve.llm``).

This module also holds the per-process router registry and :class:`CallTicket` (the id of a model
call, carrying its RouteRequest from the ingress to the router and the decision back). They live
here, not in ``router.py``, because Ray Serve cloudpickles a custom router class *together with its
module by value*: in a replica process the router class is a copy with its own module globals, so
a registry defined in router.py would be invisible to other code in that process.
``ray_geolb.serve`` is imported by reference, so every copy of the router class writes to this one
registry and knows this one ticket class.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import Any, List, Optional, Tuple

__all__ = ["CallTicket", "handed_count", "open_sibling_channel", "register_router", "request_of_call", "router_for",
           "routers", "ticket_id"]

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


#: True once a region ingress of this process shares its routers' inserts with its sibling ingress replicas
#: (``serve/ingress/siblings.py``): a GeoPrefixRouter created after that keeps its dispatches for the siblings
#: from its very first one, not from the ingress's next heartbeat (which enables the box, too)
SIBLING_CHANNEL_OPEN = False


def open_sibling_channel() -> None:
    global SIBLING_CHANNEL_OPEN
    SIBLING_CHANNEL_OPEN = True


# ---------------------------------------------------------------------------------------------- the call's ticket
# The region ingress canonicalises each prompt (and may hash it into the local index's blocks while
# it prices staying); the GeoPrefixRouter of the same process would do both again for the same
# call, and the ingress wants the router's placement back for its response. Both travel with the
# call: the id the ingress mints for it is a CallTicket, sent as the request object's ``request_id``
# (never the client's x-request-id, which two requests may share). Ray hands the router the very
# request object the ingress passed to the handle (same process), so the router reads the ticket's
# RouteRequest when it first sees the call (``take``) and writes its decision on it when the call is
# routed. Pickled -- to the replica -- a ticket is its plain id: nothing of the ingress leaves it.
_LOCK_HANDED = threading.Lock()
_N_HANDED = 0  # tickets whose RouteRequest is neither taken nor withdrawn (leak checks)


#: the characters of a request id a ticket keeps (the rest become "_"), and how many of them
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
_ID_KEEP = 64


def ticket_id(request_id: Optional[str] = None) -> str:
    """A model call's id: ``<request id>~<random hex>`` (the request's id cut to 64 safe characters), or
    the random hex alone. Unique per call; the engine counts the calls it ran by the part before ``~``
    (:func:`request_of_call`), so a request run twice anywhere is seen under its own id."""
    if not request_id:
        return uuid.uuid4().hex
    rid = "".join(c if c in _ID_CHARS else "_" for c in str(request_id)[:_ID_KEEP])
    return f"{rid}~{uuid.uuid4().hex}"


def request_of_call(call_id: str) -> str:
    """The request id a model call's id names (:func:`ticket_id`; the whole id if it names none)."""
    return str(call_id).split("~", 1)[0]


class CallTicket(str):
    """One model call's id, minted by the ingress (a random hex string), carrying the call's
    ``route_request`` to the router (taken once: :meth:`take`; dropped when the call ends:
    :meth:`withdraw`) and the router's ``decision`` back (replica, reason, matched, queue wait)."""

    __slots__ = ("route_request", "decision")

    def __new__(cls, route_request: Any = None, request_id: Optional[str] = None) -> "CallTicket":
        global _N_HANDED
        t = super().__new__(cls, ticket_id(request_id))
        t.route_request = route_request
        t.decision = None
        if route_request is not None:
            with _LOCK_HANDED:
                _N_HANDED += 1
        return t

    def __reduce__(self):
        return (str, (str(self),))  # pickled as the plain id (the replica, vLLM's request name)

    def take(self) -> Optional[Any]:
        """The RouteRequest the ingress prepared, the first time (None after, or without one)."""
        global _N_HANDED
        with _LOCK_HANDED:
            rr, self.route_request = self.route_request, None
            if rr is not None:
                _N_HANDED -= 1
        return rr

    def withdraw(self) -> None:
        """The call ended: drop the RouteRequest if the router never took it."""
        self.take()


def handed_count() -> int:
    """Route requests handed over and not yet taken or withdrawn (0 when idle; leak checks)."""
    return _N_HANDED
