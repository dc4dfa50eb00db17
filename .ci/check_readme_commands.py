#!/usr/bin/env python3
"""CI: the README's commands, run as a new user runs them, in a NEW venv with exactly the extras the
README's main-job line names (standard library only; run it with any Python >= 3.10).

1. **The main job.** The README's "Quick start" line that runs ``python -m ray_geolb demo`` is read
   from the README itself (so the two cannot drift apart) and run step by step: the venv it creates
   (``.venv``, renamed to a new temp folder so it cannot be an earlier one), the ``pip install`` with
   the line's own extras, then the demo with a short ``--duration`` and a temp ``--out``. It must exit
   0, print the expected duration and the table with one row per router, write ``demo.json`` (every
   router answered with no error; the central router's clients outside us paid their RTT; no operator
   token), ``demo.png`` and a non-empty ``ray.log``, and print no Ray INFO line on the terminal.
2. **Every "Other entry points" command**, in that same venv: its ``--help``, then a tiny input (the
   short forms are in ``SHORT`` below; a README command with no short form fails the check, so a new
   entry point cannot go unchecked). One undeclared import breaks the command, and so the check.

This is the one place the main job runs end to end (the suite tests its parts: the table, the
summary, the arguments); running it in the test venv (``[llm,dev]``) would hide a dependency missing
from the main-job extra, and running it twice cost CI 6-8 minutes. ``RAY_TMPDIR`` comes from ``.ci/run`` (a new
empty folder). ``--keep-venv DIR`` reuses/keeps a venv (local iteration only; CI never passes it).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: seconds of load per router in the demo's short run: the central row's RTT check needs a request
#: finished by the one client in eu or the one in asia while the central router in us is busy with
#: the 19 clients of us; in 4-s runs both finished none once (and eu alone once before)
DEMO_SECONDS = 10
#: demo.json's routers, in order
DEMO_ROUTERS = ["geo", "pow2", "ray_prefix", "central"]
#: the demo's table rows, in order (the default --routers)
DEMO_ROWS = ["GeoPrefixRouter", "Ray default (pow-2)", "Ray PrefixCacheAffinity", "Central Ray prefix"]

#: (pattern over the command after ``.venv/bin/python``, arguments appended for a tiny run,
#: (old, new) text replacements). argparse keeps the last value of a repeated option, so an appended
#: ``--seeds 0`` overrides the README's ``--seeds 0,1``. ``{tmp}`` in an argument: this run's temp folder.
SHORT: List[Tuple[str, List[str], List[Tuple[str, str]]]] = [
    (r"^-m ray_geolb policies\b", ["--requests", "300", "--replicas", "4"], []),
    (r"^-m ray_geolb simulate --scenario ", ["--duration", "15", "--seeds", "0", "--no-progress"], []),
    (r"^-m ray_geolb simulate --workload conversation:",
     ["--duration", "15", "--seeds", "0", "--max-programs", "40", "--no-progress"], []),
    (r"^-m ray_geolb simulate --workload trace:",
     ["--duration", "15", "--max-programs", "60", "--no-progress"],
     [("/path/to/AzureLLMInferenceTrace_conv.csv", str(ROOT / "ray_geolb/data/azure_conv_2000.csv"))]),
    (r"^-m ray_geolb plan\b(?!.*--survive-region-loss)",
     ["--mean-rps", "8", "--day-s", "24", "--systems", "geoprefix,region-local", "--no-progress",
      "--out", "{tmp}/out/plan"], []),
    # each outage hour 15 simulated s instead of 60: 148 -> 36 s here, the same tables
    (r"^-m ray_geolb plan\b.*--survive-region-loss",
     ["--mean-rps", "8", "--day-s", "24", "--systems", "geoprefix,region-local", "--outage-hour-s", "15",
      "--no-progress", "--out", "{tmp}/out/plan"], []),
    (r"^-m ray_geolb goodput\b",
     ["--mean-rps", "8", "--day-s", "24", "--regions", "us=1,eu=1,asia=1", "--systems", "geoprefix",
      "--seeds", "0", "--bisect-steps", "1", "--no-progress", "--out", "{tmp}/out/goodput"], []),
    (r"^benchmarks/compare_policies\.py",
     ["--scenarios", "network-hard", "--systems", "geoprefix,skylb", "--seeds", "0", "--duration", "15",
      "--out", "{tmp}/out/compare"], []),
    (r"^benchmarks/paper_repro\.py", ["--seeds", "0", "--out", "{tmp}/out/paper"], []),
    (r"^benchmarks/bench_decision\.py", ["--quick"], []),
    (r"^benchmarks/bench_router\.py", ["--requests", "24", "--replicas", "2", "--concurrency", "4",
                                       "--num-cpus", "2"], []),
    (r"^benchmarks/profile_router_path\.py", ["--requests", "200"], []),
    (r"^-m ray_geolb\.engine\.step_fit\b", [], []),  # already short: fits three cards in under a second
]


def say(msg: str) -> None:
    print(f"[readme-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        raise SystemExit(f"README.md has no '## {heading}' section")
    return m.group(1)


def _bash_blocks(text: str) -> List[List[str]]:
    """Each ```bash block as its commands (continuation lines joined, comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        cmds, cur = [], ""
        for line in block.splitlines():
            line = line.rstrip()
            if line.endswith("\\"):
                cur += line[:-1] + " "
                continue
            cur += line
            cur = re.sub(r"\s+#.*$", "", cur).strip()  # a trailing comment (no '#' inside our commands)
            if cur and not cur.startswith("#"):
                cmds.append(re.sub(r"\s+", " ", cur))
            cur = ""
        out.append(cmds)
    return out


def main_job_line(text: str) -> str:
    quick = _section(text, "Quick start")
    lines = [c for block in _bash_blocks(quick) for c in block if "-m ray_geolb demo" in c]
    if len(lines) != 1:
        raise SystemExit(f"README 'Quick start' must have exactly one main-job line, found {lines}")
    return lines[0]


def entry_point_commands(text: str) -> List[str]:
    i = text.find("Other entry points")
    if i < 0:
        raise SystemExit("README.md has no 'Other entry points'")
    blocks = _bash_blocks(text[i:])
    if not blocks:
        raise SystemExit("README 'Other entry points' has no bash block")
    return [c for c in blocks[0] if c.startswith(".venv/bin/python ")]


def short_form(cmd: str, tmp: Path) -> Tuple[List[str], List[str]]:
    """(the command's argv with a tiny input, its --help argv), after ``.venv/bin/python``."""
    rest = cmd[len(".venv/bin/python "):]
    hits = [(extra, repl) for pat, extra, repl in SHORT if re.search(pat, rest)]
    if len(hits) != 1:
        raise SystemExit(f"no single short form in .ci/check_readme_commands.py SHORT for README command "
                         f"{cmd!r} ({len(hits)} match): add one")
    extra, repl = hits[0]
    for old, new in repl:
        rest = rest.replace(old, new)
    argv = shlex.split(rest)
    # outputs go to this run's temp folder, never into the checkout
    for j, a in enumerate(argv[:-1]):
        if a == "--out":
            argv[j + 1] = str(tmp / "out" / argv[j + 1].replace("/", "_"))
    help_argv = argv[:3] + ["--help"] if argv[0] == "-m" else argv[:1] + ["--help"]
    return argv + [a.format(tmp=tmp) for a in extra], help_argv


def run(argv: List[str], log: Path, timeout: float, env=None) -> Tuple[int, str, float]:
    t = time.monotonic()
    try:
        p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"{e.stdout or ''}{e.stderr or ''}\n[timed out after {timeout:.0f} s]"
        out = out if isinstance(out, str) else out.decode(errors="replace")
    log.write_text(out)
    return rc, out, time.monotonic() - t


def _central_pays_its_rtt(rows: List[dict]) -> List[str]:
    """The central router runs in us: a client outside us pays its RTT to us before its first token
    (the demo has one client in eu and one in asia; one of them may finish no request in the window)."""
    central = [r for r in rows if r.get("router") == "central"]
    if not central:
        return []
    c = central[0]
    rtt = c.get("rtt_to_central_router_ms_by_origin") or {}
    outside = {o: ms for o, ms in (c.get("ttft_p50_ms_by_origin") or {}).items() if rtt.get(o, 0) > 0}
    if not outside:
        return [f"central row: no request from outside the router's region finished ({c.get('ttft_p50_ms_by_origin')})"]
    return [f"central row: TTFT p50 from {o} is {ms:.0f} ms, under its RTT of {rtt[o]:.0f} ms"
            for o, ms in outside.items() if ms < rtt[o]]


def check_demo_output(out_text: str, out_dir: Path) -> List[str]:
    problems = []
    lines = out_text.splitlines()
    head = [i for i, ln in enumerate(lines) if ln.startswith("router") and "TTFT p50" in ln]
    if not head:
        problems.append("no table printed")
    else:
        rows = lines[head[0] + 2: head[0] + 2 + len(DEMO_ROWS)]
        for want, got in zip(DEMO_ROWS, rows + [""] * len(DEMO_ROWS)):
            if not got.startswith(want):
                problems.append(f"table row {got!r} should start with {want!r}")
    info = [ln for ln in lines if re.search(r"\bINFO\b", ln)]
    if info:
        problems.append(f"{len(info)} INFO lines on the terminal, e.g. {info[0][:160]!r}")
    if not any("expected duration" in ln for ln in lines):
        problems.append("no expected-duration line at the start")
    log = out_dir / "ray.log"
    if not log.exists() or log.stat().st_size == 0:
        problems.append("ray.log (where Ray's INFO lines go) is missing or empty")
    js = out_dir / "demo.json"
    png = out_dir / "demo.png"
    if not js.exists():
        problems.append("no demo.json")
    else:
        data = json.loads(js.read_text())
        rows = data.get("rows", [])
        if [r.get("router") for r in rows] != DEMO_ROUTERS:
            problems.append(f"demo.json routers {[r.get('router') for r in rows]}, want {DEMO_ROUTERS}")
        bad = [(r.get("router"), r.get("ok"), r.get("errors"), r.get("ttft_p50_ms")) for r in rows
               if not (r.get("ok", 0) >= 1 and r.get("errors") == 0 and (r.get("ttft_p50_ms") or 0) > 0)]
        if bad:
            problems.append(f"demo.json rows with no answer, an error or no TTFT (router, ok, errors, p50): {bad}")
        if "admin_token" in data.get("args", {}):
            problems.append("demo.json shows the operator token")
        problems += _central_pays_its_rtt(rows)
    if not png.exists() or png.stat().st_size < 10_000 or png.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        problems.append("no PNG (demo.png missing or not a PNG)")
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-venv", default=None, help="use (and keep) this venv folder; local iteration only")
    ap.add_argument("--skip-demo", action="store_true", help="only the other entry points (local iteration)")
    args = ap.parse_args(argv)
    text = README.read_text()
    line = main_job_line(text)
    cmds = entry_point_commands(text)
    tmp = Path(tempfile.mkdtemp(prefix="readme_check_"))
    venv = Path(args.keep_venv).resolve() if args.keep_venv else tmp / "venv"
    logs = tmp / "logs"
    logs.mkdir()
    failures: List[str] = []
    try:
        steps = [s.strip() for s in line.split("&&")]
        if len(steps) != 3 or not steps[0].startswith("python3 -m venv .venv") or "pip install" not in steps[1]:
            raise SystemExit(f"unexpected main-job line shape: {line!r}")
        extras = re.search(r'\.\[([^\]]*)\]', steps[1])
        say(f"main-job line: {line}")
        say(f"extras: [{extras.group(1) if extras else ''}]; new venv {venv}")
        setup = [s.replace(".venv", str(venv)) for s in steps[:2]]
        if args.keep_venv and (venv / "bin" / "python").exists():
            setup = setup[1:]
        t = time.monotonic()
        for s in setup:
            p = subprocess.run(s, shell=True, cwd=ROOT, capture_output=True, text=True)
            if p.returncode != 0:
                print((p.stdout + p.stderr)[-4000:], file=sys.stderr)
                raise SystemExit(f"main-job setup step failed ({p.returncode}): {s}")
        size = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True).stdout.split()[:1]
        say(f"installed in {time.monotonic() - t:.0f} s; the venv weighs {size[0] if size else '?'}")
        py = str(venv / "bin" / "python")
        demo_cmd = shlex.split(steps[2].replace(".venv/bin/python", py))
        if not args.skip_demo:
            out_dir = tmp / "demo"
            demo_argv = demo_cmd + ["--duration", str(DEMO_SECONDS), "--out", str(out_dir)]
            say(f"running the main job: {' '.join(demo_argv[1:])}")
            rc, out, dt = run(demo_argv, logs / "demo.log", timeout=900)
            problems = ([f"exit status {rc}"] if rc != 0 else []) + check_demo_output(out, out_dir)
            if problems:
                print(out[-6000:], file=sys.stderr)
                failures.append(f"main job: {'; '.join(problems)}")
            say(f"main job: {'FAILED: ' + '; '.join(problems) if problems else 'ok'} ({dt:.0f} s)")
        for c in cmds:
            full, help_argv = short_form(c, tmp)
            for label, a, limit in (("--help", help_argv, 120), ("tiny run", full, 600)):
                rc, out, dt = run([py] + a, logs / f"{len(failures)}_{Path(a[0]).stem}.log", timeout=limit)
                ok = rc == 0 and "Traceback (most recent call last)" not in out
                say(f"{'ok  ' if ok else 'FAIL'} {label:8s} {dt:5.1f} s  {' '.join(a)}")
                if not ok:
                    print(out[-3000:], file=sys.stderr)
                    failures.append(f"{c} ({label}): exit {rc}")
    finally:
        if not args.keep_venv:
            shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        say("FAILED:\n  " + "\n  ".join(failures))
        return 1
    say(f"the main job and {len(cmds)} entry points run in a venv with only the main-job extras")
    return 0


if __name__ == "__main__":
    sys.exit(main())
