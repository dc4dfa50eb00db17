"""ray_geolb.policy has no import circle, and an algorithm file never imports another algorithm's file.

The graph is read from the source (``ast``): every ``import`` / ``from ... import`` statement of every
module under ``ray_geolb/policy``, function-level ones included, relative imports resolved. An edge
goes to the module named (a package's ``__init__`` when a package is named, or the submodule when
``from pkg import submodule``); the implicit import of parent packages is not an edge (a package's
``__init__`` re-exports its submodules, which is not a circle of the code's own making).
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "ray_geolb.policy"
POLICY = ROOT / "ray_geolb" / "policy"


def _modules():
    """Module name -> (path, is_package) for every module under ray_geolb/policy."""
    out = {}
    for path in POLICY.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _imports(name, path, is_pkg, modules):
    """The modules of this package that module ``name`` imports."""
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
            while t and t not in modules:  # `import a.b.c` names a.b.c; a name inside a module: its module
                t = t.rpartition(".")[0]
            if t.startswith(PACKAGE) and t in modules and t != name:
                out.add(t)
    return out


def import_graph():
    modules = _modules()
    return {name: _imports(name, path, is_pkg, modules) for name, (path, is_pkg) in modules.items()}


def find_cycle(graph):
    """One import circle as a list of modules (first == last), or None."""
    color = {n: 0 for n in graph}  # 0 new, 1 on the DFS stack, 2 done
    stack = []

    def visit(n):
        color[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m, 0) == 1:
                return stack[stack.index(m):] + [m]
            if color.get(m, 0) == 0:
                c = visit(m)
                if c:
                    return c
        stack.pop()
        color[n] = 2
        return None

    for n in sorted(graph):
        if color[n] == 0:
            c = visit(n)
            if c:
                return c
    return None


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
