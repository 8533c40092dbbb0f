"""ChannelService: the ``channel:*`` methods and the life of an IM message.

The flow (seed 004 §4.1: PreProcessor 6 adapts the message, PostProcessor 5 replies):

1. ``channel:message``: the channel must exist and be enabled; sizes are checked; the
   message is adapted (inbound/); what to do is decided: ``ignored`` (the bot's own message,
   or nothing in it), ``new_session`` (``/new`` addressed to the bot), ``store`` (a group
   message that does not mention the bot, when the group trigger is ``mention``),
   ``throttled`` (the chat cools down: loop guard), else ``reply``. The session is found or
   created by the scope rule (routing.py); the message is stored in the inbox under its
   chat and dedup key (the platform message id, else a hash of chat, sender, timestamp and
   content: the same id in another chat is another message),
   which answers a redelivery with ``duplicate`` and does nothing else, also after a
   restart. Attachments are written to the data dir before the answer.
2. Each session has one worker that runs its inbox rows in arrival order: ``store`` and
   ``throttled`` append the user message; ``new_session`` sends a confirmation; ``reply``
   runs the turn through ``ChatEngine.send`` (as ``chat:send`` does) and follows it on the
   EventHub (watch.py) until it is final. A reply paused for a tool approval holds the
   session's queue: nothing is delivered until it is approved or denied and finishes (or is
   aborted); a restart resumes the wait. In reply mode ``stream`` (platforms that can edit)
   the text is delivered while it streams (stream.py).
3. The final reply (an error or an interruption adds a short notice to what was written) is
   rendered and split (compose.py) into deliveries stored together with the inbox row's
   end, then sent in order per chat by the Outbox (delivery.py), acknowledged by
   ``channel:ack``, retried, or failed; their state is the message's ``delivery`` field.

Must stay true: a conversation is never lost (a message that cannot be answered is still
stored in its session, and the chat gets a notice); bad input is an error naming the field
and changes nothing; the host never gets two replies for one platform message.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
import msgspec

from protocol.channels import (
    ChannelAckParams,
    ChannelConfig,
    ChannelConfigUpsertParams,
    ChannelMessageParams,
    ChannelMessageResult,
    ChannelReplyParams,
    MessageAction,
    ReplyChunk,
)
from protocol.chat import InputPart, SendParams, SendResult, UserInput
from protocol.common import EmptyParams, IdParams, SuccessResult
from protocol.types import ContentPart, FilePart, ImagePart, MessageV2, TextPart
from sidecar.channels.compose import EMPTY_REPLY, compose, media_chunks, reply_text, text_chunks
from sidecar.channels.delivery import Outbox
from sidecar.channels.inbound import Adapted, adapt
from sidecar.channels.platforms import resolve_config
from sidecar.channels.ratelimit import LoopGuard
from sidecar.channels.routing import SessionRouter
from sidecar.channels.stream import ReplyAddress, StreamReply
from sidecar.channels.watch import ChatTurns, ReplyWatcher
from sidecar.channels.workers import KeyedWorkers
from sidecar.engine.events import EventHub
from sidecar.errors import EngineError, InvalidParams, NotFound, SidecarError
from sidecar.store.async_store import AsyncStore
from sidecar.store.attachments import AttachmentStore
from sidecar.store.channels import ChannelRepo, InboxRow
from sidecar.store.ids import new_id

__all__ = ["ChannelService", "QueuedTurn", "NEW_SESSION_TEXT", "MAX_RAW_BYTES", "MAX_RAW_DEPTH"]

log = logging.getLogger(__name__)

T = TypeVar("T")

NEW_SESSION_COMMAND = "/new"
NEW_SESSION_TEXT = "New conversation started."
MAX_RAW_BYTES = 256 * 1024
MAX_RAW_DEPTH = 32
MAX_ID_CHARS = 512
MAX_NAME_CHARS = 512
MAX_MENTIONS = 256
MAX_ATTACHMENTS = 16
NOTICE_CHARS = 300
PRUNE_EVERY_S = 600.0

_enc = msgspec.json.Encoder()


class QueuedTurn(msgspec.Struct, kw_only=True):
    """The stored user turn of an inbox row (attachments already written to the data dir)."""

    content_type: str
    text_content: str
    parts: list[ContentPart] | None = None

    def as_input(self) -> UserInput:
        inputs: list[InputPart] = [p for p in self.parts or () if isinstance(p, (TextPart, ImagePart, FilePart))]
        return UserInput(content=inputs if inputs else self.text_content)


_dec_turn = msgspec.json.Decoder(QueuedTurn)


class ChannelService:
    """The methods the server binds as ``channels.<name>``."""

    def __init__(
        self,
        *,
        store: AsyncStore,
        chat: ChatTurns,
        events: EventHub,
        notify: Callable[[str, Any], Awaitable[None]],
        attachments: AttachmentStore,
        task_group: anyio.abc.TaskGroup,
    ) -> None:
        self._store = store
        self._now = store.sync.channels.now
        """The store's clock (no database call)."""
        self._attachments = attachments
        self._configs: dict[str, ChannelConfig] = {}
        self._router = SessionRouter(store)
        self._watcher = ReplyWatcher(events, store, chat)
        self._guard = LoopGuard()
        self._outbox = Outbox(store, notify, task_group, self._configs.get)
        self._sessions: KeyedWorkers[str] = KeyedWorkers(task_group, self._drain_session, "channel turn")
        self._tg = task_group
        self._pruned: dict[str, float] = {}

    async def _db(self, fn: Callable[[ChannelRepo], T]) -> T:
        return await self._store.run(lambda s: fn(s.channels))

    async def load(self) -> None:
        """Read the configs and resume what a previous run left open (turns, deliveries)."""
        for config in await self._db(lambda r: r.list_configs()):
            self._configs[config.id] = config
        for session_id in await self._db(lambda r: r.open_sessions()):
            self._sessions.kick(session_id)
        for channel_id, chat_id in await self._db(lambda r: r.open_chats()):
            self._outbox.kick(channel_id, chat_id)
        for config in self._configs.values():
            await self._prune(config, force=True)

    # ---- channel:config:* -----------------------------------------------------------

    async def list_configs(self, params: EmptyParams) -> list[ChannelConfig]:
        return list(await self._db(lambda r: r.list_configs()))

    async def get_config(self, params: IdParams) -> ChannelConfig:
        config = self._configs.get(params.id)
        if config is None:
            raise NotFound(f"no channel {params.id!r}")
        return config

    async def upsert_config(self, params: ChannelConfigUpsertParams) -> ChannelConfig:
        config = resolve_config(params, self._now())
        stored: ChannelConfig = await self._db(lambda r: r.upsert_config(config))
        self._configs[stored.id] = stored
        return stored

    async def delete_config(self, params: IdParams) -> SuccessResult:
        deleted = await self._db(lambda r: r.delete_config(params.id))
        if not deleted:
            raise NotFound(f"no channel {params.id!r}")
        self._configs.pop(params.id, None)
        self._outbox.forget(params.id)
        return SuccessResult(success=True)

    # ---- channel:message ------------------------------------------------------------

    async def message(self, params: ChannelMessageParams) -> ChannelMessageResult:
        config = self._configs.get(params.channel)
        if config is None:
            raise NotFound(f"unknown channel {params.channel!r} (configure it with channel:config:upsert)")
        if not config.enabled:
            raise EngineError(f"channel {params.channel!r} is disabled")
        _check_sizes(params, config)
        quoted = None
        quote = params.reply_to
        quoted_id = quote.message_id if quote is not None and not quote.text else None
        if quoted_id:
            quoted = await self._db(lambda r: r.known_text(config.id, params.chat_id, quoted_id))
        adapted = adapt(params, config, quoted)
        key = _dedup_key(params)
        chat = (config.id, params.chat_id)
        action = self._action(params, config, adapted, chat)
        await self._prune(config)

        window = config.limits.dedup_window_ms
        assert window is not None  # resolved with the config
        now = self._now()
        session_id: str | None = None
        queued: QueuedTurn | None = None
        if action != "ignored":
            existing = await self._db(lambda r: r.find_received(config.id, params.chat_id, key, window))
            if existing is not None:
                return ChannelMessageResult(action="duplicate", inbox_id=existing.id, session_id=existing.session_id)
            session_id = await self._router.route(config, params, fresh=action == "new_session")
            if action != "new_session":
                stored = await anyio.to_thread.run_sync(self._attachments.store_input, adapted.turn)
                queued = QueuedTurn(
                    content_type=stored.content_type, text_content=stored.text_content, parts=stored.parts
                )
        # from here to the worker's kick nothing may be cut off by a cancelled request: a
        # stored row without a worker would wait for the next start
        with anyio.CancelScope(shield=True):
            result = await self._accept(config, params, action, key, now, session_id, queued, chat)
        return result

    async def _accept(
        self,
        config: ChannelConfig,
        params: ChannelMessageParams,
        action: MessageAction,
        key: str,
        now: int,
        session_id: str | None,
        queued: QueuedTurn | None,
        chat: tuple[str, str],
    ) -> ChannelMessageResult:
        window = config.limits.dedup_window_ms
        assert window is not None  # resolved with the config
        row = InboxRow(
            id=new_id(), channel_id=config.id, dedup_key=key, chat_id=params.chat_id,
            thread_id=params.thread_id, platform_message_id=params.message_id, session_id=session_id,
            action=action, state="done" if action == "ignored" else "queued",
            input=_enc.encode(queued).decode() if queued is not None else None,
            received_at=now, updated_at=now,
        )
        row, fresh = await self._db(lambda r: r.receive(row, window))
        if not fresh:
            return ChannelMessageResult(action="duplicate", inbox_id=row.id, session_id=row.session_id)
        if action == "reply":
            rate = config.rate
            assert rate.loop_max_events is not None and rate.loop_window_ms is not None
            assert rate.loop_cooldown_ms is not None
            if self._guard.record(chat, rate.loop_max_events, rate.loop_window_ms, rate.loop_cooldown_ms):
                log.warning("channel %s chat %s: more than %d replies in %d ms; cooling down",
                            config.id, params.chat_id, rate.loop_max_events, rate.loop_window_ms)
                action = "throttled"
                await self._db(lambda r: r.update_inbox(row.id, action="throttled"))
        if session_id is not None:
            self._sessions.kick(session_id)
        return ChannelMessageResult(action=action, inbox_id=row.id, session_id=session_id)

    def _action(
        self, params: ChannelMessageParams, config: ChannelConfig, adapted: Adapted, chat: tuple[str, str]
    ) -> MessageAction:
        if params.sender.id in config.bot_user_ids or adapted.empty:
            return "ignored"
        addressed = params.chat_type == "private" or config.group_trigger == "always" or adapted.mentions_bot
        if not addressed:
            return "store"
        if adapted.body.strip().lower() == NEW_SESSION_COMMAND:
            return "new_session"
        if self._guard.cooling(chat):
            return "throttled"
        return "reply"

    async def _prune(self, config: ChannelConfig, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._pruned.get(config.id, float("-inf")) < PRUNE_EVERY_S:
            return
        self._pruned[config.id] = now
        window = config.limits.dedup_window_ms
        assert window is not None
        gone = await self._db(lambda r: r.prune_inbox(config.id, window))
        if gone:
            log.info("channel %s: forgot %d messages older than the dedup window", config.id, gone)

    # ---- channel:ack ----------------------------------------------------------------

    async def ack(self, params: ChannelAckParams) -> SuccessResult:
        await self._outbox.ack(params)
        return SuccessResult(success=True)

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
        config = self._configs.get(row.channel_id)
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
            await self._deliver(config, _address(row, None), chunks)
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
                        row.id, state="running", user_message_id=sent.user_message_id, reply_message_id=sent.message_id,
                    )
                )
                await self._db(lambda r: r.mark_pending(sent.message_id, config.id, row.chat_id))
                begin(sent.message_id)

            if row.reply_message_id is not None:
                begin(row.reply_message_id)
                final = await self._watcher.wait(session_id, row.reply_message_id, on_text)
            else:
                try:
                    final = await self._watcher.send_and_wait(
                        SendParams(session_id=session_id, input=turn.as_input()), started, on_text
                    )
                except SidecarError as exc:
                    if address.message_id is not None:
                        raise
                    await self._send_failed(row, config, turn, exc)  # the engine refused the turn
                    return
            tg.cancel_scope.cancel()
        text = _final_text(final)
        if live is not None:
            def finished_media() -> list[ReplyChunk]:
                _, rendered = text_chunks(text, config)
                return media_chunks(rendered, final.parts, self._attachments)

            media = await anyio.to_thread.run_sync(finished_media)
            await live.finish(text, media, empty_text=EMPTY_REPLY)
            return
        chunks = await anyio.to_thread.run_sync(compose, text, final.parts, config, self._attachments)
        await self._deliver(config, address, chunks)

    async def deliver_reply(
        self, channel_id: str, chat_id: str, message: MessageV2, *, thread_id: str | None = None
    ) -> None:
        """Hand a finished reply that no IM message asked for (a scheduled task's) to a chat:
        rendered, split and sent by the Outbox like any reply, with the same notice for one
        that did not complete. NOT_FOUND / an engine error for a missing or disabled channel."""
        config = self._configs.get(channel_id)
        if config is None:
            raise NotFound(f"unknown channel {channel_id!r}")
        if not config.enabled:
            raise EngineError(f"channel {channel_id!r} is disabled")
        text = _final_text(message)
        chunks = await anyio.to_thread.run_sync(compose, text, message.parts, config, self._attachments)
        address = ReplyAddress(
            channel=channel_id, chat_id=chat_id, thread_id=thread_id, reply_to=None, session_id=message.session_id,
            message_id=message.id, inbox_id=None,
        )
        await self._deliver(config, address, chunks)

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
        await self._deliver(config, _address(row, None), chunks, state="failed")

    async def _deliver(
        self, config: ChannelConfig, address: ReplyAddress, chunks: list[ReplyChunk], *, state: str = "done"
    ) -> None:
        """Store a finished reply's deliveries (batches of at most ``burst`` chunks) and end
        its inbox row in the same transaction; then wake the chat's outbox."""
        burst = config.rate.burst or 1
        batches = [chunks[i : i + burst] for i in range(0, len(chunks), burst)]
        payloads = [
            (
                ChannelReplyParams(
                    delivery_id=new_id(), channel=address.channel, chat_id=address.chat_id,
                    thread_id=address.thread_id, reply_to=address.reply_to, session_id=address.session_id,
                    message_id=address.message_id, seq=number, final=number == len(batches), kind="send",
                    chunks=batch,
                ),
                (number - 1) * burst,
            )
            for number, batch in enumerate(batches, 1)
        ]
        await self._db(lambda r: r.add_deliveries(payloads, finish_inbox=address.inbox_id))
        inbox_id = address.inbox_id
        if state != "done" and inbox_id is not None:
            await self._db(lambda r: r.update_inbox(inbox_id, state=state))
        self._outbox.kick(address.channel, address.chat_id)


