"""A helper the simulator's fault tests share: run a :class:`~ray_geolb.sim.simulator.Simulator` and keep
every request it answered (imported by plain name: pytest puts this folder on ``sys.path``)."""


def run_recording(sim):
    """Run ``sim``; returns ``(sim, result, done)`` where ``done`` lists each request answered, in order."""
    done = []
    orig = sim._on_client_done

    def record(req, b):
        done.append(req)
        orig(req, b)

    sim._on_client_done = record
    return sim, sim.run(), done
