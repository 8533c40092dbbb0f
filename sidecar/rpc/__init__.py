"""NDJSON JSON-RPC 2.0 over anyio byte streams: our stdio server and the ACP/MCP client side.

Layers (each module's docstring says what it owns):
    framing.py   line reader with a size limit, the single queued writer
    messages.py  the envelope as msgspec Structs, classification by shape
    dispatch.py  Handler and Dispatcher: params decoding and the error -> code mapping
    bounds.py    the nesting limit of free-form JSON in params, found from the params types
    peer.py      JsonRpcPeer: requests out, responses in, dispatch in, cancellation
    stdio.py     the process's real stdin/stdout as byte streams (fd 1 guarded)
    memory.py    connected in-memory stream pairs for tests
"""

from sidecar.rpc.dispatch import Dispatcher, Handler, Handlers
from sidecar.config import DEFAULT_MAX_LINE_BYTES
from sidecar.rpc.framing import LineReader, LineWriter, OversizedLine
from sidecar.rpc.memory import connected_pair, memory_pipe
from sidecar.rpc.peer import CANCEL_METHOD, JsonRpcPeer

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
