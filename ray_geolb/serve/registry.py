"""The registry actor: the Ray actor around :class:`~ray_geolb.policy.region.registry_state.RegistryState`.

:class:`RegionRegistry` is detached, named, ``max_restarts=-1``, ``num_cpus=0``
(:func:`get_or_create_registry`). It is *stateless-restartable*: after a restart it is empty and is
rebuilt by the next heartbeats (every ``period_s``) -- nothing in it is precious. What it holds, how it
is bounded and how it refuses bad heartbeats: ``policy/region/registry_state.py`` (the simulator runs
the same state class). The client each ingress runs is
:class:`~ray_geolb.serve.registry_client.RegistryClient`.

**Trust.** The Ray cluster is the trust boundary. Anything that can call this actor can also kill it,
call any method on it, or read its environment through Ray's ``__ray_call__``; the registry defends
against nothing that runs in the cluster. The optional secret (:data:`SECRET_ENV`) is a guard against
*accidents* -- two deployments sharing one cluster and registry namespace by mistake, a stale ingress
of an old deployment, a test harness pointed at the wrong registry: heartbeats without it are refused
and counted. It is not authentication: it sits in plain environment variables of the registry and
ingress actors, where any process of the cluster can read it and then forge any heartbeat.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

from ray_geolb.policy.region.registry_state import SECRET_ENV, RegistryState

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_NAMESPACE",
    "RegionRegistry",  # noqa: F822 - built lazily by __getattr__ (importing this module must not import ray)
    "get_or_create_registry",
    "standby_name",
]

DEFAULT_NAME = "geolb_registry"
DEFAULT_NAMESPACE = "geolb"


def standby_name(name: str, region: str) -> str:
    """The actor name of the standby registry in ``region`` beside the registry ``name``
    (``RegistryOptions.standbys``)."""
    return f"{name}.standby.{region}"


# ---------------------------------------------------------------------------------------------- actor
def _actor_class():
    import ray

    @ray.remote(num_cpus=0, max_restarts=-1)
    class RegionRegistry:
        """Ray actor around :class:`RegistryState` (detached and named; see get_or_create_registry)."""

        def __init__(self, config: Optional[dict] = None):
            cfg = dict(config or {})
            cfg.setdefault("secret", os.environ.get(SECRET_ENV) or None)  # never passed as an argument
            self.state = RegistryState(**cfg)

        def heartbeat_batch(self, items: List[dict]) -> dict:
            return self.state.heartbeat_batch(items)

        def add_regions(self, regions: Union[List[str], Dict[str, int]]) -> List[str]:
            """A (re)deployment's regions, as names or ``{region: num_replicas}`` (which also registers
            their replica counts, the ceiling of what their heartbeats may claim:
            ``RegistryState.add_regions``). Like every method here, any process of the cluster can call
            it: the cluster is the trust boundary."""
            return self.state.add_regions(regions)

        def table(self) -> dict:
            return self.state.table()

        def snapshot(self, region: str) -> Optional[dict]:
            return self.state.snapshot(region)

        def stats(self) -> dict:
            """``RegistryState.stats`` and ``node_region``: the region label of the node it runs on."""
            from ray_geolb.serve.local import REGION_LABEL

            out = self.state.stats()
            out["node_region"] = ray.get_runtime_context().get_node_labels().get(REGION_LABEL)
            return out

        def ping(self) -> str:
            return "ok"

    return RegionRegistry


_ACTOR_CLS = None


def __getattr__(name):  # lazy: importing this module must not import ray
    global _ACTOR_CLS
    if name == "RegionRegistry":
        if _ACTOR_CLS is None:
            _ACTOR_CLS = _actor_class()
        return _ACTOR_CLS
    raise AttributeError(name)


def get_or_create_registry(name: str = DEFAULT_NAME, namespace: str = DEFAULT_NAMESPACE,
                           config: Optional[dict] = None, label_selector: Optional[dict] = None):
    """The named detached registry actor, created if it does not exist (race-free: ``get_if_exists``).

    ``config``: ``RegistryState`` kwargs, used only if this call creates the actor (and again whenever
    Ray restarts it). Its ``regions`` are the deployment's; an actor that already exists keeps its own
    list: call its ``add_regions`` to add a redeployment's (``app.deploy_region_apps`` and
    ``RegistryClient`` do)."""
    if config is not None:
        RegistryState(**config)  # validate here, with a clear error, not in the actor
    cls = __getattr__("RegionRegistry")
    opts: Dict[str, Any] = dict(name=name, namespace=namespace, lifetime="detached", get_if_exists=True)
    if label_selector:
        opts["label_selector"] = dict(label_selector)
    return cls.options(**opts).remote(config)
