"""Streams that own what their request holds.

A streamed response is a :class:`TokenStream`, closed in the ``finally`` of whatever consumes it
(the HTTP response, a peer's relay), so a client leaving at any point -- before its first token,
while streaming, while held here or in the router -- returns everything. A consumer that stops
asking for the next item without closing (a peer's relay whose origin died stays suspended at
its ``yield`` for good) is timed out too: after ``stream_idle_timeout_s`` the stream closes itself.
``asyncio.CancelledError`` is not an ``Exception``: nothing here owns accounting with ``except Exception``.
"""

from __future__ import annotations

import asyncio
from typing import Optional

from ray_geolb.aio import within

from .errors import GeoHTTPError

__all__ = ["NO_TOKEN", "TokenStream", "aclose_quietly", "cancel_quietly"]

#: "no first token yet" (a stream whose first token has not been read ahead)
NO_TOKEN = object()


def cancel_quietly(gen) -> None:
    """Cancel a Ray streaming response (anything with ``cancel()``; other objects are left alone)."""
    cancel = getattr(gen, "cancel", None)
    if cancel is not None:
        try:
            cancel()
        except Exception:  # noqa: BLE001 - already finished or gone
            pass


async def aclose_quietly(agen) -> None:
    try:
        await agen.aclose()
    except Exception:  # noqa: BLE001
        pass


class TokenStream:
    """The tokens of a streamed request, as an async iterator that owns what the request holds.

    ``aclose()`` (idempotent) stops the source (a Ray streaming response or a relay) and calls
    ``on_close`` once -- the ingress calls it from the ``finally`` of whatever consumes the stream
    (the HTTP response, a peer's relay), so a client that leaves at any point returns the slot. It
    is a class rather than an async generator function because a generator that is never started
    never runs its ``finally``."""

    def __init__(self, source, first=NO_TOKEN, on_close=None, idle_timeout_s: Optional[float] = None,
                 where: str = "", watch=None):
        self._source = source
        #: sees each item handed out (``watch.add``) and the source's end (``watch.finish``), e.g. a
        #: ``replies.ReplyCollector``; its errors never reach the stream
        self._watch = watch
        self._first = first
        self._on_close = on_close
        self._closed = False
        self._idle = idle_timeout_s  # longest wait for the next item, and for the consumer (None: no bound)
        self._where = where
        self._consumer_timer: Optional[asyncio.TimerHandle] = None
        self.consumer_gone = False

    def __aiter__(self):
        return self

    def _handed_out(self, item):
        """An item goes to the consumer: if it does not come back for the next one within the idle
        timeout (a peer whose origin died leaves its relay suspended for good; a client that stopped
        reading), the stream is closed here, so what it holds is returned all the same."""
        if self._watch is not None:
            self._tell_watch("add", item)
        if self._idle is not None:
            self._consumer_timer = asyncio.get_running_loop().call_later(self._idle, self._consumer_stalled)
        return item

    def _consumer_stalled(self) -> None:
        self._consumer_timer = None
        if not self._closed:
            self.consumer_gone = True
            asyncio.ensure_future(self.aclose())

    async def __anext__(self):
        if self._consumer_timer is not None:
            self._consumer_timer.cancel()
            self._consumer_timer = None
        if self._closed:
            raise StopAsyncIteration
        if self._first is not NO_TOKEN:
            tok, self._first = self._first, NO_TOKEN
            return self._handed_out(tok)
        try:
            if self._idle is None:
                return self._handed_out(await self._source.__anext__())
            return self._handed_out(await within(self._source.__anext__(), self._idle))
        except asyncio.TimeoutError:
            await self.aclose()
            raise GeoHTTPError(504, f"{self._where}: no token for {self._idle:g} s (stream_idle_timeout_s)",
                               type_="stream_timeout") from None
        except StopAsyncIteration:  # the source ended: the whole stream went out
            if self._watch is not None:
                self._tell_watch("finish")
            await self.aclose()
            raise
        except BaseException:  # errors, cancellation: release now
            await self.aclose()
            raise

    def _tell_watch(self, what: str, *args) -> None:
        try:
            getattr(self._watch, what)(*args)
        except Exception:  # noqa: BLE001 - a watcher never breaks the stream
            self._watch = None

    async def aclose(self) -> None:
        if self._consumer_timer is not None:
            self._consumer_timer.cancel()
            self._consumer_timer = None
        if self._closed:
            return
        self._closed = True
        cb, self._on_close = self._on_close, None
        try:
            cancel_quietly(self._source)  # a Ray streaming response: the replica stops working on it
        finally:
            if cb is not None:
                r = cb()
                if asyncio.iscoroutine(r):
                    await r
