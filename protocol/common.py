"""Params and results shared by every domain: empty params, an id, a name, success.
"""

from __future__ import annotations

from typing import Any

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


class ProgressParams(Struct, omit_defaults=False, kw_only=True):
    """``sidecar:progress``: how far a long piece of work has come (import, export, knowledge
    indexing, re-embedding...). ``token`` is the one the caller gave with its request; the
    last notification of a piece of work has ``done == total`` (its ``message`` says how it
    ended: ``ready``, or ``error: ...``)."""

    token: int | str
    kind: str
    """What the work is, e.g. ``kb:index`` or ``kb:reembed``."""
    done: int
    total: int
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
