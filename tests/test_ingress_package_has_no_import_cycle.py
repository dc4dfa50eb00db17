"""ray_geolb.serve.ingress has no import circle: its parts are classes that own their state, each
module importing only the ones below it (config, errors, context -> openai, streams, local_view,
admission, peers -> request_path -> deployment -> the package ``__init__``).

The graph is read from the source as in ``test_policy_import_graph_is_acyclic.py`` (whose cycle
finder it reuses): every ``import`` / ``from ... import`` of every module of the package,
function-level ones included, relative imports resolved; the implicit import of parent packages is
not an edge.
"""

import ast
import pathlib

import pytest
from test_policy_import_graph_is_acyclic import find_cycle

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _modules(package):
    out = {}
    for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _imports(name, path, is_pkg, modules, package):
    pkg = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] if node.module else []
            targets += [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
            if not node.module and not targets:
                targets = [mod]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t.startswith(package) and t in modules and t != name:
                out.add(t)
    return out


def import_graph(package):
    modules = _modules(package)
    return {name: _imports(name, path, is_pkg, modules, package) for name, (path, is_pkg) in modules.items()}


INGRESS = "ray_geolb.serve.ingress"


def test_the_graph_sees_the_ingress_parts():
    g = import_graph(INGRESS)
    assert {f"{INGRESS}.{m}" for m in ("admission", "local_view", "peers", "openai", "streams")} <= g[f"{INGRESS}.request_path"]
    assert f"{INGRESS}.request_path" in g[f"{INGRESS}.deployment"]
    assert f"{INGRESS}.deployment" in g[INGRESS]


@pytest.mark.parametrize("package", [INGRESS])
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
