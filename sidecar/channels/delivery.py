"""Outbox: ``channel:reply`` deliveries sent to the host, acknowledged, retried, or failed.

Owns: one worker per (channel, chat) that sends the chat's stored deliveries in order, each
after taking its chunks' worth of tokens from the channel's TokenBucket and from the chat's
own (``chatMessagesPerMinute`` / ``groupMessagesPerMinute`` by the chat's type, when set),
then waits for ``channel:ack``. A delivery not acknowledged within ``ackTimeoutMs`` (or refused with
``ok: false``) is sent again with the same delivery id after ``retryBackoffMs`` (doubled per
attempt, at most 5 min), up to ``maxAttempts`` sends; then it is marked failed (a refusal
with ``retryable: false`` fails it at once) and the chat's next delivery goes.

A channel with a connection of its own (``connection.kind`` not ``host``) sends through its
platform sender instead (connections/): the send's outcome stands for the acknowledgement
(the platform's message id, or a DeliveryError: ``retryable`` or not), an edit or a delete
addresses the platform message its ``editOf`` delivery sent; ``channel:ack`` is refused for
such a channel.

Must stay true: every state change is stored before the next step (a restart resends what
was not acknowledged, counting the attempts already made); an acknowledgement that comes
late (during the backoff, after the failure, after a restart) still marks the delivery
delivered and is never resent after that; ``channel:ack`` is answered once what it changed
is stored (a read after the answer sees it); nothing here waits on the host without a bound.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import anyio
import anyio.abc
import msgspec

from protocol.channels import ChannelAckParams, ChannelConfig, ChannelReplyParams
from protocol.notifications import CHANNEL_REPLY
from sidecar.channels.ratelimit import TokenBucket
from sidecar.channels.workers import KeyedWorkers
from sidecar.errors import EngineError, NotFound, SidecarError
from sidecar.store.async_store import AsyncStore
from sidecar.store.channels import ChannelRepo, DeliveryRow
from sidecar.notify import Notifier

__all__ = ["Outbox", "MAX_BACKOFF_S", "DeliveryError", "PlatformSender", "SenderOf"]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BACKOFF_S = 300.0
MAX_CHAT_BUCKETS = 10_000
ACK_STORE_WAIT_S = 5.0
"""How long ``channel:ack`` waits for the worker to store the acknowledgement it hands over."""


class DeliveryError(Exception):
    """A platform message that could not be sent (``retryable``: the outbox tries again)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message[:2000])
        self.message = message[:2000]
        self.retryable = retryable


class PlatformSender(Protocol):
    async def deliver(self, payload: ChannelReplyParams, target: str | None) -> str | None:
        """Send the delivery's chunks (``kind`` send), or edit / delete the platform message
        ``target``; the platform's id of the (first) message sent. DeliveryError on failure."""
        ...


SenderOf = Callable[[ChannelConfig], Awaitable["PlatformSender | None"]]


class _Waiter:
    __slots__ = ("event", "ack", "stored", "platform")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.ack: ChannelAckParams | None = None
        self.platform = False
        """The outcome came from the channel's own connection, not from the host."""
        self.stored = anyio.Event()
        """Set by the worker once the outcome of this send is stored."""


