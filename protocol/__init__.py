"""The wire contract of chat-sidecar: msgspec Structs only, no I/O.

Everything the Electron/Tauri side sends or receives is declared here: the
stored shapes (SessionV2, MessageV2, ContentPart), the streaming events
(ChatStreamEvent), the params/result of every method, the error codes, and
one table (METHODS) mapping each method name to its types.

Field names are snake_case in Python and camelCase on the wire (``rename="camel"``).
This package imports nothing from ``sidecar``; generated copies of it live in
``protocol/generated/`` (JSON Schema and TypeScript).
"""

from protocol.errors import ErrorCode
from protocol.events import *  # noqa: F401,F403
from protocol.events import __all__ as _events_all
from protocol.methods import METHODS, NOTIFICATIONS, MethodSpec
from protocol.params import *  # noqa: F401,F403
from protocol.params import __all__ as _params_all
from protocol.types import *  # noqa: F401,F403
from protocol.types import __all__ as _types_all

PROTOCOL_VERSION = 1

__all__ = [
    "PROTOCOL_VERSION",
    "ErrorCode",
    "METHODS",
    "NOTIFICATIONS",
    "MethodSpec",
    *_types_all,
    *_events_all,
    *_params_all,
]
