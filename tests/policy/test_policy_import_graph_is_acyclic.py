"""ray_geolb.policy has no import circle, and an algorithm file never imports another algorithm's file
(the graph as ``tests/import_graph.py`` reads it from the source)."""

from import_graph import find_cycle
from import_graph import import_graph as _graph

PACKAGE = "ray_geolb.policy"


def import_graph():
    return _graph(PACKAGE)


def test_the_cycle_finder_finds_a_circle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_relative_and_function_level_imports():
    g = import_graph()
    assert "ray_geolb.policy.base" in g["ray_geolb.policy.algorithms.skylb"]
    assert "ray_geolb.policy.region.config" in g["ray_geolb.policy.region.router"]
    assert "ray_geolb.policy.factory" in g["ray_geolb.policy"]
    assert len(g) >= 30


def test_policy_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_algorithm_files_import_only_bases_and_helpers():
    g = import_graph()
    algo = "ray_geolb.policy.algorithms."
    offenders = {n: sorted(m for m in deps if m.startswith(algo) or m == algo[:-1])
                 for n, deps in g.items() if n.startswith(algo)}
    assert not any(offenders.values()), offenders
