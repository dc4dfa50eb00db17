"""Timings that ``bench_router.py``'s timed router subclasses record, in this process.

The subclasses are pickled by value (Ray Serve ships a router class's module that way), so a dict in
``bench_router.py`` itself would be a copy in the router's closure. The router of a handle made in
this process runs in this process, and imports this module by name at call time (``benchmarks/`` is
on ``sys.path`` when a benchmark runs), so both sides see the one dict below. Benchmark code only:
nothing in the shipped package keeps scratch space for it.
"""

#: ("bench" | "bench-cpu", router label) -> {internal request id: seconds in the router's hooks}
TIMES: dict = {}

#: ``bench_router.py --stages``: stage label -> thread CPU seconds in it, over the current router's run
STAGES: dict = {}
