"""ray_geolb: a multi-region, prefix-aware request router for Ray Serve LLM.

Layout:
  ray_geolb.policy  pure decision logic (no Ray import): shared by the simulator and the Ray router
  ray_geolb.engine  emulated engine model (+ profiles, tokens, network RTTs, wall-clock driver)
  ray_geolb.sim     discrete-event multi-region simulator (steps the engine in virtual time)
  ray_geolb.serve   thin Ray Serve adapters (router, registry actor, region ingress, servers)
"""

__version__ = "0.1.0"
