"""ray_geolb.serve.ingress has no import circle: its parts are classes that own their state, each
module importing only the ones below it (config, errors, context -> openai, streams, local_view,
admission, peers -> request_path -> deployment -> the package ``__init__``).

The graph is read from the source by ``tests/import_graph.py``, as for ``ray_geolb.policy``.
"""

import pytest

from import_graph import find_cycle, import_graph

INGRESS = "ray_geolb.serve.ingress"


def test_the_graph_sees_the_ingress_parts():
    g = import_graph(INGRESS)
    assert ({f"{INGRESS}.{m}" for m in ("admission", "local_view", "peers", "openai", "streams")}
            <= g[f"{INGRESS}.request_path"])
    assert f"{INGRESS}.request_path" in g[f"{INGRESS}.deployment"]
    assert f"{INGRESS}.deployment" in g[INGRESS]


@pytest.mark.parametrize("package", [INGRESS, "ray_geolb.engine", "ray_geolb.serve"])
def test_package_has_no_import_cycle(package):
    cycle = find_cycle(import_graph(package))
    assert cycle is None, " -> ".join(cycle)


def test_no_ingress_part_imports_the_package_or_the_deployment():
    """Only the package ``__init__`` re-exports; a part importing it (or the deployment) would close a circle."""
    g = import_graph(INGRESS)
    for name, deps in g.items():
        if name != INGRESS:
            assert INGRESS not in deps, name
            if name != f"{INGRESS}.deployment":
                assert f"{INGRESS}.deployment" not in deps, name
