"""GeoPrefixRouter's requests and what each one holds, from its first ``choose_replicas`` call to its
completion (one owner for all of it, so every path that ends a request returns everything):

* an **entry** (:class:`Entry`): the request as the policy sees it (a ``RouteRequest``), from the first
  ``choose_replicas`` call until Ray confirms it routed (or it is dropped);
* a **reservation** (``policy.reserve`` / ``policy.release``), taken when ``choose_replicas`` picks a replica, so
  two requests routed before the first is acknowledged do not both see the same headroom;
* a place in the **FCFS hold queue** (``policy.hold_queue.HoldQueue``, prompt tokens summed) while
  selective pushing holds it, with a wake-up event its routing task sleeps on;
* an **in-flight** record once routed (confirmed by ``on_request_routed``), until
  ``on_request_completed`` (which Ray may call first, for a request answered at once: see
  :meth:`RequestBook.completed`);
* a line in the bounded **decision log** (which replica, why, matched prefix, wait); the region
  ingress gets its call's line on the call's :class:`~ray_geolb.serve.CallTicket`, which also
  brought the ingress's prepared ``RouteRequest`` (:meth:`RequestBook.new_entry`).

:meth:`RequestBook.forget` drops every trace of a request that will not be routed (failed, cancelled,
timed out); :meth:`RequestBook.completed` ends one that was.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple

from ray_geolb.policy import RouteRequest, canonical_text
from ray_geolb.policy.canonical import PromptFormatError, reply_span
from ray_geolb.policy.hold_queue import HoldQueue
from ray_geolb.serve import CallTicket
from ray_geolb.serve.clock import policy_now

__all__ = ["Entry", "RequestBook", "extract_prompt", "extract_prompt_text"]

_DONE_FIRST_KEEP_S = 5.0  # how long a completion that came before its on_request_routed waits for it


def call_ticket(pr) -> Optional[CallTicket]:
    """The region ingress's ticket for this model call -- the request object's ``request_id``, which
    the ingress sets to the :class:`~ray_geolb.serve.CallTicket` its ``LocalSlot`` minted, and which
    reaches this router as the same object (same process) -- or None: a plain call, or an id a
    client chose (a plain string is never a ticket)."""
    args = getattr(pr, "args", None)
    first = args[0] if args else None
    rid = None if first is None or isinstance(first, dict) else getattr(first, "request_id", None)
    return rid if isinstance(rid, CallTicket) else None


def extract_prompt_text(args, kwargs) -> Optional[str]:
    """Canonical text of a Serve call's prompt, or None if there is none we understand (:func:`extract_prompt`)."""
    return extract_prompt(args, kwargs)[0]


def extract_prompt(args, kwargs) -> Tuple[Optional[str], Optional[Tuple[int, int]]]:
    """Canonical text of a Serve call's prompt and where the last reply a chat carries back lies in it
    (``canonical.reply_span``), or ``(None, None)`` if there is no prompt we understand.

    First positional argument with ``.messages`` / ``.prompt`` (Ray Serve LLM's
    ChatCompletionRequest / CompletionRequest), a plain string, or a dict body; else keyword
    arguments ``body`` / ``request`` / ``prompt`` / ``messages``.
    """
    cands = []
    if args:
        cands.append(args[0])
    if kwargs:
        for k in ("body", "request", "prompt_or_body", "prompt"):
            if k in kwargs:
                cands.append(kwargs[k])
        if "messages" in kwargs:
            cands.append({"messages": kwargs["messages"]})
    for c in cands:
        if isinstance(c, (str, bytes, dict)) or hasattr(c, "messages") or hasattr(c, "prompt"):
            try:
                text = canonical_text(c)
                return text, reply_span(c, text)
            except PromptFormatError:
                continue
    return None, None


