"""Data residency in the region layer: a tenant's regions bound every forward path."""

import pytest
from pydantic import ValidationError

from policy_cases import fill, region, rq
from ray_geolb.policy import PeerState, TwoLayerConfig


@pytest.mark.parametrize("remote", ["prefix", "ring", "nearest", "cost"])
def test_tenant_regions_bound_every_forward_path(remote):
    r = region(remote=remote, tenant_regions={"acme": {"asia"}, "local": {"us"}})
    r.update_peer(PeerState("eu", 2, 0, 1.0, rtt_s=0.05))
    r.update_peer(PeerState("asia", 2, 0, 1.0, rtt_s=0.2))
    d = r.decide(rq(0, "q" * 400, tenant="acme"), 1.0)  # local available but not allowed for acme
    assert d.kind == "forward" and d.target == "asia"
    fill(r)
    for i in range(10):
        d = r.decide(rq(10 + i, "q%d" % i * 100, tenant="acme"), 1.1)
        assert d.kind == "forward" and d.target == "asia"
        assert r.decide(rq(30 + i, "q%d" % i * 100, tenant="local"), 1.1).kind == "hold"
    assert r.decide(rq(50, "q" * 40), 1.1).target in ("eu", "asia")  # no tenant: any region
    d = r.decide(rq(51, "q" * 40, tenant="acme", allowed_regions={"eu"}), 1.1)
    assert d.kind == "reject" and "tenant" in d.reason
    assert r.available_peers(1.1, rq(52, "x", tenant="acme")) == ["asia"]


def test_tenant_regions_validation_names_the_field():
    with pytest.raises(ValidationError, match="tenant_regions"):
        TwoLayerConfig(region="us", tenant_regions={"acme": set()})
    with pytest.raises(ValidationError, match="tenant_regions"):
        TwoLayerConfig(region="us", tenant_regions={"acme": {"bad region!"}})
