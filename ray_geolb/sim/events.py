"""The simulator's event kinds: ``(time, seq, kind, a, b)`` on one heap (``sim/simulator.py``); the LB
events' ``a`` is a :class:`~ray_geolb.sim.region_lb.RegionLB`, whose methods handle them."""

LB_ARRIVE, REP_ARRIVE, STEP_END, STEP_WAKE, LB_DONE, CLIENT_DONE = 0, 1, 2, 3, 4, 5
STATS_MEASURE, STATS_DELIVER, HEARTBEAT, REG_ARRIVE, PROG_START, OPEN_ARRIVAL, SAMPLE, PING_REPLY = (
    6, 7, 8, 9, 10, 11, 12, 13)
REG_REPLY, RTT_PROBE, LB_TIMEOUT, RETRY = 14, 15, 16, 17
#: cross-region work stealing (policy/region/steal.py): an offer reaching its victim, a stolen request
#: reaching its thief, the thief's answer (taken / refused, the request back with it) reaching the victim
STEAL_OFFER, STEAL_ARRIVE, STEAL_SETTLE, STEAL_ANSWER = 18, 19, 20, 21
#: region outages and partitions (sim/faults.py): a fault's begin / end / failover decision (``a`` the action,
#: ``b`` the fault), and a call that could not connect coming back to its caller (``a`` the LB)
FAULT, CALL_FAILED = 22, 23
