"""The simulator and the planner stay readable: no function in ``ray_geolb/sim/`` (the planner, goodput,
attribution and the demands included) is over 80 lines, and the ``Simulator`` class -- the event loop --
is at most 520 lines. A newcomer should find each algorithm in one short, named piece."""

import ast

from repo import REPO, parse_python

MAX_FUNCTION_LINES = 80
MAX_SIMULATOR_LINES = 520


def _defs():
    for path in sorted((REPO / "ray_geolb" / "sim").rglob("*.py")):
        tree = parse_python(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield path.relative_to(REPO), node, node.end_lineno - node.lineno + 1


def test_no_sim_function_is_over_80_lines():
    defs = list(_defs())
    assert any(isinstance(n, ast.FunctionDef) for _, n, _ in defs)  # the walk found the code
    long = [f"{p}:{n.lineno} {n.name} ({lines} lines)" for p, n, lines in defs
            if not isinstance(n, ast.ClassDef) and lines > MAX_FUNCTION_LINES]
    assert long == [], long


def test_the_simulator_class_is_at_most_520_lines():
    sizes = {n.name: lines for p, n, lines in _defs() if isinstance(n, ast.ClassDef) and p.name == "simulator.py"}
    assert "Simulator" in sizes
    assert sizes["Simulator"] <= MAX_SIMULATOR_LINES, sizes["Simulator"]
