"""``.ci/check_readme_commands.py`` reads the README's main-job line and its "Other entry points"
itself, so the commands CI runs in the main job's venv are the ones a user reads. These checks run
the script's parsing on the real README (no venv, no Ray): the main-job line is found and names its
extras, and every documented entry point has exactly one tiny-input short form -- a new command
without one fails here before it fails CI."""

import re

from repo import REPO as ROOT
from repo import load_script


def _checker():
    return load_script(".ci/check_readme_commands.py")


def test_the_main_job_line_is_read_from_the_readme_with_its_extras():
    m = _checker()
    line = m.main_job_line((ROOT / "README.md").read_text())
    steps = [s.strip() for s in line.split("&&")]
    assert steps[0] == "python3 -m venv .venv" and steps[2] == ".venv/bin/python -m ray_geolb demo", line
    assert re.search(r'pip install -e "\.\[demo\]"', steps[1]), line
    # the extra it installs is the one pyproject says carries Ray Serve LLM (the demo imports it)
    py = (ROOT / "pyproject.toml").read_text()
    demo = re.search(r"^demo = \[(.*)\]$", py, re.M).group(1)
    assert "ray[serve,llm]" in demo and "httpx" in demo and "matplotlib" in demo, demo


def test_every_documented_entry_point_has_one_short_form(tmp_path):
    m = _checker()
    cmds = m.entry_point_commands((ROOT / "README.md").read_text())
    assert len(cmds) >= 9, cmds
    for c in cmds:
        argv, help_argv = m.short_form(c, tmp_path)
        assert help_argv[-1] == "--help" and argv[: len(help_argv) - 1] == help_argv[:-1], (c, argv)
        # outputs go to the temp folder, never into the checkout
        outs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"]
        assert all(o.startswith(str(tmp_path)) for o in outs), (c, outs)
        # the placeholder path of the trace command is replaced by the bundled fixture
        assert "/path/to/" not in " ".join(argv), argv


def test_a_command_without_a_short_form_is_refused(tmp_path):
    m = _checker()
    try:
        m.short_form(".venv/bin/python benchmarks/new_benchmark.py --big", tmp_path)
    except SystemExit as e:
        assert "new_benchmark.py" in str(e) and "add one" in str(e)
    else:
        raise AssertionError("a command with no short form was accepted")


def test_the_demo_output_check_names_what_is_missing(tmp_path):
    m = _checker()
    problems = m.check_demo_output("INFO 2026 serve -- Deployment Options\n", tmp_path)
    assert any("no table" in p for p in problems) and any("INFO lines" in p for p in problems)
    assert any("demo.json" in p for p in problems) and any("PNG" in p for p in problems)


def _demo_out(tmp_path, central_p50_by_origin, rtt_by_origin):
    import json

    rows = [{"router": r, "ok": 3, "errors": 0, "ttft_p50_ms": 50.0} for r in ("geo", "pow2", "ray_prefix")]
    rows.append({"router": "central", "ok": 3, "errors": 0, "ttft_p50_ms": 60.0,
                 "ttft_p50_ms_by_origin": central_p50_by_origin,
                 "rtt_to_central_router_ms_by_origin": rtt_by_origin})
    (tmp_path / "demo.json").write_text(json.dumps({"args": {"duration": 10}, "rows": rows}))
    (tmp_path / "ray.log").write_text("INFO ...\n")
    return tmp_path


def test_the_demo_output_check_wants_the_central_routers_outside_clients_to_pay_their_rtt(tmp_path):
    m = _checker()
    rtt = {"us": 0.0, "eu": 80.0, "asia": 150.0}
    ok = m.check_demo_output("expected duration about 4 min\n", _demo_out(tmp_path, {"us": 60, "eu": 140}, rtt))
    assert not [p for p in ok if "central" in p or "demo.json" in p or "ray.log" in p], ok
    under = m.check_demo_output("", _demo_out(tmp_path, {"us": 60, "eu": 70}, rtt))
    assert any("from eu is 70 ms, under its RTT of 80 ms" in p for p in under), under
    assert any("expected-duration" in p for p in under), under
    none = m.check_demo_output("", _demo_out(tmp_path, {"us": 60}, rtt))
    assert any("no request from outside" in p for p in none), none
