"""Test layout: tests/<package>/ mirrors ray_geolb/<package>/ (policy, engine, sim, serve); each file is
named after the behaviour it checks. Helpers shared across folders live next to this file
(``import_graph.py``, ``policy_cases.py``) and are imported by name (pytest puts this folder on
``sys.path`` because this conftest lives here)."""

import os
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


_EXIT_STATUS = {}


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave the process with pytest's exit status once every report is written, without the
    interpreter's finalization: a full run once segfaulted there (746 passed, 1 skipped, then SIGSEGV
    while Python tore down the C extensions Ray Serve and Ray Serve LLM load), which would turn a green
    run red. Every module has already shut its Ray connection down (``no_ray_left_behind``). Set
    ``GEOLB_TEST_FULL_FINALIZE=1`` to finalize the interpreter as usual."""
    if "status" not in _EXIT_STATUS or os.environ.get("GEOLB_TEST_FULL_FINALIZE"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS["status"])
