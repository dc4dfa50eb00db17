"""Guard: no test asserts something for every element of a collection it filled itself without first
asserting that the collection is not empty.

``dispatch_ok = []`` filled by a trace callback, then ``assert all(dispatch_ok)``, passes when the
scenario never produced a single case: ``all([])`` is True. An AST scan of ``tests/`` finds every
*collector* -- a name a test function binds to an empty container (``[]``, ``{}``, ``set()``, ...) or to
a filtered comprehension (``[x for x in xs if ...]``) -- that the function later asserts over, with
``assert all(... N ...)`` or ``for x in N: ... assert ...``, and requires an earlier ``assert`` in the
same function (or the same assert) that mentions ``N`` outside ``all()``: ``assert N``,
``assert len(N) > 0``, ``assert N == [...]``, ``assert sum(... in N) > 0``, ``assert N and all(...)``.
Uses inside a loop over something else are not judged (whether the collector can be empty there
depends on that loop).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from repo import REPO, parse_python

_EMPTY_CALLS = {"list", "dict", "set", "tuple"}


def _is_collector_value(v: ast.AST) -> bool:
    if isinstance(v, (ast.List, ast.Tuple, ast.Set)) and not v.elts:
        return True
    if isinstance(v, ast.Dict) and not v.keys:
        return True
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in _EMPTY_CALLS and not v.args:
        return True
    if isinstance(v, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return any(g.ifs for g in v.generators)
    return False


def _root_name(it: ast.AST) -> Optional[str]:
    """The collection an iterable expression walks: ``N``, ``N[a:b]``, ``N.values()``, ``sorted(N)``..."""
    while True:
        if isinstance(it, ast.Name):
            return it.id
        if isinstance(it, ast.Subscript):
            it = it.value
        elif isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not it.args:
            it = it.func.value  # N.values() / N.items() / N.keys()
        elif isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and len(it.args) == 1 and \
                it.func.id in ("sorted", "list", "set", "tuple", "reversed", "enumerate"):
            it = it.args[0]
        else:
            return None


def _all_over(test: ast.AST) -> List[str]:
    """Collections that ``all(...)`` calls in an assert's test iterate."""
    out = []
    for node in ast.walk(test):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "all" and node.args:
            arg = node.args[0]
            its = [g.iter for g in arg.generators] if isinstance(arg, (ast.GeneratorExp, ast.ListComp)) else [arg]
            out += [n for n in map(_root_name, its) if n]
    return out


def _mentions_outside_all(test: ast.AST, name: str) -> bool:
    """``name`` appears in the assert's test other than inside an ``all(...)`` call."""
    stack = [test]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "all":
            continue
        if isinstance(node, ast.Name) and node.id == name:
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _uses(body: list, collectors: set) -> Iterator[Tuple[str, int]]:
    """(collector, line) of every assert-over-all-elements of a collector in these statements, outside
    loops (a use inside a loop over something else depends on that loop) and nested functions."""
    for node in body:
        if isinstance(node, ast.Assert):
            for n in _all_over(node.test):
                if n in collectors:
                    yield n, node.lineno
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            n = _root_name(node.iter)
            if n in collectors and any(isinstance(b, ast.Assert) for b in node.body):
                yield n, node.lineno
        elif isinstance(node, (ast.If, ast.With, ast.AsyncWith, ast.Try)):
            for part in ("body", "orelse", "finalbody", "handlers"):
                yield from _uses(getattr(node, part, []) or [], collectors)
        elif isinstance(node, ast.ExceptHandler):
            yield from _uses(node.body, collectors)


def unguarded(source: str, filename: str = "<test>") -> List[str]:
    """``file:line test: name`` for every assert over a possibly empty collector (module docstring)."""
    found = []
    for fn in ast.walk(parse_python(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.name.startswith("test"):
            continue
        collectors = {t.id for node in ast.walk(fn) if isinstance(node, ast.Assign) and _is_collector_value(node.value)
                      for t in node.targets if isinstance(t, ast.Name)}
        if not collectors:
            continue
        checks = [node for node in ast.walk(fn) if isinstance(node, ast.Assert)]
        for name, line in _uses(fn.body, collectors):
            if not any(a.lineno <= line and _mentions_outside_all(a.test, name) for a in checks):
                found.append(f"{filename}:{line} {fn.name}: {name}")
    return found


# The SP-P dispatch test as it was (tests/test_simulator.py, then tests/sim/test_simulator_events_and_
# conservation.py, earlier): its scenario produced no waiting report, so dispatch_ok stayed empty.
OLD_DISPATCH_TEST = '''
def test_sp_p_policy_sees_the_engine_reports_late_and_respects_them():
    wl = tot(2, clients={"us": 40}, seed=0)
    dep = deployment_for("sp-p", {"us": 3}, stats_lag_s=0.3)
    seen = []
    dispatch_ok = []

    def trace(kind, info):
        if kind == "stats":
            seen.append((info["t"], info["stats"]))
        elif kind == "local":
            tr = info["policy"].tracker
            st = tr.stats(info["target"])
            if st is not None and st.num_waiting > 0:
                t = tr._t[info["target"]]
                dispatch_ok.append(t.completed_seen > st.num_waiting)

    sim = Simulator(wl, dep, SimConfig(duration_s=20.0), trace=trace)
    sim.run()
    assert seen
    for t, st in seen:
        assert isinstance(st, ReplicaStats)
        assert t == pytest.approx(st.timestamp + 0.3)  # same region: lag only
        assert st.max_num_seqs == 256 and st.num_gpu_blocks > 0
    assert any(st.num_running > 0 for _, st in seen)
    assert all(dispatch_ok)
'''


def test_the_guard_catches_the_old_dispatch_test_and_accepts_its_fix():
    name = "test_sp_p_policy_sees_the_engine_reports_late_and_respects_them"
    assert unguarded(OLD_DISPATCH_TEST) == [f"<test>:26 {name}: dispatch_ok"]
    fixed = OLD_DISPATCH_TEST.replace("    assert all(dispatch_ok)", "    assert len(dispatch_ok) > 0\n"
                                                                    "    assert all(dispatch_ok)")
    assert unguarded(fixed) == []


def test_the_guard_sees_loops_filters_and_accepts_the_usual_checks():
    src = textwrap.dedent('''
        def test_a():
            xs = [r for r in rows if r.ok]
            for x in xs:
                assert x.fine
        def test_b():
            got = {}
            fill(got)
            assert all(v > 0 for v in got.values())
        def test_c():
            xs = []
            fill(xs)
            assert sum(1 for x in xs if x) > 0
            assert all(x for x in xs)
        def test_d():
            xs = []
            fill(xs)
            assert xs, "nothing collected"
            for x in sorted(xs):
                assert x
        def test_e():
            xs = list(range(3))
            assert all(x >= 0 for x in xs)
        def test_f():
            xs = []
            fill(xs)
            assert xs and all(x for x in xs)
        def test_g():
            xs = [r for r in rows if r.ok]
            with ctx():
                assert all(x.fine for x in xs)
    ''')
    assert [f.split()[1] for f in unguarded(src)] == ["test_a:", "test_b:", "test_g:"]


def test_no_test_asserts_over_a_collection_it_never_checked_for_emptiness():
    tests = Path(REPO) / "tests"
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        found += unguarded(path.read_text(), str(path.relative_to(REPO)))
    assert found == [], "assert the collection is not empty first:\n" + "\n".join(found)
