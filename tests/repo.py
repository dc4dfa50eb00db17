"""Paths of this repository for the tests (they run from any working directory), and its scripts as
modules."""

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
