"""The wire contract of chat-sidecar: msgspec Structs only, no I/O.

Everything the Electron/Tauri side sends or receives is declared here, one module per
domain: the stored shapes (``types``: SessionV2, MessageV2, ContentPart), the streaming
events (``events``: ChatStreamEvent), the error codes (``errors``), and the params/result
of every method with the domain's part of the method table (``lifecycle``, ``sessions``,
``messages``, ``chat``, ``providers``, ``settings``, ``tools``, ``mcp``, ``context``, ``compat``,
``channels``, ``kb``, ``sync``, ``storage``, ``memory``); ``common`` also holds the ``sidecar:progress`` convention.
``methods`` joins the parts into one table (METHODS) mapping each method name to its types.
``limits`` holds the bounds the fields are annotated with (int64, string lengths, page
sizes, the nesting depth of free-form JSON).

Field names are snake_case in Python and camelCase on the wire (``rename="camel"``).
This package imports nothing from ``sidecar``; generated copies of it live in
``protocol/generated/`` (JSON Schema and TypeScript).
"""

from protocol import chat, common, context, lifecycle, mcp, messages, providers, sessions, settings, tools
from protocol import compat
from protocol import channels
from protocol import kb
from protocol import sync
from protocol import storage
from protocol import memory
from protocol.errors import ErrorCode
from protocol.events import *  # noqa: F401,F403
from protocol.events import __all__ as _events_all
from protocol.common import MethodSpec
from protocol.methods import METHODS, NOTIFICATIONS
from protocol.types import *  # noqa: F401,F403
from protocol.types import __all__ as _types_all

PROTOCOL_VERSION = 1

_DOMAINS = (common, lifecycle, sessions, messages, chat, providers, settings, tools, mcp, context, compat, channels, kb, sync, storage, memory)
for _domain in _DOMAINS:
    globals().update({name: getattr(_domain, name) for name in _domain.__all__})

__all__ = [
    "PROTOCOL_VERSION",
    "ErrorCode",
    "METHODS",
    "NOTIFICATIONS",
    "MethodSpec",
    *_types_all,
    *_events_all,
    *(name for domain in _DOMAINS for name in domain.__all__ if name != "MethodSpec"),
]
