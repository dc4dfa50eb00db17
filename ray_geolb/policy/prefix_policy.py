"""Base for the policies that keep an approximate prefix index over their targets (SkyLB, SGLang's
cache-aware router, Ray's prefix-affinity router, and the cost policies).

The index records what this router *sent* where (``_record``, at dispatch); ``prepared(req)`` is the
request's text hashed into the index's blocks, computed once per request
(:meth:`~ray_geolb.policy.base.RouteRequest.prepared_for`) and shared by ``choose`` and dispatch.
"""

from .base import Policy

__all__ = ["PrefixPolicy"]


class PrefixPolicy(Policy):
    """Base for policies that keep an approximate prefix index over their targets."""

    def __init__(self, config=None, targets=(), clock=None, **kw):
        self._clock = clock
        super().__init__(config, targets=targets, **kw)

    def _targets_changed(self):
        if self.index is None:
            self.index = self.config.prefix.build(self._clock)

    def prepared(self, req):
        return req.prepared_for(self.index)

    def _record(self, req, target, now):
        self.index.insert(self.prepared(req), target, now)

    def _forget(self, target):
        self.index.remove_target(target)
