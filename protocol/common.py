"""Params and results shared by every domain: empty params, an id, a name, success, and
the ``sidecar:progress`` convention.

Progress (LSP's work-done progress, flattened): a request that can take long accepts
``progressToken``; when it is given, the sidecar sends ``sidecar:progress`` notifications
carrying that token: once the work starts one ``begin``, any number of ``report``, and
exactly one ``end`` (also when the work fails or the request is cancelled; a request
refused before any work starts sends none). ``done``/``total`` count the units of work
(``total`` is absent while unknown); ``message`` says what is happening.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

import msgspec

from protocol.limits import Id, Int64
from protocol.types import Struct

__all__ = [
    "MethodSpec",
    "Notification",
    "CANCEL_REQUEST",
    "SuccessResult",
    "EmptyParams",
    "IdParams",
    "NameParams",
    "CancelRequestParams",
    "ProgressToken",
    "ProgressKind",
    "ProgressParams",
]


class SuccessResult(Struct, omit_defaults=False, kw_only=True):
    success: bool = True


class EmptyParams(Struct, forbid_unknown_fields=False, kw_only=True):
    """Methods without params accept an absent or empty object."""


class IdParams(Struct, kw_only=True):
    id: Id


class NameParams(Struct, kw_only=True):
    name: Id


CANCEL_REQUEST = "$/cancelRequest"
"""The one notification a client sends (and the sidecar sends its own peers): cancel a request."""


class CancelRequestParams(Struct, kw_only=True):
    """``$/cancelRequest``: cancel an in-flight request of ours by its id."""

    id: int | float | str
    """The id of the request, as it was sent (JSON-RPC allows strings and numbers)."""


ProgressToken = Int64 | Id
"""Chosen by the caller (a number or a string of at most 256 characters)."""
ProgressKind = Literal["begin", "report", "end"]


class ProgressParams(Struct, omit_defaults=False, kw_only=True):
    """``sidecar:progress``: how far a long request has come (see the module docstring)."""

    token: ProgressToken
    kind: ProgressKind
    done: int = 0
    """Units of work done so far (messages, chunks, files: ``message`` and the method say which)."""
    total: int | None = None
    """All units, when known."""
    message: str | None = None


class MethodSpec(msgspec.Struct, frozen=True):
    """One method (or notification) of the contract."""

    params: Any
    """A Struct type; the JSON-RPC params object decodes to it."""
    result: Any
    """The result type (a Struct, list[...] or None for notifications)."""
    doc: str
    direction: str = "client->server"
    """``client->server`` for requests we answer, ``server->client`` for notifications we send."""


P = TypeVar("P")


class Notification(Generic[P]):
    """One notification the sidecar sends: its method name and its params type in one object.

    Declared once in ``protocol/notifications.py`` with its params type as the type
    argument (``SESSION_UPDATED: Notification[SessionV2]``), so that a sender's
    ``await notify(SESSION_UPDATED, session)`` is checked by mypy: the payload must be of
    the declared type. ``spec`` is its row of the notification table.
    """

    __slots__ = ("method", "spec")

    def __init__(self, method: str, params: Any, doc: str) -> None:
        self.method = method
        self.spec = MethodSpec(params, None, doc, direction="server->client")

    def __repr__(self) -> str:
        return f"Notification({self.method!r})"