def _address(row: InboxRow, message_id: str | None) -> ReplyAddress:
    assert row.session_id is not None
    return ReplyAddress(
        channel=row.channel_id, chat_id=row.chat_id, thread_id=row.thread_id, reply_to=row.platform_message_id,
        session_id=row.session_id, message_id=message_id, inbox_id=row.id,
    )


def _final_text(message: MessageV2) -> str:
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


def _dedup_key(params: ChannelMessageParams) -> str:
    """The platform message id; without one, a hash of chat, sender, timestamp, type, text
    and attachments (what a redelivery repeats)."""
    if params.message_id:
        return "id:" + params.message_id
    digest = hashlib.sha256()
    for value in (params.chat_id, params.sender.id, str(params.timestamp), params.msg_type, params.text):
        digest.update(value.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    for att in params.attachments:
        digest.update((att.url or "").encode())
        digest.update(hashlib.sha256((att.data or "").encode()).digest())
    # not ``raw``: a redelivered event's envelope (event id, delivery time) differs
    return "hash:" + digest.hexdigest()


def _check_sizes(params: ChannelMessageParams, config: ChannelConfig) -> None:
    limit = config.limits.max_inbound_chars or 0
    if len(params.text) > limit:
        raise InvalidParams(
            f"invalid params: text is {len(params.text)} characters, more than the channel's limit"
            f" of {limit} - at `$.text`"
        )
    for field, value in (
        ("chatId", params.chat_id), ("sender.id", params.sender.id), ("messageId", params.message_id),
        ("threadId", params.thread_id),
    ):
        if value is not None and not 0 < len(value) <= MAX_ID_CHARS:
            raise InvalidParams(f"invalid params: {field} must be 1..{MAX_ID_CHARS} characters - at `$.{field}`")
    for field, value in (("chatName", params.chat_name), ("sender.name", params.sender.name)):
        if value is not None and len(value) > MAX_NAME_CHARS:
            raise InvalidParams(f"invalid params: {field} is longer than {MAX_NAME_CHARS} - at `$.{field}`")
    if len(params.mentions) > MAX_MENTIONS:
        raise InvalidParams(f"invalid params: more than {MAX_MENTIONS} mentions - at `$.mentions`")
    for index, mention in enumerate(params.mentions):
        if not 0 < len(mention.id) <= MAX_ID_CHARS or len(mention.name or "") > MAX_NAME_CHARS or len(
            mention.key or ""
        ) > MAX_ID_CHARS:
            raise InvalidParams(f"invalid params: a mention needs an id of 1..{MAX_ID_CHARS} characters - at `$.mentions[{index}]`")
    if len(params.attachments) > MAX_ATTACHMENTS:
        raise InvalidParams(f"invalid params: more than {MAX_ATTACHMENTS} attachments - at `$.attachments`")
    if params.reply_to is not None and len(params.reply_to.text or "") > limit:
        raise InvalidParams(f"invalid params: replyTo.text is longer than {limit} characters - at `$.replyTo.text`")
    if params.raw is not None:
        if len(_enc.encode(params.raw)) > MAX_RAW_BYTES:
            raise InvalidParams(f"invalid params: raw is larger than {MAX_RAW_BYTES} bytes - at `$.raw`")
        if _depth(params.raw) > MAX_RAW_DEPTH:
            raise InvalidParams(f"invalid params: raw is nested deeper than {MAX_RAW_DEPTH} levels - at `$.raw`")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_RAW_DEPTH:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest
