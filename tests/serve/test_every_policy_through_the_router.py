"""Every policy of the core runs through GeoPrefixRouter's ``policy`` option on a real Ray Serve
deployment (emulated engines): the same objects the simulator drives."""


import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from ray_geolb.policy import policy_names  # noqa: E402
from ray_geolb.serve import router_for  # noqa: E402
from ray_geolb.serve.emulated import emulated_deployment  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

DEP = "Emulated"
# The oracle needs a global view of every engine's cache, which a Ray Serve router does not have.
RAY_POLICIES = [p for p in policy_names() if p != "oracle"]
SERVE_CLUSTER = {"prefix": "rgP"}  # options of this module's cluster (conftest.serve_cluster)


def test_every_core_policy_is_listed():
    assert {"skylb", "skylb_ch", "gorgo", "geoprefix", "vllm_default", "jsq_load", "br0", "flowkv",
            "sglang", "ray_prefix", "power_of_two"} <= set(RAY_POLICIES)


@pytest.mark.parametrize("policy", RAY_POLICIES)
def test_policy_serves_through_geoprefixrouter(serve_cluster, policy):
    app = f"pol-{policy.replace('_', '-')}"
    h = serve.run(emulated_deployment(2, {"policy": policy}, name=DEP, time_scale=0.005, output_tokens=4),
                  name=app, route_prefix=None)
    prompts = [f"system prompt shared by all. user {i % 3} asks question {i}" * 20 for i in range(12)]
    outs = [h.remote(p).result(timeout_s=60) for p in prompts]
    assert all(o["output_tokens"] == 4 for o in outs)
    r = router_for(app, DEP)
    assert r is not None and r.policy.name == policy
    assert r.counters["routed"] >= len(prompts)
    assert r.counters["internal_errors"] == 0 and r.counters["fallback"] == 0
    assert {o["replica"] for o in outs} <= set(r.local_replica_ids())
    serve.delete(app)
