"""Every routing algorithm by name, in one explicit table, and the functions that build them.

``POLICY_CLASSES`` maps a policy name to its class; adding an algorithm is one file under
``algorithms/`` and one line here (no import side effect registers anything). A class parses its own
config (:meth:`~ray_geolb.policy.base.Policy.parse_config` with its nested ``Config``); this module
only maps names to classes::

    build_policy("skylb", targets=[...])
    build_policy({"name": "geoprefix", "min_match_chars": 512}, targets=[...])

An unknown name raises :class:`~ray_geolb.policy.base.UnknownPolicyError` listing the known ones.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Type

from .algorithms.balanceroute import BR0, JsqLoad, VllmDefault
from .algorithms.consistent_hash import ConsistentHash
from .algorithms.flowkv import FlowKV
from .algorithms.geoprefix import GeoPrefix
from .algorithms.gorgo import Gorgo, GorgoProxy
from .algorithms.gorgo_v2 import GorgoV2
from .algorithms.least_load import LeastLoad
from .algorithms.oracle import Oracle
from .algorithms.power_of_two import PowerOfTwo
from .algorithms.ray_prefix import RayPrefixAffinity
from .algorithms.round_robin import RoundRobin
from .algorithms.sglang import SGLangCacheAware
from .algorithms.skylb import SkyLB
from .algorithms.skylb_ch import SkyLBCH
from .base import Policy, UnknownPolicyError
from .config import PolicyConfig

__all__ = ["POLICY_CLASSES", "UnknownPolicyError", "policy_class", "policy_names", "parse_policy_config",
           "config_for", "build_policy"]

#: policy name -> class (each class's ``name`` is its key; a test checks the table)
POLICY_CLASSES: Dict[str, Type[Policy]] = {
    # single-region baselines (blind pushing)
    "round_robin": RoundRobin,
    "least_load": LeastLoad,
    "power_of_two": PowerOfTwo,
    "consistent_hash": ConsistentHash,
    "sglang": SGLangCacheAware,
    "ray_prefix": RayPrefixAffinity,
    "vllm_default": VllmDefault,
    "jsq_load": JsqLoad,
    "br0": BR0,
    # selective pushing (SkyLB's availability) and the TTFT-cost family
    "oracle": Oracle,
    "skylb": SkyLB,
    "skylb_ch": SkyLBCH,
    "gorgo": Gorgo,
    "gorgo_proxy": GorgoProxy,
    "gorgo2": GorgoV2,
    "flowkv": FlowKV,
    "geoprefix": GeoPrefix,
}


def policy_names() -> List[str]:
    return sorted(POLICY_CLASSES)


def policy_class(name: Any) -> Type[Policy]:
    """The class of policy ``name``; UnknownPolicyError (listing the known names) if there is none."""
    if not isinstance(name, str) or name not in POLICY_CLASSES:
        raise UnknownPolicyError(f"policy.name: unknown policy {name!r}; "
                                 f"known policies: {', '.join(sorted(POLICY_CLASSES))}")
    return POLICY_CLASSES[name]


def parse_policy_config(spec: Any) -> PolicyConfig:
    """A config from a name, a dict (with 'name') or a config object."""
    if isinstance(spec, PolicyConfig):
        policy_class(spec.name)
        return spec
    if isinstance(spec, str):
        return policy_class(spec).Config()
    if isinstance(spec, dict):
        if "name" not in spec:
            raise UnknownPolicyError("policy.name: missing; a policy config needs a 'name'")
        return policy_class(spec["name"]).Config.model_validate(spec)
    raise TypeError(f"policy config must be a name, a dict or a PolicyConfig, got {type(spec).__name__}")


def config_for(name: str, cfg: Any) -> PolicyConfig:
    """Policy ``name``'s config from None (its defaults), a dict of its fields or a config object."""
    return policy_class(name).parse_config(cfg)


def build_policy(spec: Any, targets: Iterable = (), **kw) -> Policy:
    """Build a policy from a name, a dict or a config: ``build_policy("skylb", targets=[...])``."""
    cfg = parse_policy_config(spec)
    return policy_class(cfg.name)(cfg, targets=targets, **kw)
