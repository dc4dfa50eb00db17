"""ray_geolb.sim has no import circle, function-level imports included (the graph as ``tests/import_graph.py``
reads it from the source): the planner (``plan.py``) drives goodput's searches, and goodput never reaches
back into the planner -- the defaults and the demand loader both use live below them (``goodput.py``,
``workloads/geo_diurnal.py``)."""

from import_graph import find_cycle, import_graph


def test_sim_has_no_import_cycle():
    g = import_graph("ray_geolb.sim")
    assert "ray_geolb.sim.goodput" in g["ray_geolb.sim.plan"]
    cycle = find_cycle(g)
    assert cycle is None, " -> ".join(cycle)
