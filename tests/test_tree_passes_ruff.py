"""The whole tree passes ``ruff check`` with the configuration in pyproject.toml ([tool.ruff]:
pycodestyle errors and warnings, pyflakes, isort; 120 columns), the notebooks in examples/ included."""

import subprocess
import sys

import pytest

from repo import REPO

pytest.importorskip("ruff")


def test_ruff_check_passes_on_the_whole_tree():
    # --no-cache: the test leaves no .ruff_cache behind in the checkout
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"ruff check failed:\n{proc.stdout}\n{proc.stderr}"
