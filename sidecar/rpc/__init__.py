"""NDJSON JSON-RPC 2.0 over anyio byte streams: our stdio server and the ACP/MCP client side.

Layers (each module's docstring says what it owns):
    framing.py   line reader with a size limit, the single queued writer
    parse.py     one input line -> a message, a batch, or the error that answers it
    surrogates.py lone UTF-16 surrogate escapes: masked so the envelope can be read
    messages.py  the envelope as msgspec Structs, classification by shape
    batch.py     a batch's replies as one bounded line
    dispatch.py  Handler and Dispatcher: params decoding and the error -> code mapping
    bounds.py    the nesting limit of free-form JSON in params, found from the params types
    peer.py      JsonRpcPeer: requests out, responses in, dispatch in, cancellation
    stdio.py     the process's real stdin/stdout as byte streams (fd 1 guarded)
    memory.py    connected in-memory stream pairs for tests
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.config import DEFAULT_MAX_LINE_BYTES
    from sidecar.rpc.dispatch import Dispatcher, Handler, Handlers
    from sidecar.rpc.framing import LineReader, LineWriter, OversizedLine
    from sidecar.rpc.memory import connected_pair, memory_pipe
    from sidecar.rpc.peer import CANCEL_METHOD, JsonRpcPeer

_HOMES = {
    "CANCEL_METHOD": "sidecar.rpc.peer",
    "DEFAULT_MAX_LINE_BYTES": "sidecar.config",
    "Dispatcher": "sidecar.rpc.dispatch",
    "Handler": "sidecar.rpc.dispatch",
    "Handlers": "sidecar.rpc.dispatch",
    "JsonRpcPeer": "sidecar.rpc.peer",
    "LineReader": "sidecar.rpc.framing",
    "LineWriter": "sidecar.rpc.framing",
    "OversizedLine": "sidecar.rpc.framing",
    "connected_pair": "sidecar.rpc.memory",
    "memory_pipe": "sidecar.rpc.memory",
}
"""Loaded on first use: the handshake (sidecar/handshake.py) needs messages, dispatch and
stdio before the event loop, not the peer or anyio's memory streams."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sidecar.rpc' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "CANCEL_METHOD",
    "DEFAULT_MAX_LINE_BYTES",
    "Dispatcher",
    "Handler",
    "Handlers",
    "JsonRpcPeer",
    "LineReader",
    "LineWriter",
    "OversizedLine",
    "connected_pair",
    "memory_pipe",
]
