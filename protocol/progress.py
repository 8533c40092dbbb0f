"""``sidecar:progress``: progress of a long request, reported under a token the caller chose.

The convention (LSP's work-done progress, flattened): a request that can take long accepts
``progressToken``; when it is given, the sidecar sends ``sidecar:progress`` notifications
carrying that token: once the work starts one ``begin``, any number of ``report``, and
exactly one ``end`` (also when the work fails or the request is cancelled; a request
refused before any work starts sends none). ``done``/``total`` count the units of work
(``total`` is absent while unknown); ``message`` says what is happening.
"""

from __future__ import annotations

from typing import Literal

from protocol.common import MethodSpec
from protocol.types import Struct

__all__ = ["ProgressToken", "ProgressKind", "ProgressParams"]

ProgressToken = str | int
ProgressKind = Literal["begin", "report", "end"]


class ProgressParams(Struct, omit_defaults=False, kw_only=True):
    token: ProgressToken
    kind: ProgressKind
    done: int = 0
    total: int | None = None
    message: str | None = None


NOTIFICATIONS: dict[str, MethodSpec] = {
    "sidecar:progress": MethodSpec(
        ProgressParams, None, "Progress of a long request, under the caller's progressToken.",
        direction="server->client",
    ),
}
"""Notifications of this module (joined into ``protocol.methods.NOTIFICATIONS``)."""
