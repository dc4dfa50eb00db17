"""The region LB's one queue rule (``policy/region/queue_rule.py``): FCFS for local capacity only -- a
newcomer behind waiting requests may forward (or be rejected) but not take a local slot, only the head
goes local -- a full queue refuses, a wait limit applies; with ``forward_past_queue`` off, strict FCFS.
The Serve ingress's ``AdmissionQueue`` and the simulator's ``RegionLB`` both run it
(``tests/sim/test_region_lbs_follow_the_serve_ingress_queue_rules.py`` checks that they call it)."""

import math

import pytest

from ray_geolb.policy.region import RegionDecision
from ray_geolb.policy.region.queue_rule import (
    GO,
    QUEUE_FULL,
    QUEUED_BEHIND,
    REFUSE,
    WAIT,
    WAIT_TIMEOUT,
    QueueRule,
    Verdict,
)

HOLD = RegionDecision("hold", reason="local_full")
LOCAL = RegionDecision("local", "us-0", 0, "local_available")
FORWARD = RegionDecision("forward", "eu", 0, "prefix")
REJECT = RegionDecision("reject", reason="tenant")

RULE = QueueRule(max_queue=2, max_wait_s=5.0)


@pytest.mark.parametrize("d, waiting, expected", [
    (LOCAL, 0, Verdict(GO, "local_available")),  # nobody waits: anything but hold goes on
    (FORWARD, 0, Verdict(GO, "prefix")),
    (REJECT, 0, Verdict(GO, "tenant")),
    (HOLD, 0, Verdict(WAIT, "local_full")),
    (FORWARD, 1, Verdict(GO, "prefix")),  # behind waiting requests a forward goes straight on
    (REJECT, 1, Verdict(GO, "tenant")),  # ... and so does a reject
    (LOCAL, 1, Verdict(WAIT, QUEUED_BEHIND)),  # ... but a local slot is the head's
    (HOLD, 1, Verdict(WAIT, "local_full")),
    (None, 1, Verdict(WAIT, QUEUED_BEHIND)),  # strict FCFS: joins undecided
    (HOLD, 2, Verdict(REFUSE, QUEUE_FULL)),  # max_queue already wait: refused (Serve's 429)
    (LOCAL, 2, Verdict(REFUSE, QUEUE_FULL)),
    (None, 2, Verdict(REFUSE, QUEUE_FULL)),
    (FORWARD, 2, Verdict(GO, "prefix")),  # a full queue does not stop a forward
])
def test_a_newcomer(d, waiting, expected):
    assert RULE.admit(d, waiting) == expected


@pytest.mark.parametrize("d, is_head, expected", [
    (LOCAL, True, Verdict(GO, "local_available")),  # only the head takes a local slot
    (FORWARD, True, Verdict(GO, "prefix")),
    (HOLD, True, Verdict(WAIT, "local_full")),
    (LOCAL, False, Verdict(WAIT, None)),  # behind the head: no local slot, and no new reason to wait
    (FORWARD, False, Verdict(GO, "prefix")),  # ... but it may be forwarded past the queue
    (REJECT, False, Verdict(GO, "tenant")),
    (HOLD, False, Verdict(WAIT, "local_full")),
])
def test_a_waiting_request_decided_again(d, is_head, expected):
    assert RULE.again(d, is_head) == expected


def test_the_wait_limit():
    assert RULE.wait_limit() == 5.0 and RULE.wait_limit(2.0) == 2.0 and RULE.wait_limit(9.0) == 5.0
    assert RULE.timed_out(0.0) == Verdict(REFUSE, WAIT_TIMEOUT)  # Serve's 503
    assert RULE.timed_out(-1e-9).action == REFUSE and RULE.timed_out(1e-9).action == WAIT


def test_an_unbounded_strict_fcfs_queue_never_refuses():
    """The simulator's central LB: no bound, no wait limit, only the head is decided."""
    central = QueueRule(forward_past_queue=False)
    assert central.admit(HOLD, 10_000) == Verdict(WAIT, "local_full") and central.wait_limit() is None
    assert central.decides_newcomer(0) and not central.decides_newcomer(1)
    assert RULE.decides_newcomer(0) and RULE.decides_newcomer(1)
    assert QueueRule().wait_limit(3.0) == 3.0 and not math.isnan(RULE.wait_limit())
