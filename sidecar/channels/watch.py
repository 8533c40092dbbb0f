"""ReplyWatcher: follow a reply through the App's EventHub until it is final.

Owns: running a turn the way ``chat:send`` does (``ChatEngine.send``) with a subscription to
the session's ``chat:stream`` events opened first (no event of the reply can be missed), and
waiting for the reply's end: a ``stream_end``, ``error`` or ``aborted`` event, after which
the stored message is read (the final row is written before the final event).

Must stay true:
- a paused reply (a tool call waiting for approval) is not an end: the watcher keeps
  waiting, through resumes, until the reply is final; after a restart ``wait`` picks a
  paused or finished reply up again from the store;
- a subscription cut off for falling behind, or a quiet period of CHECK_S, resyncs from the
  store (subscribe first, then read), so the end is never missed; a reply left
  pending/streaming with no job generating it (its job died) is returned as it is;
- ``on_text`` gets the reply's whole visible text so far (stream mode), never a duplicate
  delta: events up to the ``seq`` of the resynced content are skipped;
- ``on_pause`` is called when the reply asks for an approval (an event, or a resync that
  finds it paused); it may be called more than once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio

from protocol.chat import SendParams, SendResult
from protocol.events import AbortedEvent, ErrorEvent, StreamEndEvent, TextDeltaEvent, ToolApprovalRequiredEvent
from protocol.types import FINAL_MESSAGE_STATUSES, MessageV2
from sidecar.channels.compose import reply_text
from sidecar.engine.events import EventHub, Subscription
from sidecar.store.async_store import AsyncStore

__all__ = ["ReplyWatcher", "ChatTurns", "CHECK_S"]

log = logging.getLogger(__name__)

CHECK_S = 30.0
_FINAL_EVENTS = (StreamEndEvent, ErrorEvent, AbortedEvent)


class ChatTurns(Protocol):
    """What the watcher needs of ChatEngine (its public methods)."""

    async def send(self, params: SendParams) -> SendResult: ...

    def is_generating(self, session_id: str) -> bool: ...

    def overlay_live(self, message: MessageV2) -> MessageV2: ...


OnText = Callable[[str], None]
OnPause = Callable[[], None]


class ReplyWatcher:
    def __init__(self, events: EventHub, store: AsyncStore, chat: ChatTurns) -> None:
        self._events = events
        self._store = store
        self._chat = chat

    async def send_and_wait(
        self,
        params: SendParams,
        started: Callable[[SendResult], Awaitable[None]],
        on_text: OnText | None = None,
        on_pause: OnPause | None = None,
    ) -> MessageV2:
        """Send the turn, call ``started`` with its ids, return the final reply."""
        with self._events.subscribe(params.session_id) as sub:
            sent = await self._chat.send(params)
            await started(sent)
            final = await self._follow(sub, params.session_id, sent.message_id, on_text, on_pause, text="", seq=0)
        if final is not None:
            return final
        return await self.wait(params.session_id, sent.message_id, on_text, on_pause)

    async def wait(
        self, session_id: str, message_id: str, on_text: OnText | None = None, on_pause: OnPause | None = None
    ) -> MessageV2:
        """The final state of a reply that is already running, paused or finished."""
        while True:
            with self._events.subscribe(session_id) as sub:
                message = self._chat.overlay_live(await self._message(message_id))
                if message.status in FINAL_MESSAGE_STATUSES:
                    return message
                if message.status == "paused" and on_pause is not None:
                    on_pause()
                text = reply_text(message.text_content, message.parts)
                if on_text is not None and text:
                    on_text(text)
                final = await self._follow(
                    sub, session_id, message_id, on_text, on_pause, text=text, seq=message.seq or 0
                )
                if final is not None:
                    return final
            message = await self._message(message_id)
            if message.status in FINAL_MESSAGE_STATUSES:
                return message
            if message.status in ("pending", "streaming") and not self._chat.is_generating(session_id):
                log.warning("reply %s is %s with no job generating it", message_id, message.status)
                return message

    async def _follow(
        self,
        sub: Subscription,
        session_id: str,
        message_id: str,
        on_text: OnText | None,
        on_pause: OnPause | None,
        *,
        text: str,
        seq: int,
    ) -> MessageV2 | None:
        """Events of the reply until its final one (then the stored message), or None when
        the subscription ended or stayed quiet for CHECK_S (the caller resyncs)."""
        while True:
            with anyio.move_on_after(CHECK_S) as quiet:
                try:
                    event = await sub.receive()
                except anyio.EndOfStream:
                    return None
            if quiet.cancelled_caught:
                return None
            if event.message_id != message_id or event.seq <= seq:
                continue
            seq = event.seq
            if isinstance(event, TextDeltaEvent):
                text += event.text
                if on_text is not None:
                    on_text(text)
            elif isinstance(event, ToolApprovalRequiredEvent):
                if on_pause is not None:
                    on_pause()
            elif isinstance(event, _FINAL_EVENTS):
                break
        message = await self._message(message_id)
        return message if message.status in FINAL_MESSAGE_STATUSES else None

    async def _message(self, message_id: str) -> MessageV2:
        return await self._store.run(lambda s: s.messages.get(message_id))
