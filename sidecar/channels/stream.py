"""Reply mode ``stream``: the reply's message(s) sent early and edited in place as it grows.

Owns: turning the text seen so far into deliveries. Each step renders and splits the whole
text (as the final reply would be), compares every platform message with what the host has
acknowledged for it (read from the store, so a restart continues where it was), and stores
a ``send`` for a message not sent yet and an ``edit`` for one whose content changed. Steps
are coalesced: one runs only after the previous step's deliveries are acknowledged or
failed, at least ``editIntervalMs`` after the previous one, and only when the text changed;
what arrives meanwhile is folded into the next step. The final step also sends the images
and files and recalls (``delete``) streamed messages the final text no longer needs; its
last delivery is ``final``.

Must stay true: a step plans only from resolved deliveries (it first waits for any still in
flight), so a message is never sent twice; a failed ``send`` leaves its message unsent (the
next step sends it again), a failed ``edit`` leaves the old content (the next step edits
again); no step waits without a bound (a delivery resolves within its timeouts).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from protocol.channels import (
    ChannelConfig,
    ChannelReplyParams,
    ChatType,
    DeliveryKind,
    ReplyBlocksChunk,
    ReplyChunk,
    ReplyTextChunk,
)
from sidecar.channels.compose import text_chunks
from sidecar.store.async_store import AsyncStore
from sidecar.store.channels import OPEN_DELIVERY_STATES, ChannelRepo, DeliveryRow
from sidecar.store.ids import new_id

__all__ = ["StreamReply", "ReplyAddress", "acked_messages", "plan"]

T = TypeVar("T")

_TEXT_CHUNKS = (ReplyTextChunk, ReplyBlocksChunk)


@dataclass(slots=True)
class ReplyAddress:
    channel: str
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    session_id: str
    message_id: str | None
    inbox_id: str | None
    chat_type: ChatType | None = None


def acked_messages(rows: list[DeliveryRow]) -> dict[int, tuple[str, ReplyChunk]]:
    """target -> (the delivery that sent it, its acknowledged content), from a reply's deliveries."""
    state: dict[int, tuple[str, ReplyChunk]] = {}
    for row in sorted(rows, key=lambda r: r.seq):
        if row.state != "acked":
            continue
        if row.kind == "send" and row.payload.chunks:
            state[row.target] = (row.id, row.payload.chunks[0])
        elif row.kind == "edit" and row.target in state and row.payload.chunks:
            state[row.target] = (state[row.target][0], row.payload.chunks[0])
        elif row.kind == "delete":
            state.pop(row.target, None)
    return state


def plan(
    address: ReplyAddress,
    text: list[ReplyChunk],
    media: list[ReplyChunk],
    state: dict[int, tuple[str, ReplyChunk]],
    next_seq: int,
    *,
    final: bool,
) -> list[tuple[ChannelReplyParams, int]]:
    """The deliveries that bring the acknowledged messages to ``text`` (+ ``media`` when final)."""
    steps: list[tuple[DeliveryKind, int, str | None, list[ReplyChunk]]] = []
    for index, chunk in enumerate(text):
        known = state.get(index)
        if known is None:
            steps.append(("send", index, None, [chunk]))
        elif known[1] != chunk:
            steps.append(("edit", index, known[0], [chunk]))
    if final:
        streamed = [i for i, (_, chunk) in state.items() if isinstance(chunk, _TEXT_CHUNKS)]
        for index in sorted(streamed):
            if index >= len(text):
                steps.append(("delete", index, state[index][0], []))
        start = max([len(text), *(i + 1 for i in streamed)])
        for offset, chunk in enumerate(media):
            if start + offset not in state:
                steps.append(("send", start + offset, None, [chunk]))
        if not steps and text:
            last = len(text) - 1
            steps.append(("edit", last, state[last][0], [text[last]]))
    out: list[tuple[ChannelReplyParams, int]] = []
    for number, (kind, target, edit_of, chunks) in enumerate(steps):
        payload = ChannelReplyParams(
            delivery_id=new_id(),
            channel=address.channel,
            chat_id=address.chat_id,
            thread_id=address.thread_id,
            reply_to=address.reply_to,
            chat_type=address.chat_type,
            session_id=address.session_id,
            message_id=address.message_id,
            seq=next_seq + number,
            final=final and number == len(steps) - 1,
            kind=kind,
            edit_of=edit_of,
            chunks=chunks,
        )
        out.append((payload, target))
    return out


class StreamReply:
    """The live message(s) of one streaming reply (run ``run`` in a task while it streams)."""

    def __init__(
        self,
        address: ReplyAddress,
        config: ChannelConfig,
        store: AsyncStore,
        kick: Callable[[], None],
        wait_resolved: Callable[[list[str]], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self._config = config
        self._store = store
        self._kick = kick
        self._wait_resolved = wait_resolved
        self._clock = clock
        self._text = ""
        self._rendered = ""
        self._changed = anyio.Event()
        self._last_step = float("-inf")

    def update(self, text: str) -> None:
        self._text = text
        self._changed.set()

    async def _db(self, fn: Callable[[ChannelRepo], T]) -> T:
        return await self._store.run(lambda s: fn(s.channels))

    async def _rows(self) -> list[DeliveryRow]:
        message_id = self.address.message_id
        if message_id is None:
            return []
        return await self._db(lambda r: r.deliveries_of(message_id))

    async def run(self) -> None:
        """Steps until cancelled (the caller cancels it once the reply is final)."""
        interval = (self._config.rate.edit_interval_ms or 1000) / 1000.0
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            wait = self._last_step + interval - self._clock()
            if wait > 0:
                await anyio.sleep(wait)
            text = self._text
            if not text.strip() or text == self._rendered:
                continue
            self._rendered = text
            self._last_step = self._clock()
            ids = await self._step(text, [], final=False)
            await self._wait_resolved(ids)

    async def finish(self, text: str, media: list[ReplyChunk], *, empty_text: str) -> list[str]:
        """The final step (after ``run`` was cancelled); the inbox row is finished with it."""
        return await self._step(text if text.strip() else empty_text, media, final=True)

    async def _step(self, text: str, media: list[ReplyChunk], *, final: bool) -> list[str]:
        chunks, _ = await anyio.to_thread.run_sync(text_chunks, text, self._config)
        rows = await self._rows()
        open_ids = [r.id for r in rows if r.state in OPEN_DELIVERY_STATES]
        if open_ids:  # a step still in flight (cancelled mid-wait, or left by a restart)
            await self._wait_resolved(open_ids)
            rows = await self._rows()
        state = acked_messages(rows)
        next_seq = max((r.seq for r in rows), default=0) + 1
        payloads = plan(self.address, chunks, media, state, next_seq, final=final)
        finish = self.address.inbox_id if final else None
        if not payloads:
            if finish is not None:
                await self._db(lambda r: r.update_inbox(finish, state="done"))
            return []
        stored = await self._db(lambda r: r.add_deliveries(payloads, finish_inbox=finish))
        self._kick()
        return [row.id for row in stored]
