"""``python -m ray_geolb policies``: list every policy with its defaults, and route one small
conversation workload through each (no Ray, no simulator clock: each request completes after the
next ``concurrency`` requests), printing turn-to-turn affinity and per-replica spread."""

from __future__ import annotations

import json


def run(args) -> int:
    from ray_geolb.policy import ReplicaStats, RouteRequest, build_policy, policy_names
    from ray_geolb.sim.workloads import conversation

    wl = conversation(source="sharegpt", clients={"us": 1}, seed=args.seed)
    stream = wl.closed.programs["us"]
    calls = []
    for prog in stream.take(max(1, args.requests // 4)):
        for i, c in enumerate(prog.calls):
            calls.append((prog.program_id, i, c))
            if len(calls) >= args.requests:
                break
        if len(calls) >= args.requests:
            break
    targets = [f"replica-{i}" for i in range(args.replicas)]
    print(f"{len(calls)} chat turns from the shipped ShareGPT sample over {args.replicas} replicas\n")
    print(f"{'policy':<16} {'pushing':<6} {'affinity':>8} {'held':>6} {'min/max per replica':>20}")
    concurrency = 2 * args.replicas
    for name in policy_names():
        if name == "oracle":
            continue  # needs the engines' real caches: see `simulate`
        pol = build_policy({"name": name, "seed": args.seed}, targets=targets)
        last, inflight, counts = {}, [], {t: 0 for t in targets}
        same = turns = held = 0
        now = 0.0
        for n, (pid, k, call) in enumerate(calls):
            now += 0.01
            if n % 20 == 0:  # periodic replica reports: idle, room for a few more
                for t in targets:
                    pol.on_stats(t, ReplicaStats(num_waiting=0, num_running=pol.tracker.outstanding(t),
                                                 max_num_seqs=8, timestamp=now))
            req = RouteRequest(f"{pid}/{k}", call.text, session_key=call.session_key)
            d = pol.choose(req, now)
            while d is None and inflight:  # selective pushing: wait for a completion
                rid, tgt = inflight.pop(0)
                pol.on_complete(rid, tgt)
                held += 1
                d = pol.choose(req, now)
            if d is None:
                d = type("D", (), {"target": targets[0]})
            pol.on_dispatch(req, d.target, now)
            counts[d.target] += 1
            inflight.append((req.request_id, d.target))
            if len(inflight) > concurrency:
                rid, tgt = inflight.pop(0)
                pol.on_complete(rid, tgt)
            if k > 0:
                turns += 1
                same += last.get(pid) == d.target
            last[pid] = d.target
        print(f"{name:<16} {pol.tracker.mode:<6} {same / max(1, turns):8.2f} {held:6d} "
              f"{min(counts.values()):>9}/{max(counts.values()):<10}")
    print("\nDefaults per policy (pydantic, JSON):")
    for name in policy_names():
        print(f"  {name}: {json.dumps(build_policy(name).config.model_dump(), sort_keys=True)}")
    return 0
