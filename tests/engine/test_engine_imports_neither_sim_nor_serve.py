"""ray_geolb.engine stands beside sim/ and serve/: it imports neither of them, nor Ray."""

import ast
import subprocess
import sys

from repo import REPO, parse_python

ENGINE = REPO / "ray_geolb" / "engine"
FORBIDDEN = ("ray", "ray_geolb.sim", "ray_geolb.serve")


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_engine_source_imports_no_sim_serve_or_ray():
    offenders = []
    for path in ENGINE.rglob("*.py"):
        tree = parse_python(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                # relative imports must stay inside the package (level 1 = ray_geolb.engine)
                if node.level > 1:
                    offenders.append(f"{path.name}: relative import leaving ray_geolb.engine")
                    continue
                names = [node.module or ""] if node.level == 0 else []
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if _forbidden(n)]
    assert not offenders, offenders
    assert {p.name for p in ENGINE.glob("*.py")} >= {
        "__init__.py", "engine.py", "profiles.py", "tokens.py", "driver.py", "network.py"}


def test_importing_engine_loads_no_sim_serve_or_ray():
    code = (
        "import sys, ray_geolb.engine.engine, ray_geolb.engine.driver, ray_geolb.engine.network,"
        " ray_geolb.engine.profiles, ray_geolb.engine.tokens;"
        "print(sorted(m for m in sys.modules if m in ('ray', 'ray_geolb.sim', 'ray_geolb.serve')"
        " or m.startswith(('ray.', 'ray_geolb.sim.', 'ray_geolb.serve.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
