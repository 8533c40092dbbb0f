"""Notifier: the one way the sidecar's services send a notification.

``await notify(SESSION_UPDATED, session)``: the first argument is one of the table's
Notifications (``protocol/notifications.py``), which carries the method name and the
params type, so mypy checks each call site's payload; no service names a method.

Under it is a ``Send``, ``(method, params)``: the App's EventHub (sidecar/engine/events.py),
which writes to the client and offers the ``chat:stream`` events to in-process listeners.

Must stay true: a leaf module (any layer may import it); it adds nothing to what is sent
(the params Struct goes out as it is, and must validate against the generated schema).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from protocol.common import Notification

__all__ = ["Notifier", "Send"]

P = TypeVar("P")

Send = Callable[[str, Any], Awaitable[None]]
"""Where notifications go: the method name and the params Struct."""


class Notifier:
    __slots__ = ("_send",)

    def __init__(self, send: Send) -> None:
        self._send = send

    async def __call__(self, note: Notification[P], params: P) -> None:
        await self._send(note.method, params)
