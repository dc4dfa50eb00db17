"""GeoPrefix learns the prefill-attention price per pair (q) online from the engines' reports.

The analogue of ``test_tp_fit_on_engine_steps_holds_under_heavy_queueing_where_the_ttft_fit_does_not``
(test_seed_systems_in_the_simulator.py) for ``q``: 120 clients of the shared-context workload (long shared
contexts, so prefix hits of thousands of tokens) on 2 replicas behind SP-P. The engine model prices each
step with its profile's StepModel and reports ``engine_work.prefill_pairs``; the router's 4-term work fit
lands within 10 % of the profile's ``q`` and within 5 % of its GEMM time per token, without being told
either.
"""

import pytest

from ray_geolb.engine.profiles import get_profile
from ray_geolb.sim.deploy import deployment_for
from ray_geolb.sim.scenarios import build_workload
from ray_geolb.sim.simulator import SimConfig, Simulator

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("profile", ["llama3.1-8b-h100", "llama3.1-8b-l4", "mistral-7b-a100"])
def test_geoprefix_learns_the_per_pair_prefill_attention_from_engine_reports_under_queueing(profile):
    step = get_profile(profile).step
    # SkyLB's strict SP-P (one slot per request, no holder pass), so that requests queue at the LB and TTFT is
    # mostly queueing
    dep = deployment_for({"name": "geoprefix", "tp_floor": "none", "holder_pass_share": None,
                          "availability": {"pending_allowance": 0, "max_burst": 32, "slots_by_uncached_share": False}},
                         {"us": 2}, profile=profile)
    sim = Simulator(build_workload({"name": "shared-context", "kw": {"clients": {"us": 120}, "seed": 0}}), dep,
                    SimConfig(duration_s=60.0, seed=0))
    res = sim.run()
    lb = sim.lbs["us"]
    pol = lb.policy
    assert res.counters["lb_holds"] > 0  # requests queued at the LB: TTFT is not prefill time
    assert pol.ttft.samples() >= pol.ttft.config.min_samples
    q = pol.pair_coef()
    _base, tp, src = pol.ttft.line()
    assert src == "pooled"
    assert q == pytest.approx(step.prefill_attn_per_pair_s, rel=0.10), (q, step.prefill_attn_per_pair_s)
    assert tp == pytest.approx(step.gemm_per_token_s, rel=0.05), (tp, step.gemm_per_token_s)
    assert pol.describe()["prefill_pair_s"] == pytest.approx(q)


def test_without_the_switch_geoprefix_keeps_the_linear_fit():
    """``price_cached_context=False``: q = 0 and t_p is the 3-term fit, which folds the attention in."""
    profile = "llama3.1-8b-h100"
    step = get_profile(profile).step
    dep = deployment_for({"name": "geoprefix", "tp_floor": "none", "price_cached_context": False}, {"us": 2},
                         profile=profile)
    sim = Simulator(build_workload({"name": "shared-context", "kw": {"clients": {"us": 120}, "seed": 0}}), dep,
                    SimConfig(duration_s=60.0, seed=0))
    sim.run()
    pol = sim.lbs["us"].policy
    assert pol.pair_coef() == 0.0 and "prefill_pair_s" not in pol.describe()
    assert pol.ttft.t_p() > 1.1 * step.gemm_per_token_s
