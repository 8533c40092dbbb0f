"""The method table: each method name -> its params and result types.

Each domain module of ``protocol`` declares its own methods (``METHODS`` at its end); this
module joins them, in this order, into the one table ``sidecar/server.py`` binds handlers
to and ``tools/gen_protocol.py`` generates the JSON Schema and TypeScript from. A new
domain adds its module to ``_DOMAIN_TABLES``.
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
from protocol.channels import ChannelReplyParams
from protocol.chat import SuggestionsParams
from protocol.common import CancelRequestParams, MethodSpec, ProgressParams
from protocol.events import ChatStreamEvent
from protocol.types import SessionV2

_DOMAIN_TABLES = (lifecycle, sessions, messages, chat, providers, settings, tools, mcp, context, compat, channels, kb, sync, storage, memory, memory_upkeep, tasks, skills)

METHODS: dict[str, MethodSpec] = {}
for _domain in _DOMAIN_TABLES:
    _clash = METHODS.keys() & _domain.METHODS.keys()
    assert not _clash, f"methods declared twice: {sorted(_clash)}"
    METHODS.update(_domain.METHODS)

NOTIFICATIONS: dict[str, MethodSpec] = {
    "chat:stream": MethodSpec(
        ChatStreamEvent, None, "One streaming event of a reply.", direction="server->client"
    ),
    "chat:session:updated": MethodSpec(
        SessionV2, None, "A session changed outside a request of the renderer (title, counters).",
        direction="server->client",
    ),
    "channel:reply": MethodSpec(
        ChannelReplyParams, None, "Deliver chunks of a reply to an IM chat; answer with channel:ack.",
        direction="server->client",
    ),
    "chat:suggestions": MethodSpec(
        SuggestionsParams, None, "Follow-up questions proposed for a finished reply (stored with it).",
        direction="server->client",
    ),
    "sidecar:progress": MethodSpec(
        ProgressParams, None, "Progress of a long request, under the caller's progressToken.",
        direction="server->client",
    ),
    "$/cancelRequest": MethodSpec(
        CancelRequestParams, None, "Cancel an in-flight request (LSP convention).",
    ),
}
NOTIFICATIONS.update(sync.NOTIFICATIONS)
NOTIFICATIONS.update(memory.NOTIFICATIONS)
NOTIFICATIONS.update(tasks.NOTIFICATIONS)
NOTIFICATIONS.update(memory_upkeep.NOTIFICATIONS)
NOTIFICATIONS.update(skills.NOTIFICATIONS)
