import csv
import math

import pytest

from ray_geolb.engine.network import DEFAULT_MAPPING, IBM_RTT_CSV, RegionNetwork


def _csv_table():
    with open(IBM_RTT_CSV, newline="") as f:
        return {(r["src_region"], r["dst_region"]): float(r["avg_rtt_ms"]) for r in csv.DictReader(f)}


def test_default_matches_csv():
    net = RegionNetwork.default()
    assert net.regions == ["us", "eu", "asia"]
    table = _csv_table()
    for a, ca in DEFAULT_MAPPING.items():
        for b, cb in DEFAULT_MAPPING.items():
            assert net.rtt_ms(a, b) == table[(ca, cb)] == table[(cb, ca)]
            assert net.rtt_s(a, b) == pytest.approx(table[(ca, cb)] / 1000)
            assert net.one_way_s(a, b) == pytest.approx(net.rtt_s(a, b) / 2)
    assert net.rtt_ms("us", "eu") == 98 and net.rtt_ms("us", "asia") == 167 and net.rtt_ms("eu", "asia") == 237
    assert net.rtt_s("us", "us") == 0.0


def test_nearest_and_unknown_region():
    net = RegionNetwork.default()
    assert net.nearest("us", ["asia", "eu"]) == "eu"
    assert net.nearest("asia", ["us", "eu"]) == "us"
    assert net.nearest("eu", ["eu", "us"]) == "eu"
    with pytest.raises(ValueError, match="unknown region 'mars'"):
        net.rtt_s("us", "mars")
    with pytest.raises(ValueError):
        net.nearest("us", [])


def test_gorgo_paper_numbers():
    net = RegionNetwork.gorgo()
    assert net.regions == ["us-west", "germany", "israel"]
    assert net.rtt_ms("us-west", "germany") == net.rtt_ms("germany", "us-west") == 281
    assert net.rtt_ms("us-west", "israel") == 183
    assert RegionNetwork.gorgo(intra_ms=3.0).rtt_ms("israel", "israel") == 3.0


def test_full_csv_symmetrised():
    net = RegionNetwork.from_csv(IBM_RTT_CSV)
    assert len(net.regions) == 10
    t = _csv_table()
    assert net.rtt_ms("London", "Tokyo") == pytest.approx((t[("London", "Tokyo")] + t[("Tokyo", "London")]) / 2)
    with pytest.raises(ValueError, match="asymmetric"):
        RegionNetwork.from_csv(IBM_RTT_CSV, {"a": "London", "b": "Tokyo"}, symmetrize="error")


def test_malformed_csv(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("src,dst,rtt\na,b,1\n")
    with pytest.raises(ValueError, match="header"):
        RegionNetwork.from_csv(bad)
    bad.write_text("src_region,dst_region,avg_rtt_ms\na,b,1\na,b\n")
    with pytest.raises(ValueError, match=r"bad.csv:3"):
        RegionNetwork.from_csv(bad)
    bad.write_text("src_region,dst_region,avg_rtt_ms\na,b,fast\n")
    with pytest.raises(ValueError, match="not a number"):
        RegionNetwork.from_csv(bad)
    bad.write_text("src_region,dst_region,avg_rtt_ms\na,b,5\n")
    with pytest.raises(ValueError, match="not in the CSV"):
        RegionNetwork.from_csv(bad, {"x": "zz"})
    with pytest.raises(ValueError, match="not found"):
        RegionNetwork.from_csv(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="symmetric"):
        RegionNetwork(["a", "b"], [[0, 1], [2, 0]])
    with pytest.raises(ValueError):
        RegionNetwork(["a", "b"], [[0, math.nan], [math.nan, 0]])
