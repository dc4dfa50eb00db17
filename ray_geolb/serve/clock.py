"""The one clock every routing decision in Serve is priced on.

:func:`policy_now` is wall time (``time.time``). The router's prefix tree, the replicas' load
reports (stamped in other processes), the registry-relayed peer states and the regional snapshot
persisted in the registry are all compared with it, so it has to be a clock that every process and
every restart share. (The ingress once priced with ``time.monotonic`` against a tree stamped with
``time.time``: every match looked newer than "now" and the age discount was skipped.) Durations
measured inside one process (RTT probes, admission waits, log throttling) use ``time.monotonic``.
The simulator drives the same policy objects with its virtual ``now``.
"""

from __future__ import annotations

import time

__all__ = ["policy_now"]

policy_now = time.time
