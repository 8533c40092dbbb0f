"""The wire contract of chat-sidecar: msgspec Structs only, no I/O.

Everything the Electron/Tauri side sends or receives is declared here, one module per
domain: the stored shapes (``types``: SessionV2, MessageV2, ContentPart), the streaming
events (``events``: ChatStreamEvent), the error codes (``errors``), and the params/result
of every method with the domain's part of the method table (``lifecycle``, ``sessions``,
``messages``, ``chat``, ``providers``, ``settings``, ``tools``, ``mcp``, ``context``, ``compat``,
``channels``, ``kb``, ``sync``, ``storage``, ``memory``, ``memory_upkeep``, ``tasks``, ``skills``); ``common`` also holds the ``sidecar:progress`` convention.
``methods`` joins the parts into one table (METHODS) mapping each method name to its types.
``limits`` holds the bounds the fields are annotated with (int64, string lengths, page
sizes, the nesting depth of free-form JSON).

Field names are snake_case in Python and camelCase on the wire (``rename="camel"``).
This package imports nothing from ``sidecar``; generated copies of it live in
``protocol/generated/`` (JSON Schema and TypeScript).

The names this package re-exports (every domain's ``__all__``, METHODS, NOTIFICATIONS...)
load on first use: importing one module of it (``protocol.errors``, ``protocol.sessions``)
does not import every domain, which the first answers of a cold start do without.
"""

from typing import TYPE_CHECKING, Any

PROTOCOL_VERSION = 1

if TYPE_CHECKING:
    from protocol import channels, chat, common, compat, context, kb, lifecycle, mcp, memory, memory_upkeep, messages
    from protocol import providers, sessions, settings, skills, storage, sync, tasks, tools
    from protocol.common import MethodSpec as MethodSpec
    from protocol.errors import ErrorCode as ErrorCode
    from protocol.events import *  # noqa: F401,F403
    from protocol.methods import METHODS as METHODS
    from protocol.methods import NOTIFICATIONS as NOTIFICATIONS
    from protocol.types import *  # noqa: F401,F403

_DOMAIN_NAMES = (
    "common", "lifecycle", "sessions", "messages", "chat", "providers", "settings", "tools", "mcp", "context",
    "compat", "channels", "kb", "sync", "storage", "memory", "memory_upkeep", "tasks", "skills",
)
_SUBMODULES = frozenset({*_DOMAIN_NAMES, "errors", "events", "types", "limits", "methods", "notifications", "notification_names", "generated"})


def _load() -> None:
    """Import every domain and re-export their names here (once)."""
    import importlib

    from protocol.common import MethodSpec
    from protocol.errors import ErrorCode
    from protocol.events import __all__ as events_all
    from protocol.methods import METHODS, NOTIFICATIONS
    from protocol.types import __all__ as types_all

    names: dict[str, Any] = {"ErrorCode": ErrorCode, "METHODS": METHODS, "NOTIFICATIONS": NOTIFICATIONS,
                             "MethodSpec": MethodSpec}
    for module_name, exported in (("protocol.events", events_all), ("protocol.types", types_all)):
        module = importlib.import_module(module_name)
        names.update({name: getattr(module, name) for name in exported})
    domains = [importlib.import_module(f"protocol.{name}") for name in _DOMAIN_NAMES]
    for domain in domains:
        names.update({name: getattr(domain, name) for name in domain.__all__})
    names["__all__"] = [
        "PROTOCOL_VERSION", "ErrorCode", "METHODS", "NOTIFICATIONS", "MethodSpec", *types_all, *events_all,
        *(name for domain in domains for name in domain.__all__ if name != "MethodSpec"),
    ]
    globals().update(names)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES or (name.startswith("__") and name != "__all__"):
        # a submodule not imported yet: the import system loads it (``from protocol import limits``)
        raise AttributeError(f"module 'protocol' has no attribute {name!r}")
    _load()
    try:
        return globals()[name]
    except KeyError:
        raise AttributeError(f"module 'protocol' has no attribute {name!r}") from None
