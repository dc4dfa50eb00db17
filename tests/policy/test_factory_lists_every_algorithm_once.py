"""policy/factory.py lists every algorithm explicitly: each Policy class defined under
``policy/algorithms/`` appears in ``POLICY_CLASSES`` exactly once, under its own ``name``."""

import importlib
import inspect

import pytest

from ray_geolb.policy import Policy, build_policy, policy_class, policy_names
from ray_geolb.policy.factory import POLICY_CLASSES, UnknownPolicyError
from repo import REPO

ALGORITHMS = REPO / "ray_geolb" / "policy" / "algorithms"


def _algorithm_classes():
    """Every buildable policy class an algorithm file defines (its own ``name`` and ``Config``)."""
    out = []
    for path in sorted(ALGORITHMS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        mod = importlib.import_module(f"ray_geolb.policy.algorithms.{path.stem}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if (cls.__module__ == mod.__name__ and issubclass(cls, Policy)
                    and "name" in vars(cls) and "Config" in vars(cls)):
                out.append(cls)
    return out


def test_the_table_names_every_algorithm_class_exactly_once():
    classes = _algorithm_classes()
    assert len(classes) == len(set(classes)) >= 16
    table = list(POLICY_CLASSES.values())
    assert len(table) == len(set(table)), "a class is listed twice"
    assert set(table) == set(classes), {"missing": set(classes) - set(table), "extra": set(table) - set(classes)}


@pytest.mark.parametrize("name", sorted(POLICY_CLASSES))
def test_each_entry_is_keyed_by_its_own_name_and_builds(name):
    cls = POLICY_CLASSES[name]
    assert cls.name == name and cls.Config().name == name and policy_class(name) is cls
    p = build_policy(name, targets=["a", "b"])
    assert type(p) is cls and p.config.name == name


def test_names_are_sorted_and_unknown_names_are_refused():
    assert policy_names() == sorted(POLICY_CLASSES)
    with pytest.raises(UnknownPolicyError, match="known policies: br0, consistent_hash"):
        policy_class("nope")
    with pytest.raises(UnknownPolicyError, match="config is for 'gorgo', not 'skylb'"):
        POLICY_CLASSES["skylb"]({"name": "gorgo"})
