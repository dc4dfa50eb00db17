"""Test layout: tests/<package>/ mirrors ray_geolb/<package>/ (policy, engine, sim, serve); each file is
named after the behaviour it checks. Helpers shared across folders live next to this file
(``import_graph.py``, ``policy_cases.py``) and are imported by name (pytest puts this folder on
``sys.path`` because this conftest lives here)."""

import sys

import pytest


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_behind():
    """Each test module leaves no Ray connection behind. Building a Ray Serve LLM app offline
    (``build_llm_deployment``, ``region_app``) auto-initialises a local Ray in this process; a later
    module that starts its own cluster (``ray.init(address=...)``) would then fail with "called
    ray.init twice"."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
