"""TurnRunner: the turns of the channels' sessions, from a stored inbox row to its deliveries.

Owns step 2 and 3 of the flow (service.py has step 1):

2. Each session has one worker that runs its inbox rows in arrival order: ``store`` and
   ``throttled`` (and a stranger's with ``strangers: "store"``) append the user message;
   ``new_session`` sends a confirmation; ``reply`` runs the turn through
   ``ChatEngine.send`` (as ``chat:send`` does) and follows it on the EventHub (watch.py)
   until it is final. A reply paused for a tool approval holds the session's queue:
   nothing is delivered until it is approved or denied and finishes (or is aborted); a
   restart resumes the wait. In reply mode ``stream`` (platforms that can edit) the text is
   delivered while it streams (stream.py).
   At most ``maxConcurrent`` replies of a channel run at once: a reply takes one of the
   channel's slots before its turn is sent and gives it back when the reply is final or
   paused for an approval; replies beyond wait for a slot in arrival order. The wait is a
   queued inbox row, so a restart keeps the queue (the workers start again oldest first).
3. The final reply (an error or an interruption adds a short notice to what was written) is
   rendered and split (compose.py) into deliveries stored together with the inbox row's
   end, then sent in order per chat by the Outbox (delivery.py).

Must stay true: a conversation is never lost (a message that cannot be answered is still
stored in its session, and the chat gets a notice); a row ends exactly once (done or
failed), in the transaction that stores its deliveries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.abc
import msgspec

from protocol.channels import ChannelConfig, ChannelReplyParams, ReplyChunk
from protocol.chat import InputPart, SendParams, SendResult, UserInput
from protocol.types import ContentPart, FilePart, ImagePart, MessageV2, TextPart
from sidecar.channels.compose import EMPTY_REPLY, compose, media_chunks, reply_text, text_chunks
from sidecar.channels.delivery import Outbox
from sidecar.channels.stream import ReplyAddress, StreamReply
from sidecar.channels.watch import ReplyWatcher
from sidecar.channels.workers import KeyedWorkers
from sidecar.errors import SidecarError
from sidecar.store.async_store import AsyncStore
from sidecar.store.attachments import AttachmentStore
from sidecar.store.channels import ChannelRepo, InboxRow
from sidecar.store.ids import new_id

__all__ = ["TurnRunner", "QueuedTurn", "NEW_SESSION_TEXT", "NOTICE_CHARS", "final_text"]

log = logging.getLogger(__name__)

T = TypeVar("T")

NEW_SESSION_TEXT = "New conversation started."
NOTICE_CHARS = 300


class QueuedTurn(msgspec.Struct, kw_only=True):
    """The stored user turn of an inbox row (attachments already written to the data dir)."""

    content_type: str
    text_content: str
    parts: list[ContentPart] | None = None

    def as_input(self) -> UserInput:
        inputs: list[InputPart] = [p for p in self.parts or () if isinstance(p, (TextPart, ImagePart, FilePart))]
        return UserInput(content=inputs if inputs else self.text_content)


_dec_turn = msgspec.json.Decoder(QueuedTurn)


class _Slot:
    """One reply's hold on its channel's limiter, given back once (final or paused)."""

    def __init__(self, limiter: anyio.CapacityLimiter) -> None:
        self._limiter = limiter
        self._held = False

    async def take(self) -> None:
        await self._limiter.acquire_on_behalf_of(self)
        self._held = True

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._limiter.release_on_behalf_of(self)


class TurnRunner:
    def __init__(
        self,
        *,
        store: AsyncStore,
        watcher: ReplyWatcher,
        outbox: Outbox,
        attachments: AttachmentStore,
        config_of: Callable[[str], ChannelConfig | None],
        task_group: anyio.abc.TaskGroup,
    ) -> None:
        self._store = store
        self._watcher = watcher
        self._outbox = outbox
        self._attachments = attachments
        self._config_of = config_of
        self._sessions: KeyedWorkers[str] = KeyedWorkers(task_group, self._drain_session, "channel turn")
        self._limiters: dict[str, anyio.CapacityLimiter] = {}

    async def _db(self, fn: Callable[[ChannelRepo], T]) -> T:
        return await self._store.run(lambda s: fn(s.channels))

    def kick(self, session_id: str) -> None:
        self._sessions.kick(session_id)

    def limiter(self, config: ChannelConfig) -> anyio.CapacityLimiter:
        limiter = self._limiters.get(config.id)
        if limiter is None:
            limiter = self._limiters[config.id] = anyio.CapacityLimiter(config.max_concurrent)
        elif limiter.total_tokens != config.max_concurrent:
            limiter.total_tokens = config.max_concurrent  # waiters get the new slots at once
        return limiter

    def forget(self, channel_id: str) -> None:
        self._limiters.pop(channel_id, None)

    # ---- the turns of a session -------------------------------------------------------

    async def _drain_session(self, session_id: str) -> None:
        while True:
            row = await self._db(lambda r: r.next_open(session_id))
            if row is None:
                return
            try:
                await self._process(row)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:
                log.exception("channel message %s could not be processed", row.id)
                message = exc.message if isinstance(exc, SidecarError) else "internal error"
                await self._db(lambda r: r.update_inbox(row.id, state="failed", error=message[:2000]))

    async def _process(self, row: InboxRow) -> None:
        config = self._config_of(row.channel_id)
        assert row.session_id is not None
        if config is None:
            await self._db(lambda r: r.update_inbox(row.id, state="failed", error="the channel was deleted"))
            return
        turn = _dec_turn.decode(row.input) if row.input else None
        if row.action in ("store", "throttled") and turn is not None:
            user = await self._append_user(row.session_id, turn)
            await self._db(lambda r: r.update_inbox(row.id, state="done", user_message_id=user.id))
        elif row.action == "new_session":
            chunks, _ = await anyio.to_thread.run_sync(text_chunks, NEW_SESSION_TEXT, config)
            await self.deliver(config, _address(row, None), chunks)
        elif row.action == "reply" and turn is not None:
            await self._reply(row, config, turn)
        else:
            await self._db(lambda r: r.update_inbox(row.id, state="failed", error="nothing to do"))

    async def _append_user(self, session_id: str, turn: QueuedTurn) -> MessageV2:
        return await self._store.run(
            lambda s: s.messages.append(
                session_id, role="user", content_type=turn.content_type, text_content=turn.text_content,
                parts=turn.parts,
            )
        )

    async def _reply(self, row: InboxRow, config: ChannelConfig, turn: QueuedTurn) -> None:
        assert row.session_id is not None
        session_id = row.session_id
        address = _address(row, row.reply_message_id)
        live: StreamReply | None = None
        slot = _Slot(self.limiter(config))
        try:
            async with anyio.create_task_group() as tg:

                def begin(message_id: str) -> None:
                    nonlocal live
                    address.message_id = message_id
                    if config.reply_mode == "stream":
                        live = StreamReply(
                            address, config, self._store, lambda: self._outbox.kick(config.id, row.chat_id),
                            self._outbox.wait_resolved,
                        )
                        tg.start_soon(live.run)

                def on_text(text: str) -> None:
                    if live is not None:
                        live.update(text)

                async def started(sent: SendResult) -> None:
                    await self._db(
                        lambda r: r.update_inbox(
                            row.id, state="running", user_message_id=sent.user_message_id,
                            reply_message_id=sent.message_id,
                        )
                    )
                    await self._db(lambda r: r.mark_pending(sent.message_id, config.id, row.chat_id))
                    begin(sent.message_id)

                if row.reply_message_id is not None:
                    # a restart: the reply is paused or over (crash recovery ended the rest)
                    begin(row.reply_message_id)
                    final = await self._watcher.wait(session_id, row.reply_message_id, on_text)
                else:
                    await slot.take()
                    try:
                        final = await self._watcher.send_and_wait(
                            SendParams(session_id=session_id, input=turn.as_input()), started, on_text,
                            on_pause=slot.give_back,
                        )
                    except SidecarError as exc:
                        if address.message_id is not None:
                            raise
                        slot.give_back()
                        await self._send_failed(row, config, turn, exc)  # the engine refused the turn
                        return
                slot.give_back()
                tg.cancel_scope.cancel()
        finally:
            slot.give_back()
        text = final_text(final)
        if live is not None:
            def finished_media() -> list[ReplyChunk]:
                _, rendered = text_chunks(text, config)
                return media_chunks(rendered, final.parts, self._attachments)

            media = await anyio.to_thread.run_sync(finished_media)
            await live.finish(text, media, empty_text=EMPTY_REPLY)
            return
        chunks = await anyio.to_thread.run_sync(compose, text, final.parts, config, self._attachments)
        await self.deliver(config, address, chunks)

    async def deliver_reply(self, config: ChannelConfig, address: ReplyAddress, message: MessageV2) -> None:
        """A finished reply that no IM message asked for (a scheduled task's), rendered and
        delivered like any reply (with the notice of one that did not complete)."""
        text = final_text(message)
        chunks = await anyio.to_thread.run_sync(compose, text, message.parts, config, self._attachments)
        await self.deliver(config, address, chunks)

    async def _send_failed(self, row: InboxRow, config: ChannelConfig, turn: QueuedTurn, exc: SidecarError) -> None:
        """The engine did not take the turn: the message is stored anyway, the chat told."""
        assert row.session_id is not None
        log.warning("channel message %s not answered: %s", row.id, exc.message)
        try:
            user = await self._append_user(row.session_id, turn)
            user_id: str | None = user.id
        except SidecarError:
            user_id = None
        await self._db(lambda r: r.update_inbox(row.id, error=exc.message[:2000], user_message_id=user_id))
        chunks, _ = await anyio.to_thread.run_sync(
            text_chunks, f"(Could not answer: {exc.message[:NOTICE_CHARS]})", config
        )
        await self.deliver(config, _address(row, None), chunks, state="failed")

    async def deliver(
        self, config: ChannelConfig, address: ReplyAddress, chunks: list[ReplyChunk], *, state: str = "done"
    ) -> None:
        """Store a finished reply's deliveries (batches of at most ``burst`` chunks, and of
        ``chatBurst``) and end its inbox row (``state``) in the same transaction; then wake
        the chat's outbox."""
        rate = config.rate
        burst = min(rate.burst or 1, rate.chat_burst or rate.burst or 1)
        batches = [chunks[i : i + burst] for i in range(0, len(chunks), burst)]
        payloads = [
            (
                ChannelReplyParams(
                    delivery_id=new_id(), channel=address.channel, chat_id=address.chat_id,
                    thread_id=address.thread_id, reply_to=address.reply_to, chat_type=address.chat_type,
                    session_id=address.session_id, message_id=address.message_id, seq=number,
                    final=number == len(batches), kind="send", chunks=batch,
                ),
                (number - 1) * burst,
            )
            for number, batch in enumerate(batches, 1)
        ]
        await self._db(lambda r: r.add_deliveries(payloads, finish_inbox=address.inbox_id, finish_state=state))
        self._outbox.kick(address.channel, address.chat_id)


def _address(row: InboxRow, message_id: str | None) -> ReplyAddress:
    assert row.session_id is not None
    return ReplyAddress(
        channel=row.channel_id, chat_id=row.chat_id, thread_id=row.thread_id, reply_to=row.platform_message_id,
        session_id=row.session_id, message_id=message_id, inbox_id=row.id,
        chat_type="group" if row.chat_type == "group" else "private" if row.chat_type == "private" else None,
    )


def final_text(message: MessageV2) -> str:
    """A final reply's text for the chat, with the notice of one that did not complete."""
    text = reply_text(message.text_content, message.parts)
    notice = _notice(message)
    if notice:
        text = f"{text}\n\n_{notice}_" if text.strip() else notice
    return text


def _notice(message: MessageV2) -> str | None:
    """What the chat is told about a reply that did not complete (added after its text)."""
    if message.status == "completed":
        return None
    if message.status == "error":
        reason = (message.error or "unknown error").strip().replace("\n", " ")[:NOTICE_CHARS]
        return f"(The reply failed: {reason})"
    return "(The reply was interrupted.)"
