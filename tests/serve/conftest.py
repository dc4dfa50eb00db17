"""Fixtures of the serve tests. The stand-ins for tests without a cluster are in ``fakes.py``; the
three-region cluster is ``region_cluster.region_cluster`` (tests/region_cluster.py)."""

import pytest


@pytest.fixture(scope="module")
def serve_cluster(request):
    """A new local single-node Ray cluster of the test module's own, with Serve started on it (one HTTP
    proxy on 127.0.0.1 at a free port); yields the proxy's base URL, and shuts Serve and Ray down after
    the module (module-scoped: every module that asks for it gets its own cluster). A module may set
    ``SERVE_CLUSTER`` = keyword arguments of ``ray_geolb.serve.local.start_local_ray`` (``prefix`` of the
    cluster's temp dir, ``num_cpus``, ``ray.init`` arguments such as ``runtime_env``); the defaults are
    4 CPUs and Ray's warnings only."""
    ray = pytest.importorskip("ray")
    from ray import serve

    from ray_geolb.serve.local import free_port, start_local_ray

    options = {"num_cpus": 4, "prefix": "rgS", "logging_level": "warning"}
    start_local_ray(**{**options, **getattr(request.module, "SERVE_CLUSTER", {})})
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
        serve.shutdown()
    finally:
        ray.shutdown()
