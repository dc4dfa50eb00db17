"""GeoPrefixRouter's ``request_router_kwargs`` are one typed model, RouterOptions (no cluster needed):
every option has its type, default, bounds and a description; ``initialize_state`` validates them
once; a bad one raises a ValueError naming the key; the model is frozen."""

from __future__ import annotations

import pydantic
import pytest
from fakes import offline_router

from ray_geolb.serve.router_options import RouterOptions


def test_every_option_is_typed_described_and_defaulted():
    fields = RouterOptions.model_fields
    assert set(fields) >= {"policy", "region", "queue_bound", "queue_bound_tokens", "wait_limit_s", "retry_after_s",
                           "error_delivery", "decision_log_size", "stats_seen_margin_s", "headroom_share",
                           "load_signal_grace_s", "reconcile_after_s"}
    for name, f in fields.items():
        assert f.description, name
        assert not f.is_required(), name  # an empty request_router_kwargs is a valid router
    o = RouterOptions()
    assert (o.queue_bound, o.wait_limit_s, o.error_delivery, o.headroom_share) == (1024, 60.0, "wrap", "auto")
    with pytest.raises(pydantic.ValidationError):
        o.queue_bound = 3  # frozen


def test_the_router_reads_its_options_once():
    r = offline_router(region="us", queue_bound=None, wait_limit_s=5, retry_after_s=2.5, headroom_share="none",
                       error_delivery="future", reconcile_after_s=None)
    assert isinstance(r.router_options, RouterOptions)
    assert (r.region, r.queue_bound, r.wait_limit_s, r.retry_after_s) == ("us", None, 5.0, 2.5)
    assert r.headroom_share is None and r.error_delivery == "future" and r.reconcile_after_s is None
    assert r.replicas.on_idle is None


@pytest.mark.parametrize("bad, key", [
    ({"wait_limit_s": 0}, "wait_limit_s"), ({"wait_limit_s": "60"}, "wait_limit_s"),
    ({"error_delivery": "raise"}, "error_delivery"), ({"region": ""}, "region"), ({"region": 3}, "region"),
    ({"queue_bound": True}, "queue_bound"), ({"queue_bound_tokens": 0}, "queue_bound_tokens"),
    ({"retry_after_s": -1}, "retry_after_s"), ({"decision_log_size": -1}, "decision_log_size"),
    ({"stats_seen_margin_s": -0.1}, "stats_seen_margin_s"), ({"headroom_share": [1, True]}, "headroom_share"),
    ({"_inject_error_every": 3}, "unknown request_router_kwargs"),
])
def test_a_bad_option_is_a_value_error_naming_its_key(bad, key):
    with pytest.raises(ValueError, match=key):
        offline_router(**bad)
