"""The built-in demands by name (what ``plan`` / ``goodput --demand`` read): each is a day over the network's
regions that builds the same workload for a seed; a bad ``--demand`` is a typed error that names it -- an
unknown name lists the built-in demands, a CSV row with an unknown region names the line and the regions."""

from __future__ import annotations

import json

import pytest

from ray_geolb.__main__ import main as cli
from ray_geolb.engine.network import RegionNetwork
from ray_geolb.sim.workloads.geo_diurnal import (
    BUILTIN_DEMANDS,
    DemandCSVError,
    DemandError,
    UnknownDemandError,
    geo_diurnal,
    load_demand,
)


def _sig(w):
    return [(t, p.program_id, p.calls[0].text, p.calls[0].output_tokens) for t, p in w.open.arrivals]


@pytest.mark.parametrize("name", list(BUILTIN_DEMANDS))
def test_each_builtin_demand_is_a_day_of_the_networks_regions_and_the_same_for_a_seed(name):
    d = load_demand(name, 4.0)
    assert d.source == name and set(d.regions) <= set(RegionNetwork.default().regions)
    assert sum(d.total()) / 24 == pytest.approx(4.0)
    kw = d.workload_kw()
    assert json.loads(json.dumps(kw)) == kw  # a run dict travels as JSON
    assert d.scaled(2.0).workload_kw() == {**kw, "curves": d.scaled(2.0).to_kw()}
    a, b = (geo_diurnal(**kw, day_s=12.0, seed=7) for _ in range(2))
    assert _sig(a) and _sig(a) == _sig(b)
    assert _sig(a) != _sig(geo_diurnal(**kw, day_s=12.0, seed=8))


def test_at_least_three_demands_and_geo_diurnal_3_unchanged():
    assert {"geo-diurnal-3", "geo-workday-3", "azure-bursty-3"} <= set(BUILTIN_DEMANDS)
    assert load_demand("geo-diurnal-3").workload_kw() == {"curves": load_demand("geo-diurnal-3").to_kw()}


def test_an_unknown_demand_name_lists_the_builtin_ones():
    with pytest.raises(UnknownDemandError) as e:
        load_demand("geo-diurnal-4")
    assert isinstance(e.value, DemandError) and isinstance(e.value, ValueError)
    assert "'geo-diurnal-4'" in str(e.value) and all(n in str(e.value) for n in BUILTIN_DEMANDS)


def test_a_csv_with_an_unknown_region_names_the_line_and_the_known_regions(tmp_path):
    p = tmp_path / "demand.csv"
    p.write_text("hour,region,rate\n0,us,2\n5,mars,3\n")
    with pytest.raises(DemandCSVError, match=r"demand\.csv:3: field 'region': unknown region 'mars'; known: ") as e:
        load_demand(str(p))
    assert all(r in str(e.value) for r in RegionNetwork.default().regions)
    with pytest.raises(DemandCSVError, match="file not found"):
        load_demand(str(tmp_path / "missing.csv"))
    with pytest.raises(DemandError, match="--mean-rps"):
        load_demand(str(p), 5.0)
    ok = tmp_path / "ok.csv"  # the user CSV keeps working
    ok.write_text("hour,region,rate\n0,us,2\n12,eu,3\n")
    d = load_demand(str(ok))
    assert d.source == "csv:ok.csv" and d.rates["us"] == [2.0] * 24 and d.workload_kw() == {"curves": d.to_kw()}


@pytest.mark.parametrize("command", ["plan", "goodput"])
def test_the_cli_names_a_bad_demand(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli([command, "--demand", "nope"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--demand" in err and "unknown demand 'nope'" in err and all(n in err for n in BUILTIN_DEMANDS)


def test_demand_stats_prints_each_demands_properties(capsys):
    from ray_geolb.sim.workloads.demand_stats import main

    assert main(["--demands", "geo-workday-3,azure-bursty-3", "--seeds", "0", "--day-s", "12"]) == 0
    out = capsys.readouterr().out
    assert "geo-workday-3" in out and "overlap of the days us-eu 0.53" in out and "peak UTC hour us 15" in out
    assert "azure-bursty-3" in out and "trace: IAT CV 1.33" in out
    with pytest.raises(SystemExit):
        main(["--demands", "nope"])
    assert "unknown demand(s) ['nope']" in capsys.readouterr().err
