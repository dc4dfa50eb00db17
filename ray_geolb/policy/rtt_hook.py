"""The network term's hook a driver sets on a cost policy: ``rtt_of_target``, a callable ``target -> seconds``
or ``(target, request) -> seconds`` (the simulator's central LBs with ``rtt_aware``: RTT client -> LB ->
replica). GORGO's cost (v1, ``cost_policy.py``) and GORGO v2's (``algorithms/gorgo_v2.py``) read it."""

from __future__ import annotations

import inspect
from typing import Callable, Hashable, Optional

__all__ = ["RttHook"]


class RttHook:
    """Mixin: the ``rtt_of_target`` property (validated when set) and :meth:`rtt` (seconds, 0 without a hook)."""

    _rtt_fn: Optional[Callable] = None
    _rtt_two = False  # the hook takes (target, request)

    @property
    def rtt_of_target(self):
        return self._rtt_fn

    @rtt_of_target.setter
    def rtt_of_target(self, fn):
        if fn is not None and not callable(fn):
            raise TypeError("rtt_of_target must be a callable target -> seconds (or (target, request) -> seconds)")
        self._rtt_fn = fn
        self._rtt_two = False
        if fn is not None:
            try:
                params = [p for p in inspect.signature(fn).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                self._rtt_two = len(params) >= 2
            except (TypeError, ValueError):
                self._rtt_two = False

    def rtt(self, target: Hashable, req) -> float:
        """Seconds from the hook for ``target`` (0.0 without one); ValueError if it returns a bad value."""
        fn = self._rtt_fn
        if fn is None:
            return 0.0
        v = float(fn(target, req) if self._rtt_two else fn(target))
        if not v >= 0.0:
            raise ValueError(f"rtt_of_target({target!r}) returned {v!r}; RTT must be a number >= 0")
        return v
