"""Base of the TTFT-cost policies (GORGO, GORGO-proxy, FlowKV's normal state, GeoPrefix).

For each candidate replica ``r``:

    cost(r) = w_rtt · RTT(r)                          0 locally; ``rtt_of_target`` hook for a central LB
            + w_prefill · t_p(r) · (L − L_hit(r))     residual prefill
            + q̂ · t_p(r) · Q(r)                       admission delay: queued tokens × t_p
            [+ w_shared · t_p(r) · (L − L_hit(r)) · min(outstanding(r), w_shared_max_inflight)]

With ``price_cached_context`` (GeoPrefix) the residual prefill of ``R = L − L_hit(r)`` tokens after the
``c = L_hit(r)`` cached ones also pays its attention, ``t_p·R + q·R·(c + R/2)`` (``q`` = seconds per
prefill-attention pair, learned online from the engines' ``prefill_pairs``; 0 until learned), in the
residual and shared terms alike, and the queue term adds ``q̂ · q · Q_pairs(r)``: the pairs of the unseen
dispatches (each priced at its own dispatch) plus reported waiting × the mean pairs per request.

* ``L`` = the request's prompt tokens; ``L_hit(r)`` = the prefix this LB already sent to ``r`` (the
  approximate prefix index), in tokens at ``chars_per_token`` characters per token, capped at L
  (:func:`~ray_geolb.policy.matching.discounted_hits`: minimum length and age discount);
* ``t_p(r)`` = seconds per prefill token learned online (:mod:`~ray_geolb.policy.ttft_model`): from
  observed TTFTs, fed by ``on_complete(..., ttft_s=)`` (simulator) or by ``observe_ttft`` (Ray Serve:
  samples the replicas measure and report), or with ``ttft.source='engine_steps'`` (GeoPrefix) from the
  engines' step work between two reports (``on_stats``: the report's cumulative ``engine_work``);
* ``Q(r)`` = tokens queued ahead at ``r``: the replica's reported waiting requests × the mean prompt
  length, plus the uncached tokens of requests this LB dispatched since that report.

What a subclass chooses is its config (``CostConfig`` fields) and, for FlowKV, when to use the cost.
The prices of a choice are noted on the request (:meth:`~ray_geolb.policy.base.RouteRequest.note_pricing`)
and read back at dispatch, so the work accounting uses the estimate the choice was made with.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Dict, Hashable, Literal, Optional

from pydantic import Field, model_validator

from .base import Decision
from .config import PolicyConfig, PrefixIndexConfig
from .matching import discounted_hits, through_reply
from .prefix_policy import PrefixPolicy
from .rtt_hook import RttHook
from .ttft_model import TtftModel, TtftModelConfig, WorkItem, WorkTracker, prefill_pairs

__all__ = ["CostConfig", "CostPolicy"]


class CostConfig(PolicyConfig):
    """Fields shared by the TTFT-cost policies."""

    prefix: PrefixIndexConfig = PrefixIndexConfig()
    ttft: TtftModelConfig = TtftModelConfig()
    chars_per_token: float = Field(4.0, gt=0.0, description="characters of canonical text per token (L_hit estimate)")
    w_rtt: float = Field(1.0, ge=0.0, description="weight of the network RTT term")
    w_prefill: float = Field(1.0, ge=0.0, description="weight of the residual-prefill term")
    q_hat: float = Field(1.0, ge=0.0, description="weight of the queue-wait term (GORGO's q̂)")
    min_match_chars: int = Field(0, ge=0, description="matches shorter than this count as no match")
    match_half_life_s: Optional[float] = Field(None, gt=0.0,
                                               description="discount a match by its age (None: no discount)")
    default_prompt_tokens: int = Field(512, ge=1, description="mean prompt length assumed before any request is seen")
    tp_scope: Literal["target", "pooled"] = Field(
        "target", description="t_p per replica ('target', GORGO: each server's own rate) or one pooled fit over "
                              "this LB's replicas ('pooled')")
    w_shared: float = Field(
        0.0, ge=0.0, description="weight of the residual prefill's cost to the requests already in flight at "
                                 "the replica (each of its batch steps slows by t_p per prefill token): "
                                 "w_shared · t_p · (L − L_hit) · outstanding(r); 0 = GORGO (own TTFT only)")
    exact_upto: int = Field(32, ge=1, description="price every eligible replica up to this many; beyond, only the "
                                                  "matched ones and the `sample_unmatched` least loaded")
    w_shared_max_inflight: Optional[int] = Field(
        None, ge=1, description="the most requests in flight at a replica that the shared term counts "
                                "(n(r) capped); None: every one")
    sample_unmatched: int = Field(8, ge=1,
                                  description="unmatched replicas priced when more than `exact_upto` are eligible")
    price_cached_context: bool = Field(
        False, description="price the residual prefill's attention over the cached context: t_p·R + q·R·(c + R/2) "
                           "(R uncached tokens after c cached ones; q per prefill-attention pair, fitted online on "
                           "the engines' step work when reports carry prefill_pairs, ttft.source='engine_steps'), "
                           "and the queued requests' pairs alike; False: the linear t_p·R (q = 0; GORGO)")
    tp_floor: Literal["none", "prior"] = Field(
        "none", description="lower bound on the fitted t_p: 'none' (the fit as is) or 'prior' (never below "
                            "ttft.prior_tp_s: a fit dominated by queueing can clamp to 0, which erases the "
                            "residual-prefill term and with it all prefix affinity)")
    holder_pass_share: Optional[float] = Field(
        None, gt=0.0, le=1.0,
        description="while some replica has a slot, a replica with none left still competes (priced by its queue) "
                    "for a request whose prompt it holds at least this share of, if it has KV room and a free "
                    "sequence slot: a cache hit is cheap work, and sent elsewhere it is prefilled in full; "
                    "None: off (only replicas with a slot compete)")

    @model_validator(mode="after")
    def _holder_pass_is_not_the_region_gate(self):
        """Both set by the caller: refused. A policy's default share under the region gate: off (the gate already
        lets every replica with room compete)."""
        if (self.holder_pass_share is not None and "holder_pass_share" in self.model_fields_set
                and self.availability.gate == "region"):
            raise ValueError("holder_pass_share and availability.gate='region' cannot be combined: the region gate "
                             "already lets every replica with room compete; set one of them")
        return self


class CostPolicy(RttHook, PrefixPolicy):
    """Prefix index + online TTFT model + per-target work accounting; ``_cost`` is the subclass's."""

    default_availability = "sp-p"

    def __init__(self, config=None, targets=(), clock=None, rtt_of_target: Callable = None, **kw):
        super().__init__(config, targets=targets, clock=clock, **kw)
        self.ttft = TtftModel(self.config.ttft, fit_pairs=self.config.price_cached_context)
        self.work = WorkTracker()
        self._mean_pairs = 0.0  # mean prefill-attention pairs per dispatched request (price_cached_context)
        self._work_seen: Dict[Hashable, tuple] = {}  # target -> (timestamp, engine_work) of its last report
        self._mean_prompt = float(self.config.default_prompt_tokens)
        self._reason = f"{self.name}_cost"
        self._seen_prompts = 0
        self.rtt_of_target = rtt_of_target  # RttHook (policy/rtt_hook.py)
        self.tracker.prefill_rate = self.prefill_rate  # SP-P's unreported-work cap (prefill_budget_reports)

    # ------------------------------------------------------------ estimates
    @property
    def mean_prompt_tokens(self) -> float:
        return self._mean_prompt

    def _hits(self, req, targets, now: float) -> Dict[Hashable, float]:
        """Estimated cached tokens per target (match length, min-length and age rules applied)."""
        cfg = self.config
        p = self.prepared(req)
        times = {}
        match = self.index.match(p, self.available_view(targets), times)
        if self.infers_replies:
            through_reply(match, p, req.reply_span)
        return discounted_hits(match, req.prompt_tokens,
                               cfg.chars_per_token, cfg.min_match_chars, cfg.match_half_life_s, self.index, p, now,
                               times)

    def queued_tokens(self, target: Hashable) -> float:
        """Prefill tokens ahead of a new request at ``target``: reported waiting + unseen dispatches."""
        s = self.tracker.stats(target)
        if s is None:
            return 0.0 + self.work.unseen_uncached(target, None)
        return s.num_waiting * self._mean_prompt + self.work.unseen_uncached(target, s.timestamp)

    def queued_pairs(self, target: Hashable) -> float:
        """Prefill-attention pairs ahead of a new request at ``target`` (``price_cached_context``): reported
        waiting × the mean pairs per request + the unseen dispatches' own."""
        s = self.tracker.stats(target)
        if s is None:
            return self.work.unseen_sums(target, None)[2]
        return s.num_waiting * self._mean_pairs + self.work.unseen_sums(target, s.timestamp)[2]

    def pair_coef(self, target: Hashable = None) -> float:
        """Seconds per prefill-attention pair at ``target`` (pooled with ``tp_scope='pooled'`` or ``target``
        None); 0 without ``price_cached_context`` or before the fit has learned it."""
        if not self.config.price_cached_context:
            return 0.0
        if target is None or self.config.tp_scope == "pooled":
            return self.ttft.pair_coef()
        return self.ttft.pair_coef(target)

    def _floor(self, tp: float, qq: float = 0.0) -> float:
        """``tp_floor='prior'``: the prior is a TTFT slope (per token of a prompt prefilled from zero), so with
        a per-pair price ``qq`` the floor holds for ``t_p + qq·mean_prompt/2`` (the slope of a mean prompt),
        not for the per-token term alone, which the pairs fit leaves net of attention."""
        if self.config.tp_floor != "prior":
            return tp
        if qq:
            return max(tp, self.config.ttft.prior_tp_s - qq * 0.5 * self._mean_prompt)
        return max(tp, self.config.ttft.prior_tp_s)

    def pooled_t_p(self) -> float:
        """Seconds per prefill token over this LB's replicas (the pooled fit, ``tp_floor`` applied)."""
        if self.config.price_cached_context:
            return self._floor(self.ttft.t_p(), self.ttft.pair_coef())
        return self._floor(self.ttft.t_p())

    def region_t_p(self) -> float:
        """The region layer's t_p for this LB's replicas (``LocalLayer``): the pooled fit, floor applied. The
        region layer prices prefill linearly; with ``price_cached_context`` it gets the per-token price of a
        mean prompt prefilled from zero, ``t_p + q·mean_prompt/2`` (what the 3-term fit's t_p approximates)."""
        tp = self.pooled_t_p()
        if self.config.price_cached_context:
            tp += self.ttft.pair_coef() * 0.5 * self._mean_prompt
        return tp

    def t_p(self, target: Hashable) -> float:
        """Seconds per prefill token at ``target`` (its own fit, or the pooled one; see ``tp_scope``)."""
        if self.config.tp_scope == "pooled":
            return self.pooled_t_p()
        if self.config.price_cached_context:
            return self._floor(self.ttft.t_p(target), self.ttft.pair_coef(target))
        return self._floor(self.ttft.t_p(target))

    def costs(self, req, eligible, now: float, hits: Optional[Dict[Hashable, float]] = None) -> Dict[Hashable, float]:
        """Estimated cost per candidate. Up to ``exact_upto`` eligible replicas every one is priced;
        beyond that (a large fleet behind one LB), the replicas with a prefix match plus the
        ``sample_unmatched`` least-loaded others -- an unmatched replica's cost only grows with its
        load, so the cheapest unmatched one is almost always among the least loaded (exact when the
        RTT term is the same for all)."""
        cfg = self.config
        if hits is None:  # else the caller matched already (the holder pass: one match over more targets)
            hits = self._hits(req, eligible, now)
        cands = eligible
        outstanding = self.tracker.outstanding
        if len(eligible) > cfg.exact_upto:
            rest = [t for t in eligible if t not in hits]
            if len(rest) > cfg.sample_unmatched:
                rest = heapq.nsmallest(cfg.sample_unmatched, rest, key=outstanding)
            cands = [t for t in eligible if t in hits] + rest
        req.note_pricing(self, hits, cands)  # read back at dispatch (_record) and by _pick
        L = req.prompt_tokens
        pairs = cfg.price_cached_context
        qq = 0.0
        if cfg.tp_scope != "pooled":
            pooled_tp = None
        elif pairs:
            qq = self.ttft.pair_coef()  # = self.pair_coef(), and pooled_t_p() from the same q
            pooled_tp = self._floor(self.ttft.t_p(), qq)
        else:
            pooled_tp = self.pooled_t_p()
        rtt = self.rtt if self._rtt_fn is not None else None
        w_prefill, q_hat, w_shared, w_rtt = cfg.w_prefill, cfg.q_hat, cfg.w_shared, cfg.w_rtt
        n_cap = cfg.w_shared_max_inflight
        queued_tokens = self.queued_tokens
        out_of = self.tracker._out  # outstanding(t), inlined
        qt_pooled = q_hat * pooled_tp if pooled_tp is not None else None
        stats_of = self.tracker.stats
        unseen_sums = self.work.unseen_sums
        out = {}
        for t in cands:
            if qt_pooled is not None:
                tp, qt = pooled_tp, qt_pooled
            else:
                tp = self.t_p(t)
                qt = q_hat * tp
                if pairs:
                    qq = self.pair_coef(t)
            if qq:  # R uncached after h cached: t_p·R + q·R·(h + R/2), and the queued pairs
                h = hits.get(t, 0.0)
                r = L - h if L > h else 0.0
                residual = tp * r + qq * r * (h + 0.5 * r)
                s = stats_of(t)  # queued_tokens(t) and queued_pairs(t) from one look-up
                if s is None:
                    m = unseen_sums(t, None)
                    c = w_prefill * residual + qt * m[1] + q_hat * qq * m[2]
                else:
                    m = unseen_sums(t, s.timestamp)
                    w = s.num_waiting
                    c = (w_prefill * residual + qt * (w * self._mean_prompt + m[1])
                         + q_hat * qq * (w * self._mean_pairs + m[2]))
            else:
                residual = tp * max(0.0, L - hits.get(t, 0.0))
                c = w_prefill * residual + qt * queued_tokens(t)  # qt = q_hat * tp
            if w_shared:
                n = out_of.get(t, 0)
                c += w_shared * residual * (n if n_cap is None or n < n_cap else n_cap)
            if rtt is not None:
                c += w_rtt * rtt(t, req)
            out[t] = c
        return out

    def _argmin(self, costs: Dict[Hashable, float]) -> Hashable:
        best = min(costs.values())
        tol = 1e-9 * max(1.0, abs(best)) if math.isfinite(best) else 0.0
        ties = [t for t, c in costs.items() if c <= best + tol]
        if len(ties) == 1:
            return ties[0]
        out = self.tracker.outstanding
        lo = min(out(t) for t in ties)
        ties = [t for t in ties if out(t) == lo]
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)

    def choose(self, req, now: float, candidates=None):
        share = self.config.holder_pass_share
        if share is None or self.tracker.mode != "sp-p" or self.region_gate:
            return super().choose(req, now, candidates)
        if candidates is not None and not isinstance(candidates, (list, tuple)):
            candidates = list(candidates)  # read twice below
        eligible = self.eligible(candidates)
        if not eligible:
            return None  # held at the router, as without the pass: the pass adds holders, it never starts a send
        targets = self._targets if candidates is None else candidates
        if len(eligible) == len(targets):
            return self._pick(req, eligible, now)
        pool, hits = self._with_holders(req, eligible, targets, share, now)
        return self._pick(req, pool, now, hits)

    def _with_holders(self, req, eligible, targets, share: float, now: float):
        """``(pool, hits)``: ``eligible`` plus the replicas without a slot that hold at least ``share`` of
        ``req``'s prompt and still have room for it (``LoadTracker.has_sequence_room``), in target order, and
        the pool's matches. One match over ``targets`` serves both: a target's match does not depend on which
        others are matched with it."""
        hits = self._hits(req, targets, now)
        el = set(eligible)
        need = share * req.prompt_tokens
        room = self.tracker.has_sequence_room
        holders = [t for t, h in hits.items() if t not in el and h >= need and room(t)]
        pool = self.in_target_order(eligible + holders) if holders else eligible
        keep = el.union(holders)
        return pool, {t: h for t, h in hits.items() if t in keep}

    def _pick(self, req, eligible, now, hits: Optional[Dict[Hashable, float]] = None):
        costs = self.costs(req, eligible, now, hits)
        t = self._argmin(costs)
        hits = req.pricing_by(self)[0]
        matched = int(round(hits.get(t, 0.0) * self.config.chars_per_token)) if t in hits else 0
        return Decision(t, matched, self._reason)

    def prefill_rate(self, target) -> Optional[float]:
        """Tokens per second this LB's replicas prefill: the pooled fit's t_p WITHOUT the floor (the floor
        keeps prices from collapsing to 0; SP-P's unreported-work cap needs the engine's real rate)."""
        tp = self.ttft.t_p()
        return 1.0 / tp if tp > 0 else None

    # ------------------------------------------------------------ events
    def uncached_at(self, req, target):
        pricing = req.pricing_by(self)
        if pricing is None or target not in pricing[0]:
            return None
        return max(0.0, req.prompt_tokens - pricing[0][target])

    def _record(self, req, target, now):
        pricing = req.pricing_by(self)
        hits = pricing[0] if pricing is not None else None
        if hits is None or (target not in hits and target not in pricing[1]):
            hits = self._hits(req, [target], now)  # not priced at choice time (e.g. Ray picked another replica)
        uncached = max(0.0, req.prompt_tokens - hits.get(target, 0.0))
        super()._record(req, target, now)
        pairs = prefill_pairs(uncached, req.prompt_tokens - uncached) if self.config.price_cached_context else 0.0
        self.work.add(WorkItem(req.request_id, target, now, req.prompt_tokens, uncached,
                               req.output_tokens_hint, pairs))
        self._seen_prompts += 1
        n = min(self._seen_prompts, 256)  # running mean, then an EWMA over ~256 requests
        self._mean_prompt += (req.prompt_tokens - self._mean_prompt) / n
        if self.config.price_cached_context:
            self._mean_pairs += (pairs - self._mean_pairs) / n

    def on_complete(self, request_id, target=None, now=None, ttft_s=None, ok=True, req=None):
        item = self.work.pop(request_id)
        if item is not None and ok and ttft_s is not None:
            self.ttft.observe(item.target, item.uncached_tokens, ttft_s)
        super().on_complete(request_id, target, now, ttft_s=ttft_s, ok=ok, req=req)

    def on_stats(self, target, stats):
        """The report, and (``ttft.source='engine_steps'``) the step work since this target's previous
        report: differences of the cumulative ``engine_work`` counters (a restart -- counters going back --
        only resets the baseline; an older report than the baseline is ignored). ``prefill_pairs`` is
        differenced too when both reports carry it (the 5th counter; ``zip`` stops at 4 otherwise, and the
        interval feeds the 3-term fit only)."""
        super().on_stats(target, stats)
        work = stats.engine_work
        if work is None or self.ttft.config.source != "engine_steps" or target not in self._target_set:
            return
        prev = self._work_seen.get(target)
        if prev is not None and stats.timestamp <= prev[0]:
            return
        self._work_seen[target] = (stats.timestamp, work)
        if prev is None:
            return
        d = [a - b for a, b in zip(work, prev[1])]
        if min(d) < 0:  # the engine restarted: a new baseline
            return
        if d[0] > 0:
            self.ttft.observe_work(target, *d)

    def observe_ttft(self, target, uncached_tokens, ttft_s):
        """A replica-measured sample (``uncached_tokens``: what the engine really prefilled) for the
        online t_p regression; the same model ``on_complete(..., ttft_s=)`` feeds in the simulator."""
        if target in self._target_set:
            self.ttft.observe(target, uncached_tokens, ttft_s)

    def _forget(self, target):
        super()._forget(target)
        if hasattr(self, "_work_seen"):
            self._work_seen.pop(target, None)
        if hasattr(self, "work"):
            self.work.remove_target(target)
            self.ttft.forget(target)

    def describe(self) -> dict:
        d = super().describe()
        b, s, src = self.ttft.line()
        d.update(base_s=b, t_p_s=s, t_p_source=src, mean_prompt_tokens=self._mean_prompt)
        if self.config.price_cached_context:
            d.update(prefill_pair_s=self.pair_coef(), mean_prefill_pairs=self._mean_pairs)
        return d
