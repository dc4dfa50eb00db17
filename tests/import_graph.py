"""The import graph of a package of this repository, read from its source (``ast``), and a cycle finder;
shared by the tests that keep ``ray_geolb.policy``, ``ray_geolb.serve.ingress`` and ``ray_geolb.engine``
free of import circles.

Every ``import`` / ``from ... import`` statement of every module under the package counts, function-level
ones included, relative imports resolved. An edge goes to the module named (a package's ``__init__`` when
a package is named, or the submodule when ``from pkg import submodule``); the implicit import of parent
packages is not an edge (a package's ``__init__`` re-exports its submodules, which is not a circle of the
code's own making).
"""

import ast

from repo import REPO, parse_python


def modules_of(package):
    """Module name -> (path, is_package) for every module under ``package`` (dotted name)."""
    out = {}
    for path in (REPO / package.replace(".", "/")).rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def imports_of(name, path, is_pkg, modules, package):
    """The modules of ``package`` that module ``name`` imports."""
    pkg = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(parse_python(path.read_text(), str(path))):
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
            if t.startswith(package) and t in modules and t != name:
                out.add(t)
    return out


def import_graph(package):
    """Module -> the set of modules of ``package`` it imports."""
    modules = modules_of(package)
    return {name: imports_of(name, path, is_pkg, modules, package) for name, (path, is_pkg) in modules.items()}


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
