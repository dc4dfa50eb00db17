"""The simulator feeds every local completion to the region layer's drain-rate estimate."""






def test_the_simulator_feeds_every_local_completion_to_the_drain_rate():
    from ray_geolb.sim.deploy import deployment_for
    from ray_geolb.sim.simulator import SimConfig, Simulator
    from ray_geolb.sim.workloads import tot

    wl = tot(2, clients={"us": 12, "eu": 4, "asia": 4}, seed=0)
    sim = Simulator(wl, deployment_for("geoprefix", {"us": 1, "eu": 1, "asia": 1}), SimConfig(duration_s=8.0))
    seen = {}
    for lb in sim.lbs.values():
        orig = lb.router.selector.on_local_complete
        seen[lb.region] = []
        lb.router.selector.on_local_complete = (lambda o, sink: lambda now: (sink.append(now), o(now)))(
            orig, seen[lb.region]
        )
    done = {}
    for lb in sim.lbs.values():
        orig = lb.policy.on_complete
        done[lb.region] = []
        lb.policy.on_complete = (lambda o, sink: lambda rid, *a, **k: (sink.append(a[1]), o(rid, *a, **k)))(
            orig, done[lb.region]
        )
    sim.run()
    assert sum(map(len, done.values())) > 20
    assert seen == done  # one drain sample per local completion, at the time the LB saw it
    assert all(lb.router.selector.config.stay_slot_wait for lb in sim.lbs.values())
    assert all(len(lb.router.selector.drain) for lb in sim.lbs.values() if done[lb.region])
