"""The reply a replica cached, read from its response and handed to the router of this process.

An engine caches a request's reply blocks as it decodes them, so after a conversation turn the replica holds
the prompt *and* the reply, and the next turn starts with both (``policy.canonical.text_with_reply``). The
router's prefix index records what it sent; this module gives it the rest. When a request that a replica of
this region served finishes -- a non-streamed response, or a stream that reached its end -- the reply's text
is read from the response, and the prompt + reply text goes to the GeoPrefixRouter's ``reply_inbox`` with the
replica that served it; the router records it on its own loop (``GeoPrefixRouter._learn_replies``:
``Policy.learn_reply``). The text stays in this process: sibling routers get hash-only rows of it.

Only for a policy that ``learns_replies`` (GeoPrefix). A response with more than one choice, a prompt of token
ids, a stream that failed or was cut, or a reply over :data:`MAX_REPLY_CHARS` teaches nothing. A stream's
events are kept as they pass (no parsing per token) and read once at its end.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, List, Optional

from ray_geolb.policy.canonical import text_with_reply

logger = logging.getLogger("ray.serve")

__all__ = ["MAX_REPLY_CHARS", "ReplyCollector", "hand_reply", "reply_of_events", "reply_of_response"]

#: the longest stream (characters of its events) whose reply is learned, and so the most a stream in flight
#: keeps for it; longer ones teach nothing
MAX_REPLY_CHARS = 1 << 20


def _choice_text(choice: Any, kind: str, delta: bool) -> Optional[str]:
    if not isinstance(choice, dict):
        return None
    if kind == "completion":
        text = choice.get("text")
    else:
        msg = choice.get("delta" if delta else "message")
        text = msg.get("content") if isinstance(msg, dict) else None
    return text if isinstance(text, str) or text is None else None


def reply_of_response(res: Any, kind: str) -> Optional[str]:
    """The reply text of a non-streamed OpenAI response (``kind``: ``"chat"`` or ``"completion"``); None if
    it has not exactly one choice or no text."""
    choices = res.get("choices") if isinstance(res, dict) else None
    if not isinstance(choices, list) or len(choices) != 1:
        return None
    return _choice_text(choices[0], kind, delta=False)


def reply_of_events(events: List[str], kind: str) -> Optional[str]:
    """The reply text of a stream's SSE events (``data: {...}`` chunks, then ``data: [DONE]``): the
    concatenated deltas of choice 0. None if an event is not a chunk of one choice (an error event, another
    choice, JSON that does not parse)."""
    parts = []
    for ev in events:
        for line in ev.split("\n"):
            line = line.strip()
            if not line or line == "data: [DONE]":
                continue
            if not line.startswith("data: "):
                return None
            try:
                chunk = json.loads(line[len("data: "):])
            except ValueError:
                return None
            choices = chunk.get("choices") if isinstance(chunk, dict) else None
            if not isinstance(choices, list) or len(choices) > 1 or "error" in chunk:
                return None
            if not choices:
                continue  # a usage-only chunk
            if not isinstance(choices[0], dict) or choices[0].get("index", 0) != 0:
                return None
            text = _choice_text(choices[0], kind, delta=True)
            if text:
                parts.append(text)
    return "".join(parts)


class ReplyCollector:
    """A stream's events as they pass (:meth:`add`), read once when the stream ends (:meth:`finish` calls
    ``on_reply`` with the reply text). Nothing is kept past :data:`MAX_REPLY_CHARS`."""

    __slots__ = ("_events", "_chars", "_kind", "_on_reply", "over")

    def __init__(self, kind: str, on_reply: Callable[[str], Any]):
        self._events: List[str] = []
        self._chars = 0
        self._kind = kind
        self._on_reply = on_reply
        self.over = False

    def add(self, item: Any) -> None:
        if self.over:
            return
        for ev in (item if isinstance(item, list) else (item,)):
            if not isinstance(ev, str):  # an error mid-stream: nothing to learn
                self.over = True
            else:
                self._events.append(ev)
                self._chars += len(ev)
                self.over = self._chars > MAX_REPLY_CHARS
            if self.over:
                self._events.clear()
                return

    def finish(self) -> None:
        if not self.over:
            reply = reply_of_events(self._events, self._kind)
            if reply is not None:
                self._on_reply(reply)
        self._events = []
        self.over = True


def hand_reply(geo_router: Any, body: Any, reply: Optional[str], replica: Optional[str]) -> bool:
    """Hand the prompt + reply text of a finished request (``body``: the OpenAI body the replica got) to
    ``geo_router`` (this process's GeoPrefixRouter, or None) with the replica that served it. True if it
    was handed over. Never raises: the request was answered, and learning from it must not fail it."""
    if geo_router is None or reply is None or replica is None or len(reply) > MAX_REPLY_CHARS:
        return False
    try:
        text = text_with_reply(body, reply)
        if text is None:
            return False
        geo_router.reply_inbox.append((text, replica))
        geo_router.publish_soon_threadsafe()
    except Exception:  # noqa: BLE001 - a body the canonical text refuses, a router shutting down
        logger.debug("a reply could not be handed to the router", exc_info=True)
        return False
    return True
