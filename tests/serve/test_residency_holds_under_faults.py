"""Residency under faults (property test, no cluster): whatever fails -- the region decision raising,
peers going stale, unreachable or full, tenants with region rules, forwarded requests -- the region
ingress never decides to serve a request locally outside its allowed regions, nor forwards it to a
region it may not go to. Random fault sequences and request sets (hypothesis), against a real
``RequestPath`` whose local layer is a real policy behind a fake router handle."""

from __future__ import annotations

from fakes import fake_router_view
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_geolb.policy import ReplicaStats, RouteRequest, build_policy
from ray_geolb.policy.region import PeerState
from ray_geolb.serve.clock import policy_now
from ray_geolb.serve.ingress import IngressConfig, RequestPath

REGIONS = ["us", "eu", "asia"]

fault = st.one_of(
    st.tuples(st.just("decide_raises"), st.booleans()),
    st.tuples(st.just("peer"), st.sampled_from(["eu", "asia"]), st.integers(0, 3), st.integers(0, 5),
              st.sampled_from([0.0, 1.0, 30.0])),  # available replicas, queue, age (s)
    st.tuples(st.just("unreachable"), st.sampled_from(["eu", "asia"])),
    st.tuples(st.just("local_slots"), st.integers(0, 3)),
)
request = st.fixed_dictionaries({
    "allowed": st.one_of(st.none(), st.sets(st.sampled_from(REGIONS), min_size=1)),
    "tenant": st.sampled_from([None, "acme", "globex"]),
    "hops": st.sampled_from([0, 0, 1]),
})


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.one_of(fault.map(lambda f: ("fault", f)), request.map(lambda r: ("req", r))),
                      min_size=5, max_size=40),
       remote=st.sampled_from(["cost", "prefix", "nearest"]))
def test_no_decision_ever_leaves_the_allowed_regions(steps, remote):
    geo = build_policy("geoprefix", targets=["r1", "r2"])
    state = {"slots": 1, "raise": False}
    fake = fake_router_view(geo, slots=lambda: state["slots"])
    cfg = IngressConfig(region="us", registry=None, peers={"eu": "geolb-eu", "asia": "geolb-asia"},
                        two_layer={"remote": remote, "tenant_regions": {"acme": ["eu", "asia"], "globex": ["us"]}})
    ing = RequestPath(cfg.model_dump(), geo_router=lambda: fake)
    real_decide = ing.router.decide

    def decide(req, now, candidates=None):
        if state["raise"]:
            raise RuntimeError("injected decide failure")
        return real_decide(req, now, candidates)

    ing.router.decide = decide
    for t in ("r1", "r2"):
        geo.on_stats(t, ReplicaStats(num_waiting=0, num_running=1, timestamp=policy_now(), max_num_seqs=4))
    checked = 0
    for i, (kind, x) in enumerate(steps):
        if kind == "fault":
            if x[0] == "decide_raises":
                state["raise"] = x[1]
            elif x[0] == "peer":
                _, peer, avail, q, age = x
                ing.router.update_peer(PeerState(peer, avail, q, policy_now() - age))
                ing.router.observe_rtt(peer, 0.05 if peer == "eu" else 0.15)
            elif x[0] == "unreachable":
                ing.router.mark_unreachable(x[1])
            else:
                state["slots"] = x[1]
            continue
        allowed = frozenset(x["allowed"]) if x["allowed"] else None
        req = RouteRequest(request_id=f"q{i}", text=f"request {i} " * 30, allowed_regions=allowed,
                           tenant=x["tenant"], hops=x["hops"])
        may = set(REGIONS) if allowed is None else set(allowed)
        if x["tenant"] == "acme":
            may &= {"eu", "asia"}
        elif x["tenant"] == "globex":
            may &= {"us"}
        d = ing.decide(req)
        checked += 1
        if d.kind == "local":
            assert "us" in may, (x, d)
        elif d.kind == "forward":
            assert d.target in may and d.target != "us" and req.hops == 0, (x, d)
        else:
            assert d.kind in ("hold", "reject"), d
    assert checked or all(k == "fault" for k, _ in steps)
