"""The SLO yardstick judges TTFT at the first token: a request still decoding at the run's cut-off (a long output
sent late in the day) counts with its TTFT and the TPOT it had so far, not as a miss; a request without a first
token by the cut-off is still a miss. Small open-loop runs cut off while long outputs decode."""

from __future__ import annotations

from ray_geolb.sim.goodput import SLO, simulate_run, slo_run
from ray_geolb.sim.metrics import dumps

SLO1 = SLO(1.0)


def _run(rate: float, day_s: float, cut_s: float, seed: int = 0) -> dict:
    return {"label": "cut", "system": "region-local", "replicas": {"us": 1},
            "workload": {"name": "geo-diurnal", "kw": {"curves": {"us": [rate] * 24}, "day_s": day_s}},
            "sim": {"duration_s": cut_s, "seed": seed}, "deploy": {"profile": "llama3.1-8b-h100"},
            "slo": SLO1.to_dict()}


def test_a_long_output_decoding_at_the_cutoff_keeps_its_ttft_and_the_run_meets_the_slo():
    run = _run(1.0, 12.0, 13.0)  # 1 s after the last arrival: first tokens came, long outputs still decode
    _spec, _slos, _h, _wl, res = simulate_run(dict(run))
    sent, done = res.counters["requests_sent"], len(res.requests)
    decoding = res.unfinished
    assert decoding and len(decoding) == len(res.unfinished_breakdown)
    assert done + len(decoding) == sent  # every request got its first token; more than 1 % had not finished
    assert len(decoding) / sent > 0.01
    for t_send, ttft, tpot, _p, out, _w, _x, region, replica in decoding:
        assert 0 < ttft <= 13.0 - t_send and region == "us" and replica == "us-0"
        assert tpot is None or tpot > 0
        assert out > 100  # a long output: what is still decoding
    o = slo_run(dict(run))
    assert o["missed"] == 0 and o["sent"] == sent
    assert o["meets"] and o["p99_ttft_s"] is not None and o["p99_ttft_s"] < 1.0
    a = o["attribution"]
    assert a["decoding"] == len(decoding) and a["completed"] == sent and a["missed"] == 0
    assert slo_run(dict(run)) == o  # deterministic
    dumps(o)  # serialisable, as the runner ships it


def test_a_request_without_a_first_token_by_the_cutoff_is_still_a_miss():
    run = _run(40.0, 6.0, 6.5)  # one replica, 40 req/s: a queue at the cut-off
    _spec, _slos, _h, _wl, res = simulate_run(dict(run))
    sent = res.counters["requests_sent"]
    answered = len(res.requests) + len(res.unfinished)
    assert 0 < answered < sent
    o = slo_run(dict(run))
    assert o["missed"] == sent - answered > 0.01 * sent
    assert not o["meets"] and o["p99_ttft_s"] is None  # the misses are infinite
    assert o["attribution"]["missed"] == o["missed"]
