"""The committed step-time fixture is what ``make_fixtures`` derives from the measured files (when the
project's shared data folder is there), and it carries every measured run, its source and its license."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ray_geolb.data import make_fixtures
from ray_geolb.engine.step_fit import FIXTURE, card_runs, design_checks, load_fixture

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("GEOLB_SHARED_DATA") or REPO.parent / "shared" / "data")
COMMITTED = Path(make_fixtures.__file__).resolve().parent / FIXTURE


def test_the_fixture_holds_every_run_with_its_source_and_license():
    fx = load_fixture()
    assert "2026-11-26" in fx["source"] and "2026-11-28" in fx["source"] and "use freely" in fx["license"]
    files = {card: [r["file"] for r in runs] for card, runs in fx["cards"].items()}
    assert files == {
        "h100-sxm": ["llama3.1-8b_h100-sxm_steps.json", "llama3.1-8b_h100-sxm_steps_run2_with_validation.json",
                     "llama3.1-8b_h100-sxm_long-context_steps.json"],
        "h200": ["llama3.1-8b_h200_steps.json", "llama3.1-8b_h200_long-context_steps.json"],
    }
    for card in fx["cards"]:
        long_run = fx["cards"][card][-1]
        assert long_run["reference_rows"] == 3 and len(long_run["rows"]) == 23
        steps = card_runs(fx, card)[-1]
        # short chunks over long contexts and lone decodes over very long ones
        assert any(ch and ch[0][0] <= 16 and ch[0][1] >= 65536 for ch, B, L, t in steps)
        assert any(not ch and B == 1 and L == 131072 for ch, B, L, t in steps)
    assert len(design_checks(fx, "h100-sxm")) == 12 and not design_checks(fx, "h200")
    assert all("validation" not in run for runs in fx["cards"].values() for run in runs)


@pytest.mark.skipif(not (SHARED / "gpu_step_times").is_dir(), reason="the shared measurements are not here")
def test_make_fixtures_rebuilds_the_committed_fixture_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(make_fixtures, "OUT", tmp_path)
    make_fixtures.gpu_step_times(SHARED)
    assert (tmp_path / FIXTURE).read_bytes() == COMMITTED.read_bytes()
    json.loads(COMMITTED.read_text())
