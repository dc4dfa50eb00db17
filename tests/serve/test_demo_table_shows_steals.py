"""The demo's table (``ray_geolb/demo.py``: ``summarize`` -> ``format_table``) keeps its columns and adds
``steals``: the requests the region ingresses took from a peer by work stealing, "-" when stealing is off."""

from ray_geolb.demo import build_parser, format_table, summarize


def _records(n, served="us"):
    return [{"t1": 1.0, "status": 200, "ttft": 0.1 * (i + 1), "region": "us", "route": "local", "served": served}
            for i in range(n)]


def test_the_table_has_a_steals_column_next_to_the_old_ones():
    on = summarize("geo", "GeoPrefixRouter + stealing", _records(4), 0.0, 10.0, {}, steals=7)
    off = summarize("pow2", "Ray pow-2", _records(2), 0.0, 10.0, {})
    assert on["steals"] == 7 and off["steals"] is None and on["ok"] == 4 and on["throughput_rps"] == 0.4
    head, rule, row_on, row_off = format_table([on, off]).splitlines()
    for col in ("router", "ok/req", "req/s", "TTFT p50", "TTFT p99", "prefix hit", "cross-reg", "steals"):
        assert col in head
    assert head.split()[-1] == "steals" and len(rule) == len(head)
    assert row_on.split()[-1] == "7" and row_off.split()[-1] == "-"
    assert row_on.split()[-3:-1] == ["0.0", "%"]  # cross-reg still before it


def test_stealing_is_a_demo_flag_off_by_default():
    assert build_parser().parse_args([]).steal is False
    assert build_parser().parse_args(["--steal"]).steal is True
