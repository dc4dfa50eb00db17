"""The simulator and the Ray Serve adapters are two drivers of one core: ``ray_geolb/sim`` and
``ray_geolb/serve`` each stand on ``policy/`` and ``engine/`` and import nothing from each other (the
registry's state, the peer-table reader and the snapshot protocol live in ``policy/region/``, which both
use). So a simulated result is a result about the shipped policy code, not about the Serve adapters."""

import ast
import subprocess
import sys

from repo import REPO, parse_python


def _imports_of(package_dir, forbidden):
    offenders = []
    pkg_parts = list(package_dir.relative_to(REPO).parts)
    for path in package_dir.rglob("*.py"):
        here = list(path.relative_to(REPO).with_suffix("").parts)[:-1]
        for node in ast.walk(parse_python(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    names = [".".join(base + ([node.module] if node.module else []))]
                else:
                    names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names
                          if n == forbidden or n.startswith(forbidden + ".")]
    assert pkg_parts[0] == "ray_geolb"
    return offenders


def test_the_simulator_imports_nothing_from_serve():
    assert _imports_of(REPO / "ray_geolb" / "sim", "ray_geolb.serve") == []


def test_serve_imports_nothing_from_the_simulator():
    assert _imports_of(REPO / "ray_geolb" / "serve", "ray_geolb.sim") == []


def test_running_a_simulation_loads_no_serve_module():
    code = (
        "import sys; from ray_geolb.sim.scenarios import run_one; import ray_geolb.sim.cli, ray_geolb.sim.simulator;"
        "print(sorted(m for m in sys.modules if m == 'ray_geolb.serve' or m.startswith('ray_geolb.serve.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
