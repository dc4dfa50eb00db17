"""Every policy builds from a name or a dict; a bad config is a validation error naming the field."""

import pytest
from pydantic import ValidationError

from policy_cases import NEW, rq
from ray_geolb.policy import TwoLayerConfig, build_policy
from ray_geolb.policy.region import CostSelector


@pytest.mark.parametrize("name", NEW)
def test_builds_from_name_and_dict(name):
    a = build_policy(name, targets=["x"])
    b = build_policy({"name": name, "seed": 3}, targets=["x"])
    assert a.name == b.name == name and b.config.seed == 3
    assert a.choose(rq(0, "hi there"), 0.0).target == "x"


@pytest.mark.parametrize("spec, field", [
    ({"name": "gorgo", "q_hat": -1}, "q_hat"),
    ({"name": "gorgo", "ttft": {"window": 2}}, "ttft.window"),
    ({"name": "gorgo_proxy", "chars_per_token": 0}, "chars_per_token"),
    ({"name": "vllm_default", "capacity_tokens": 0}, "capacity_tokens"),
    ({"name": "jsq_load", "bogus": 1}, "bogus"),
    ({"name": "br0", "decode_tps": -1}, "decode_tps"),
    ({"name": "flowkv", "eps_low": 0.9, "eps_high": 0.5}, "eps_high"),
    ({"name": "flowkv", "window_s": 0}, "window_s"),
    ({"name": "geoprefix", "min_match_chars": -5}, "min_match_chars"),
    ({"name": "geoprefix", "match_half_life_s": 0}, "match_half_life_s"),
])
def test_bad_config_is_a_validation_error_naming_the_field(spec, field):
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        build_policy(spec)


@pytest.mark.parametrize("cfg, field", [({"remote": "cost", "cost": {"rtt_alpha": 0}}, "cost.rtt_alpha"),
                                        ({"cost": {"remote_queue": "maybe"}}, "cost.remote_queue"),
                                        ({"cost": {"ttft": {"prior_tp_s": 0}}}, "cost.ttft.prior_tp_s"),
                                        ({"cost": {"stay_slot_wait": "maybe"}}, "cost.stay_slot_wait"),
                                        ({"cost": {"drain_window_s": 0}}, "cost.drain_window_s"),
                                        ({"cost": {"drain_window_s": float("inf")}}, "cost.drain_window_s"),
                                        ({"cost": {"drain_min_samples": 1}}, "cost.drain_min_samples")])
def test_two_layer_cost_config_errors_name_the_field(cfg, field):
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        TwoLayerConfig(region="us", **cfg)
    with pytest.raises(ValidationError):
        CostSelector(cfg.get("cost"))
