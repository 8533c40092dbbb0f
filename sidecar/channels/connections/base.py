"""What every connection the sidecar owns shares: the supervisor loop, its errors, the sender.

``ConnectionSupervisor.run`` keeps one platform link (a Telegram poller, a Discord gateway, a
Slack socket: ``Link.run``) up until it is stopped, as the MCP supervisor keeps a server:
state ``connecting`` -> ``connected`` (the link calls ``ready``) -> on a drop or an error
``failed`` with the error and the time of the next attempt, after a backoff
(sidecar/tools/mcp_supervisor.py ``backoff_delay``: 1 s doubling to 60 s; a link that stayed
connected for STABLE_S starts the count again). ``Reconnect`` (the platform asked for it:
Discord op 7, Slack ``disconnect``) connects again at once, unless the platform asked
within STABLE_S before: such requests in a row wait the backoff (a platform cannot make the
link reconnect in a loop); ``Fatal`` (the platform refused
the credentials or the configuration) stops retrying until ``channel:connect``.

``DeliveryError`` (delivery.py, with the PlatformSender protocol) is how a sender reports a
platform message that could not be sent (``retryable``: the outbox tries again); a sender waits out a platform's own "retry after"
(Telegram's ``parameters.retry_after``, Discord's and Slack's 429) itself, at most
MAX_RETRY_AFTER_S each time and MAX_RATE_LIMIT_WAITS times per message.

A message the channel cannot take (InvalidParams: too large, a bad attachment) is skipped
and confirmed to the platform; any other failure to store one (the store) ends the link, so
the platform sends it again once the connection is back.

Must stay true: a link's errors never leave ``run`` (they become the state); cancellation
is never swallowed; every wait is bounded or interruptible by ``stop``; the error kept for
the status is cut to ERROR_CHARS and never contains a credential (Redactor).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio

from protocol.channels import ChannelConnectionStatus, ChannelMessageParams, ConnectionState
from sidecar.channels.delivery import DeliveryError, PlatformSender
from sidecar.tools.mcp_supervisor import STABLE_S, backoff_delay

__all__ = [
    "ConnectionSupervisor", "Link", "Reconnect", "Fatal", "DeliveryError", "PlatformSender", "OnMessage",
    "ERROR_CHARS", "MAX_RETRY_AFTER_S", "MAX_RATE_LIMIT_WAITS", "CALL_TIMEOUT_S", "HELLO_TIMEOUT_S",
    "MAX_FRAME_BYTES", "retry_after_wait", "first_leaf",
]

log = logging.getLogger(__name__)

ERROR_CHARS = 500
MAX_RETRY_AFTER_S = 300.0
MAX_RATE_LIMIT_WAITS = 5
CALL_TIMEOUT_S = 30.0
"""One platform API call (a long poll adds its own wait to it)."""
HELLO_TIMEOUT_S = 30.0
"""A WebSocket's opening handshake and the platform's first frame (Discord hello, Slack hello)."""
MAX_FRAME_BYTES = 16 * 1024 * 1024
"""The largest WebSocket frame a gateway or socket may send."""

OnMessage = Callable[[ChannelMessageParams], Awaitable[object]]
"""Hands one platform message to the channel (returns once it is stored: only then is it
confirmed to the platform)."""


class Reconnect(Exception):
    """The platform asked for a new connection (at once, no backoff)."""


class Fatal(Exception):
    """Retrying will not help (bad credentials, a refused configuration)."""


def first_leaf(exc: Exception) -> Exception:
    """The exception that says what happened, out of the groups task groups wrap errors in:
    a Fatal first, then a Reconnect, else the first one."""
    leaves: list[Exception] = []
    stack: list[BaseException] = [exc]
    while stack:
        item = stack.pop(0)
        if isinstance(item, BaseExceptionGroup):
            stack[:0] = list(item.exceptions)
        elif isinstance(item, Exception):
            leaves.append(item)
    for kind in (Fatal, Reconnect, Exception):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    return exc


async def retry_after_wait(seconds: float, attempt: int, what: str) -> None:
    """Wait what a 429 asked for, or give up (DeliveryError, retryable) past the limits."""
    if attempt >= MAX_RATE_LIMIT_WAITS or seconds > MAX_RETRY_AFTER_S:
        raise DeliveryError(f"{what}: rate limited (retry after {seconds:g} s)", retryable=True)
    log.info("%s: rate limited, waiting %.2f s", what, seconds)
    await anyio.sleep(max(0.0, seconds))


class Link(Protocol):
    async def run(self, ready: Callable[[str | None], None]) -> None:
        """Connect and serve until the link drops (return or raise); call ``ready(bot id)``
        once connected."""
        ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class ConnectionSupervisor:
    def __init__(self, channel_id: str, link: Link) -> None:
        self.channel_id = channel_id
        self.link = link
        self.state: ConnectionState = "connecting"
        self.error: str | None = None
        self.retry_at_ms: int | None = None
        self.since_ms = _now_ms()
        self.bot_user_id: str | None = None
        self.done = anyio.Event()
        self._stopping = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._failures = 0
        self._reconnected_at: float | None = None
        self._quick_reconnects = 0

    def status(self) -> ChannelConnectionStatus:
        return ChannelConnectionStatus(
            state=self.state, error=self.error, retry_at=self.retry_at_ms, since=self.since_ms,
            bot_user_id=self.bot_user_id,
        )

    def _set(self, state: ConnectionState) -> None:
        if state != self.state:
            self.state = state
            self.since_ms = _now_ms()

    def stop(self) -> None:
        self._stopping.set()
        if self._scope is not None:
            self._scope.cancel()

    def _ready(self, bot_user_id: str | None) -> None:
        if bot_user_id:
            self.bot_user_id = bot_user_id
        self.error = None
        self.retry_at_ms = None
        self._set("connected")

    async def run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._set("connecting")
                started = time.monotonic()
                fatal = reconnect = False
                with anyio.CancelScope() as scope:
                    self._scope = scope
                    if self._stopping.is_set():
                        scope.cancel()
                    try:
                        await self.link.run(self._ready)
                        self.error = "the connection was closed"
                    except Exception as exc:
                        leaf = first_leaf(exc)
                        reconnect = isinstance(leaf, Reconnect)
                        fatal = isinstance(leaf, Fatal)
                        if reconnect:
                            log.info("channel %s: reconnecting (%s)", self.channel_id, leaf)
                        else:
                            self.error = (str(leaf) or type(leaf).__name__)[:ERROR_CHARS]
                            log.debug("channel %s: link failed", self.channel_id, exc_info=True)
                self._scope = None
                if self._stopping.is_set():
                    break
                if reconnect:
                    await self._wait_to_reconnect()
                    continue
                connected_for = time.monotonic() - started if self.state == "connected" else 0.0
                self._set("failed")
                if fatal:
                    self.retry_at_ms = None
                    log.error("channel %s: %s; not retried (channel:connect tries again)", self.channel_id, self.error)
                    await self._stopping.wait()
                    break
                if connected_for >= STABLE_S:
                    self._failures = 0
                self._failures += 1
                delay = backoff_delay(self._failures)
                self.retry_at_ms = _now_ms() + int(delay * 1000)
                log.warning("channel %s: %s; next attempt in %g s", self.channel_id, self.error, delay)
                with anyio.move_on_after(delay):
                    await self._stopping.wait()
                self.retry_at_ms = None
        finally:
            self._set("disconnected")
            self.done.set()

    async def _wait_to_reconnect(self) -> None:
        """At once after a stable while; a platform that asks again within STABLE_S is answered
        after the backoff, its count growing with every such request."""
        now = time.monotonic()
        quick = self._reconnected_at is not None and now - self._reconnected_at < STABLE_S
        self._reconnected_at = now
        self._quick_reconnects = self._quick_reconnects + 1 if quick else 0
        if not self._quick_reconnects:
            return
        delay = backoff_delay(self._quick_reconnects)
        log.warning("channel %s: asked to reconnect %d times within %g s; next attempt in %g s",
                    self.channel_id, self._quick_reconnects + 1, STABLE_S, delay)
        self.retry_at_ms = _now_ms() + int(delay * 1000)
        with anyio.move_on_after(delay):
            await self._stopping.wait()
        self.retry_at_ms = None
