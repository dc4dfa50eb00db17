"""The README's main job, end to end, as a new user runs it: ``python -m ray_geolb demo`` in its own
process, on a fresh Ray temp dir (``RAY_TMPDIR`` = a new empty folder, as on a fresh machine), with a
few seconds of load per router. It must print the comparison table and write a non-empty PNG and
JSON with one row per router (the central router over every region's replicas too), every request
answered, with no Ray INFO line on the terminal (Ray's and Serve's logs go to ``ray.log``).

What this test cannot catch: a dependency missing from the README's main-job extra. It runs in the
test venv (``[llm,dev]``), which installs more than ``[demo]``. ``.ci/check_readme_commands.py``
(run by ``.ci/run`` before the suite) installs exactly the main-job line's extras in a new venv and
runs the demo and every other documented command there."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("ray")
pytest.importorskip("httpx")
pytest.importorskip("matplotlib")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

# Seconds of load per router. The RTT check below needs a request finished by the one client in eu or
# the one in asia while the central router in us is busy with the 19 clients of us: in 4-s runs both
# finished none once (and eu alone once before), so the window is long enough for a few of theirs.
LOAD_S = 10


def test_demo_runs_on_a_fresh_machine(tmp_path):
    # new and empty (no /tmp/ray from earlier runs to lean on), and short (Ray's socket paths)
    ray_tmp = tempfile.mkdtemp(prefix="rd")
    out = tmp_path / "demo"
    env = dict(os.environ, RAY_TMPDIR=ray_tmp)
    try:
        p = subprocess.run([sys.executable, "-m", "ray_geolb", "demo", "--duration", str(LOAD_S), "--out", str(out)],
                           capture_output=True, text=True, timeout=540, env=env)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    tail = (p.stdout[-4000:], p.stderr[-4000:])
    assert p.returncode == 0, tail
    terminal = (p.stdout + p.stderr).splitlines()
    assert not [ln for ln in terminal if " INFO " in ln or ln.startswith("INFO")], tail
    assert (out / "ray.log").stat().st_size > 0  # where Ray's INFO lines went
    assert any("expected duration" in ln for ln in terminal), tail
    lines = p.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("router") and "TTFT p50" in ln)
    rows = lines[head + 2: head + 6]
    assert [r.split("  ")[0].strip() for r in rows] == [
        "GeoPrefixRouter (GeoPrefix)", "Ray default (pow-2)", "Ray PrefixCacheAffinity",
        "Central Ray prefix (all regions)"], lines[head:head + 6]
    png = out / "demo.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "demo.json").read_text())
    assert [r["router"] for r in data["rows"]] == ["geo", "pow2", "ray_prefix", "central"]
    for r in data["rows"]:
        assert r["ok"] > 0 and r["errors"] == 0 and r["ttft_p50_ms"] > 0, r
    # the central router is in us: a client outside us pays its RTT to us before its first token (the
    # demo has one client in eu and one in asia; one of them may still finish no request in the window)
    from ray_geolb.serve.latency import LatencyInjector

    central = data["rows"][3]
    outside = {o: ms for o, ms in central["ttft_p50_ms_by_origin"].items() if o != "us"}
    assert outside, central
    for origin, ms in outside.items():
        assert ms >= 1000 * LatencyInjector().rtt_s("us", origin), (origin, central)
    assert "admin_token" not in data["args"]