class Entry:
    """A request ``choose_replicas`` has seen and that is not yet confirmed routed."""

    __slots__ = ("req", "pr", "created", "target", "matched", "reason", "fallback", "wake", "task")

    def __init__(self, req: RouteRequest, pr, created: float):
        self.req = req
        self.pr = pr
        self.created = created
        self.target: Optional[str] = None  # reserved replica (unique_id)
        self.matched = 0
        self.reason = ""
        self.fallback = False
        self.wake: Optional[asyncio.Event] = None
        self.task = None


def _entry_tokens(ent: Entry) -> int:
    return ent.req.prompt_tokens


class RequestBook:
    """See the module docstring. Runs on the router's event loop; the read-only counts (``len``,
    ``held.tokens``) may be read from other threads."""

    def __init__(self, policy, region: Optional[str], counters: Dict[str, int], decision_log_size: int):
        self.policy = policy
        self.region = region
        self.counters = counters
        self.entries: Dict[str, Entry] = {}
        # held requests, FCFS by internal id, with their prompt-token sum (the region layer's Q_lb)
        self.held: "HoldQueue[str, Entry]" = HoldQueue(_entry_tokens)
        self._task_iid: Dict[Any, str] = {}
        self.inflight: Dict[str, tuple] = {}  # internal id -> (target, RouteRequest, routed at)
        self.decisions: "OrderedDict[str, dict]" = OrderedDict()
        self._reconciled: "OrderedDict[str, None]" = OrderedDict()  # ids released by reconcile, recent ones
        # internal id -> (entry, picked, replica, monotonic time): completions that came before their
        # on_request_routed (see completed); kept _DONE_FIRST_KEEP_S, for the routed call that follows
        self._done_first: "OrderedDict[str, tuple]" = OrderedDict()
        self._decision_log_size = int(decision_log_size)
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    # ------------------------------------------------------------ entries and reservations
    def entry_for(self, pr) -> Entry:
        """The request's entry, made on its first call; a retry's earlier reservation is undone."""
        ent = self.entries.get(pr.metadata.internal_request_id)
        if ent is None:
            return self.new_entry(pr)
        if ent.target is not None:  # retried (rejected, or Ray could not use our pick): undo
            self.unreserve(ent)
        return ent

    def new_entry(self, pr) -> Entry:
        md = pr.metadata
        if self._done_first:
            self._done_first.pop(md.internal_request_id, None)  # routed again (a retry): that send is over
        ticket = call_ticket(pr)
        handed = None if ticket is None else ticket.take()  # the region ingress's, same process
        if handed is not None:
            text, span = handed.text, handed.reply_span  # canonicalised once per hop, by the ingress
            self.counters["handed_over"] += 1
        else:
            text, span = extract_prompt(pr.args, pr.kwargs)
        if text is None:
            self.counters["no_prompt"] += 1
            text = ""
        req = RouteRequest(request_id=md.internal_request_id, text=text,
                           session_key=getattr(md, "session_id", None) or None, region=self.region, reply_span=span)
        if handed is not None:
            req.share_prepared(handed)  # and hashed once: the blocks of any index it was prepared for
            req.output_tokens_hint = handed.output_tokens_hint  # the effective max_tokens: the price
        ent = Entry(req, pr, pr.created_at)
        self.entries[md.internal_request_id] = ent
        return ent

    def reserve(self, ent: Entry, decision, now: float) -> None:
        """The policy picked ``decision.target`` for this request: count it there until routed."""
        self.policy.reserve(ent.req, decision.target, now)
        ent.target, ent.matched, ent.reason, ent.fallback = decision.target, decision.matched, decision.reason, False

    def unreserve(self, ent: Entry) -> None:
        if ent.target is not None:
            self.policy.release(ent.req.request_id, ent.target, policy_now())
            ent.target = None

    def forget(self, iid: str) -> None:
        """Drop every trace of a request that will not be routed (failed, cancelled, timed out)."""
        ent = self.entries.pop(iid, None)
        was_head = self.held.is_head(iid)
        self.unhold(iid, ent)
        if ent is not None:
            self.unreserve(ent)
        if was_head:
            self.wake_head()

    # ------------------------------------------------------------ the FCFS hold queue
    def is_head(self, iid: str) -> bool:
        """True when nothing older than ``iid`` is held (requests already gone are dropped first)."""
        if self.held:
            self.purge_head()
        return not self.held or self.held.head()[0] == iid

    def hold(self, ent: Entry, iid: str) -> None:
        if self.held.append(iid, ent):
            self.counters["held"] += 1
        if ent.wake is None:
            ent.wake = asyncio.Event()
        task = asyncio.current_task()
        if task is not None and ent.task is not task:
            if ent.task is not None:
                self._task_iid.pop(ent.task, None)
            ent.task = task
            self._task_iid[task] = iid

    def unhold(self, iid: str, ent: Optional[Entry]) -> None:
        self.held.remove(iid)
        if ent is not None and ent.task is not None:
            self._task_iid.pop(ent.task, None)
            ent.task = None

    def release_head(self, iid: str, ent: Entry) -> None:
        """A held request got a replica: it leaves the queue and the next one is woken."""
        if iid in self.held:
            self.unhold(iid, ent)
            self.wake_head()

    def purge_head(self) -> None:
        held = self.held
        while held:
            iid, ent = held.head()
            if not ent.pr.future.done():
                return
            self.forget(iid)

    def wake_head(self) -> None:
        """Set the head's event (from any thread) so its routing task tries again now."""
        self.purge_head()
        if not self.held:
            return
        ent = self.held.head()[1]
        if ent.wake is None:
            return
        loop = self.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            ent.wake.set()
        else:
            loop.call_soon_threadsafe(ent.wake.set)

    def wake_event(self, task) -> Optional[asyncio.Event]:
        """The wake-up event of the held request whose routing task is ``task`` (None: not held)."""
        iid = self._task_iid.get(task)
        ent = self.entries.get(iid) if iid is not None else None
        return None if ent is None else ent.wake

    # ------------------------------------------------------------ routed and completed
    def routed(self, pr, target: str, local: bool, now: float, policy_name: str) -> RouteRequest:
        """Ray confirmed the request on ``target``: the entry becomes an in-flight record (or, if its
        completion came first, is dispatched and completed at once). Returns the request."""
        md = pr.metadata
        iid = md.internal_request_id
        done_first = self._done_first.pop(iid, None) if self._done_first else None
        if done_first is not None and done_first[2] != target:
            done_first = None  # the completion was another replica's (a rejected send)
        ent = self.entries.pop(iid, None)
        picked = None if ent is None else ent.target
        if ent is None and done_first is not None:
            ent, picked = done_first[0], done_first[1]  # forgotten (and unreserved) when its completion came
        elif ent is None:
            ent = self.new_entry(pr)
            self.entries.pop(iid, None)
        if iid in self.held:
            self.unhold(iid, ent)
        if ent.target is not None and ent.target != target:
            self.unreserve(ent)
        if local:
            self.policy.on_dispatch(ent.req, target, now)
            if done_first is None:
                self.inflight[iid] = (target, ent.req, now)
            else:
                self.policy.on_complete(iid, target, now, req=ent.req)
        if done_first is not None:
            self.counters["completed_before_routed"] = self.counters.get("completed_before_routed", 0) + 1
        self.counters["routed"] += 1
        rec = {
            "replica": target,
            "matched": ent.matched if picked == target else 0,
            "reason": ent.reason if picked == target or ent.fallback else "ray_reassigned",
            "queue_wait_s": max(0.0, now - pr.created_at),
            "region": self.region,
            "policy": policy_name,
            "fallback": ent.fallback,
            "request_id": md.request_id,
            "internal_request_id": iid,
        }
        self._log_decision(md, iid, rec)
        ticket = call_ticket(pr)
        if ticket is not None:  # back to the region ingress, with its call
            ticket.decision = rec
        return ent.req

    def _log_decision(self, md, iid: str, rec: dict) -> None:
        dec = self.decisions
        dec[iid] = rec
        if md.request_id and md.request_id != iid:
            dec[md.request_id] = rec
        while len(dec) > self._decision_log_size:
            dec.popitem(last=False)

    def completed(self, iid: str, replica_uid: str) -> None:
        """The request left ``replica_uid`` (done, failed, cancelled, or rejected before acceptance)."""
        x = self.inflight.pop(iid, None)
        if x is not None:
            target, req, _ = x
            self.policy.on_complete(iid, target, policy_now(), req=req)
        elif self._reconciled.pop(iid, 0) is None:
            # released on an idle report before its completion arrived: the completion was late, not lost
            self.counters["reconciled_then_completed"] = self.counters.get("reconciled_then_completed", 0) + 1
        else:
            # Not routed (yet). Either it was never accepted: the replica rejected it (Ray routes it
            # again and choose_replicas makes a new entry), or the caller went away after the replica
            # was chosen and before it answered (Ray cancels the send). Or it was, and its completion
            # came first: Ray 2.60 registers the completion callback before it awaits the replica's
            # acceptance and calls on_request_routed after, so a request answered at once can complete
            # before it is routed. Either way the entry and its reservation go -- unless a retry already
            # reserved another replica for it -- and the entry is kept a few seconds for the routed call
            # that may follow (``routed`` then dispatches and completes it at once).
            ent = self.entries.get(iid)
            if ent is not None and ent.target in (None, replica_uid):
                picked = ent.target
                self.forget(iid)
                self._keep_done_first(iid, replica_uid, ent, picked)
        if self.held:
            self.wake_head()

    def _keep_done_first(self, iid: str, replica_uid: str, ent: Entry, picked: Optional[str]) -> None:
        now = time.monotonic()
        ent.pr = ent.wake = None  # forgotten: only its request and decision are read again, not Ray's call
        kept = self._done_first
        kept.pop(iid, None)
        kept[iid] = (ent, picked, replica_uid, now)
        while kept:  # rejected and cancelled sends are never routed: theirs go after a few seconds
            at = next(iter(kept.values()))[3]
            if at >= now - _DONE_FIRST_KEEP_S and len(kept) <= self._decision_log_size:
                break
            kept.popitem(last=False)

    def oldest_inflight(self, n: int) -> list:
        """``[[request id, target], ...]`` of the first ``n`` in-flight records (oldest first)."""
        return [[req.request_id, t] for t, req, _ in list(self.inflight.values())[:n]]

    def reconcile(self, uid: str, idle_at: float, grace_s: float) -> int:
        """Replica ``uid`` reported an idle engine (nothing waiting, nothing running) at ``idle_at``:
        a record routed there more than ``grace_s`` before that cannot still be at the engine (nor on
        its way), so its completion was lost (Ray never called ``on_request_completed``). It goes,
        counted in ``counters["reconciled"]``, so the replica's SP-P slots come back. Returns how many."""
        gone = [iid for iid, (t, _req, at) in self.inflight.items() if t == uid and at < idle_at - grace_s]
        for iid in gone:
            _t, req, _at = self.inflight.pop(iid)
            self.policy.on_complete(iid, uid, idle_at, req=req)
            self._reconciled[iid] = None
            while len(self._reconciled) > self._decision_log_size:
                self._reconciled.popitem(last=False)
        if gone:
            self.counters["reconciled"] = self.counters.get("reconciled", 0) + len(gone)
        return len(gone)

    def drop_replica(self, uid: str) -> None:
        """A replica died: its in-flight records go (Ray will not report their completion)."""
        for iid, (t, _req, _at) in list(self.inflight.items()):
            if t == uid:
                del self.inflight[iid]