class Outbox:
    def __init__(
        self,
        store: AsyncStore,
        notify: Notifier,
        task_group: anyio.abc.TaskGroup,
        config_of: Callable[[str], ChannelConfig | None],
        sender_of: SenderOf | None = None,
    ) -> None:
        self._store = store
        self._notify = notify
        self._config_of = config_of
        self._sender_of = sender_of
        self._workers: KeyedWorkers[tuple[str, str]] = KeyedWorkers(task_group, self._drain, "delivery")
        self._waiting: dict[str, _Waiter] = {}
        self._resolved: dict[str, anyio.Event] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._chat_buckets: dict[tuple[str, str], TokenBucket] = {}

    async def _db(self, fn: Callable[[ChannelRepo], T]) -> T:
        return await self._store.run(lambda s: fn(s.channels))

    def kick(self, channel_id: str, chat_id: str) -> None:
        self._workers.kick((channel_id, chat_id))

    def bucket(self, config: ChannelConfig) -> TokenBucket:
        rate = config.rate
        assert rate.messages_per_minute is not None and rate.burst is not None
        bucket = self._buckets.get(config.id)
        if bucket is None:
            bucket = self._buckets[config.id] = TokenBucket(rate.messages_per_minute, rate.burst)
        elif (bucket.per_minute, bucket.burst) != (rate.messages_per_minute, rate.burst):
            bucket.configure(rate.messages_per_minute, rate.burst)
        return bucket

    def chat_bucket(self, config: ChannelConfig, chat_id: str, chat_type: str | None) -> TokenBucket | None:
        rate = config.rate
        per_minute = rate.group_messages_per_minute if chat_type == "group" else rate.chat_messages_per_minute
        if not per_minute:
            return None
        burst = rate.chat_burst or 1
        key = (config.id, chat_id)
        bucket = self._chat_buckets.get(key)
        if bucket is None:
            if len(self._chat_buckets) >= MAX_CHAT_BUCKETS:  # forget chats whose bucket is full again
                for idle in [k for k, b in self._chat_buckets.items() if b.wait_time(b.burst) == 0]:
                    del self._chat_buckets[idle]
            bucket = self._chat_buckets[key] = TokenBucket(per_minute, burst)
        elif (bucket.per_minute, bucket.burst) != (per_minute, burst):
            bucket.configure(per_minute, burst)
        return bucket

    def forget(self, channel_id: str) -> None:
        self._buckets.pop(channel_id, None)
        for key in [k for k in self._chat_buckets if k[0] == channel_id]:
            del self._chat_buckets[key]

    async def wait_resolved(self, delivery_ids: list[str]) -> None:
        """Until each of these deliveries is acknowledged or failed (stream mode paces its
        edits on this; each wait is bounded by the delivery's own timeouts)."""
        for delivery_id in delivery_ids:
            event = self._resolved.setdefault(delivery_id, anyio.Event())
            row = await self._db(lambda r: r.get_delivery(delivery_id))
            if row is None or row.state in ("acked", "failed"):
                self._resolved.pop(delivery_id, None)
                continue
            await event.wait()
            self._resolved.pop(delivery_id, None)

    def _resolve(self, delivery_id: str) -> None:
        event = self._resolved.get(delivery_id)
        if event is not None:
            event.set()

    # ---- acknowledgements ---------------------------------------------------------

    async def ack(self, params: ChannelAckParams) -> None:
        row = await self._db(lambda r: r.get_delivery(params.delivery_id))
        config = self._config_of(row.channel_id) if row is not None else None
        if config is not None and config.connection.kind != "host":
            raise EngineError(f"channel {config.id!r} delivers through its own connection: channel:ack is for the host's")
        waiter = self._waiting.get(params.delivery_id)
        if waiter is not None:
            waiter.ack = params
            waiter.event.set()
            with anyio.move_on_after(ACK_STORE_WAIT_S):
                await waiter.stored.wait()
            return
        if row is None:
            raise NotFound(f"no delivery {params.delivery_id!r}")
        if params.ok:
            platform_id = params.platform_message_id or row.platform_message_id
            if row.state != "acked" or platform_id != row.platform_message_id:
                await self._db(lambda r: r.mark_acked(row.id, platform_id))
                self._resolve(row.id)
        elif row.state in ("pending", "sent"):
            await self._db(lambda r: r.note_error(row.id, _host_error(params)))

    # ---- sending --------------------------------------------------------------------

    async def _drain(self, key: tuple[str, str]) -> None:
        channel_id, chat_id = key
        while True:
            row = await self._db(lambda r: r.next_delivery(channel_id, chat_id))
            if row is None:
                return
            await self._deliver(row)

    async def _deliver(self, row: DeliveryRow) -> None:
        config = self._config_of(row.channel_id)
        if config is None:
            await self._db(lambda r: r.mark_failed(row.id, "the channel was deleted"))
            self._resolve(row.id)
            return
        policy = config.delivery
        assert policy.max_attempts is not None and policy.ack_timeout_ms is not None
        assert policy.retry_backoff_ms is not None
        attempts = row.attempts
        error = row.error or "not acknowledged"
        try:
            while True:
                if attempts >= policy.max_attempts:
                    await self._db(lambda r: r.mark_failed(row.id, error))
                    log.warning("delivery %s failed after %d attempts: %s", row.id, attempts, error)
                    return
                chunks = max(1, len(row.payload.chunks))
                chat = self.chat_bucket(config, row.chat_id, row.payload.chat_type)
                if chat is not None:
                    await chat.acquire(chunks)
                await self.bucket(config).acquire(chunks)
                attempts += 1
                sender = await self._sender_of(config) if self._sender_of is not None else None
                if sender is not None:
                    waiter = await self._send_through(sender, row, attempts, policy.ack_timeout_ms / 1000.0)
                else:
                    waiter = await self._send_once(row, attempts, policy.ack_timeout_ms / 1000.0)
                ack = waiter.ack
                try:
                    if ack is not None and ack.ok:
                        await self._db(lambda r: r.mark_acked(row.id, ack.platform_message_id))
                        return
                    if ack is None:
                        error = f"no acknowledgement within {policy.ack_timeout_ms} ms (attempt {attempts})"
                    else:
                        error = _host_error(ack, waiter.platform)
                        if not ack.retryable:
                            await self._db(lambda r: r.mark_failed(row.id, error))
                            return
                    if attempts >= policy.max_attempts:
                        await self._db(lambda r: r.mark_failed(row.id, error))
                        log.warning("delivery %s failed after %d attempts: %s", row.id, attempts, error)
                        return
                    await self._db(lambda r: r.note_error(row.id, error))
                finally:
                    waiter.stored.set()
                await anyio.sleep(min(MAX_BACKOFF_S, policy.retry_backoff_ms / 1000.0 * 2 ** (attempts - 1)))
                fresh = await self._db(lambda r: r.get_delivery(row.id))
                if fresh is None or fresh.state in ("acked", "failed"):
                    return  # acknowledged late, or the reply went away
        finally:
            self._resolve(row.id)

    async def _send_once(self, row: DeliveryRow, attempt: int, timeout_s: float) -> _Waiter:
        """Send once and wait for the acknowledgement (``waiter.ack``, None when none came)."""
        waiter = _Waiter()
        self._waiting[row.id] = waiter
        try:
            await self._db(lambda r: r.mark_sent(row.id, attempt))
            await self._notify(CHANNEL_REPLY, msgspec.structs.replace(row.payload, attempt=attempt))
            with anyio.move_on_after(timeout_s):
                await waiter.event.wait()
        except BaseException:
            waiter.stored.set()  # nothing more will be stored for it: its ack need not wait
            raise
        finally:
            self._waiting.pop(row.id, None)
        return waiter


    async def _send_through(self, sender: PlatformSender, row: DeliveryRow, attempt: int, timeout_s: float) -> _Waiter:
        """Send once through the channel's own connection; its outcome is the acknowledgement."""
        waiter = _Waiter()
        payload = msgspec.structs.replace(row.payload, attempt=attempt)
        await self._db(lambda r: r.mark_sent(row.id, attempt))
        try:
            target: str | None = None
            if payload.kind != "send":
                edited = await self._db(lambda r: r.get_delivery(payload.edit_of or ""))
                target = edited.platform_message_id if edited is not None else None
                if target is None:
                    raise DeliveryError("the message to change was never sent", retryable=False)
            with anyio.move_on_after(timeout_s):
                platform_id = await sender.deliver(payload, target)
                waiter.ack = ChannelAckParams(delivery_id=row.id, ok=True, platform_message_id=platform_id)
        except DeliveryError as exc:
            waiter.ack = ChannelAckParams(delivery_id=row.id, ok=False, error=exc.message, retryable=exc.retryable)
        except SidecarError as exc:  # no credentials, a locked secret: the next attempt may work
            waiter.ack = ChannelAckParams(delivery_id=row.id, ok=False, error=exc.message)
        waiter.platform = True
        return waiter


def _host_error(ack: ChannelAckParams, platform: bool = False) -> str:
    who = "the platform refused it" if platform else "the host could not deliver it"
    return f"{who}: {ack.error or 'no reason given'}"[:2000]
