"""Paths of this repository for the tests (they run from any working directory), its scripts as
modules, and a safe ``ast.parse`` for the tests that read its source."""

import ast
import gc
import importlib.util
import pathlib

#: the repository root (tests/ sits right under it)
REPO = pathlib.Path(__file__).resolve().parents[1]


def load_script(relpath: str):
    """A script of this repository that is not in a package (``benchmarks/*.py``, ``.ci/*.py``), imported
    as a module under its file name, so a test can call its functions."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` with the cyclic garbage collector paused. On CPython 3.11 a finalizer that runs while
    the parser builds its tree and formats a traceback (an asyncio task whose exception nobody read, logged
    when collected; 3.11's traceback parses each source line again for its ``^^^`` marks) moves the parser's
    shared recursion counter: ``SystemError: AST constructor recursion depth mismatch``
    (python/cpython#106905). It failed a full-suite run once, in the middle of a Serve-heavy suite."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename)
    finally:
        if enabled:
            gc.enable()
