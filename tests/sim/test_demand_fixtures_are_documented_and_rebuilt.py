"""The demands' fixtures (``servegen_m-large_workday_tenants_hourly.csv``, ``azure_2023_arrivals.csv.gz``) say
where they come from and under which license, and ``make_fixtures.demand_fixtures`` rebuilds them byte for byte
from the full shared data (skipped where ``../shared/data`` is absent: the project runs without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ray_geolb.data.make_fixtures import demand_fixtures
from ray_geolb.sim.workloads.datasets import DATA_DIR, fixture_path
from repo import REPO

#: $GEOLB_SHARED_DATA, else a shared/data folder beside the checkout
SHARED = Path(os.environ.get("GEOLB_SHARED_DATA") or REPO.parent / "shared" / "data")
FIXTURES = {"servegen_workday": ("servegen_m-large_workday_tenants_hourly.csv", "Apache-2.0", "ServeGen"),
            "azure_arrivals": ("azure_2023_arrivals.csv.gz", "CC-BY-4.0", "AzurePublicDataset")}


def test_sources_md_gives_each_demand_fixtures_source_license_and_derivation():
    sources = (DATA_DIR / "SOURCES.md").read_text()
    for key, (name, license_, origin) in FIXTURES.items():
        assert fixture_path(key).name == name
        row = next(line for line in sources.splitlines() if line.startswith(f"| `{name}` |"))
        assert license_ in row and f"{fixture_path(key).stat().st_size:,}" in row
        section = sources.split(f"### `{name}`")[1].split("\n### ")[0]
        assert origin in section and license_ in section and "Derivation" in section and "make_fixtures.py" in section
        assert fixture_path(key).stat().st_size < 250_000


def test_the_workday_curve_names_its_source_license_and_rule_in_the_file():
    head = [line for line in fixture_path("servegen_workday").read_text().splitlines() if line.startswith("#")]
    text = "\n".join(head)
    assert "ServeGen" in text and "Apache-2.0" in text and "clients:" in text and ">= 0.8" in text


def test_rebuilding_without_the_raw_data_names_the_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="servegen"):
        demand_fixtures(tmp_path / "nowhere", tmp_path)


@pytest.mark.skipif(not (SHARED / "servegen").is_dir() or not (SHARED / "azure_llm_2023").is_dir(),
                    reason="full shared data not available (../shared/data)")
def test_the_fixtures_rebuild_byte_for_byte_from_the_shared_data(tmp_path):
    made = demand_fixtures(SHARED, tmp_path)
    assert sorted(p.name for p in made) == sorted(name for name, _, _ in FIXTURES.values())
    for p in made:
        assert p.read_bytes() == (DATA_DIR / p.name).read_bytes(), p.name
