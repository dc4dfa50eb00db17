"""ray_geolb.policy must stay a pure core: no Ray import, even indirectly."""

import ast
import subprocess
import sys

from repo import REPO, parse_python

POLICY = REPO / "ray_geolb" / "policy"


def test_no_ray_import_in_source():
    offenders = []
    for path in POLICY.rglob("*.py"):
        tree = parse_python(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if n == "ray" or n.startswith("ray.")]
    assert not offenders, offenders
    assert len(list(POLICY.rglob("*.py"))) >= 10


def test_importing_policy_does_not_load_ray():
    code = (
        "import sys, ray_geolb.policy as p; p.build_policy('skylb', targets=['a']);"
        "import ray_geolb.policy.algorithms;"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
