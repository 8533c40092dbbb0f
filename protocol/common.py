"""Params and results shared by every domain: empty params, an id, a name, success.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from protocol.limits import Id
from protocol.types import Struct

__all__ = [
    "MethodSpec",
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


class CancelRequestParams(Struct, kw_only=True):
    """``$/cancelRequest``: cancel an in-flight request of ours by its id."""

    id: int | float | str
    """The id of the request, as it was sent (JSON-RPC allows strings and numbers)."""


ProgressToken = str | int
"""What the caller names a piece of long work by (``progressToken`` of its request)."""

ProgressKind = Literal["begin", "report", "end"]


class ProgressParams(Struct, omit_defaults=False, kw_only=True):
    """``sidecar:progress``: how far a long piece of work has come (import, export, ...).

    The convention (LSP's work-done progress, flattened): a request that can take long takes
    ``progressToken``; when the caller gives one, the sidecar sends ``sidecar:progress``
    notifications carrying that token: one ``begin``, any number of ``report``, and exactly
    one ``end`` once the work is over (also when it failed: ``message`` says why), before the
    request's answer. A request refused before any work starts sends none."""

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
