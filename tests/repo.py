"""Paths of this repository for the tests (they run from any working directory)."""

import pathlib

#: the repository root (tests/ sits right under it)
REPO = pathlib.Path(__file__).resolve().parents[1]
