"""The method table: each method name -> its params and result types.

Each domain module of ``protocol`` declares its own methods (``METHODS`` at its end); this
module joins them, in this order, into the one table ``sidecar/server.py`` binds handlers
to and ``tools/gen_protocol.py`` generates the JSON Schema and TypeScript from. A new
domain adds its module to ``_DOMAIN_TABLES``. NOTIFICATIONS is built from the notification
table (``protocol/notifications.py``) and the client's ``$/cancelRequest``.
"""

from __future__ import annotations

from protocol import chat, context, lifecycle, mcp, messages, providers, sessions, settings, tools
from protocol import compat
from protocol import channels
from protocol import kb
from protocol import sync
from protocol import storage
from protocol import memory
from protocol import tasks
from protocol import memory_upkeep
from protocol import skills
from protocol.common import CANCEL_REQUEST, CancelRequestParams, MethodSpec
from protocol.notifications import CORE, DOMAINS

_DOMAIN_TABLES = (lifecycle, sessions, messages, chat, providers, settings, tools, mcp, context, compat, channels, kb, sync, storage, memory, memory_upkeep, tasks, skills)

METHODS: dict[str, MethodSpec] = {}
for _domain in _DOMAIN_TABLES:
    _clash = METHODS.keys() & _domain.METHODS.keys()
    assert not _clash, f"methods declared twice: {sorted(_clash)}"
    METHODS.update(_domain.METHODS)

NOTIFICATIONS: dict[str, MethodSpec] = {
    **{note.method: note.spec for note in CORE},
    CANCEL_REQUEST: MethodSpec(CancelRequestParams, None, "Cancel an in-flight request (LSP convention)."),
    **{note.method: note.spec for note in DOMAINS},
}
