"""The reads of sessions and messages that need the store and nothing else.

Each is a blocking handler ``f(store, params) -> result``: the one implementation that
the App's SessionService runs in the store's thread and that the start-up answers with
before the services are open (sidecar/coldstart.py; ``sidecar.bindings.EARLY`` names which
methods these are). Light on imports for that reason: the store's and two domains of the
protocol. What must stay true: a handler here reads, never writes, and its answer is the
one the bound service method gives while no reply of this process is running (the
service overlays its live replies on top, ``SessionService._live``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from protocol import messages, sessions
from protocol.common import IdParams, MethodSpec
from protocol.messages import MessagesGetParams, MessagesSearchParams, MessagesTreeParams
from protocol.sessions import SessionFilter, SessionListResult
from protocol.types import MessageTreeNode, MessageV2, SearchResult, SessionV2

if TYPE_CHECKING:
    from sidecar.store.store import Store

SPECS: dict[str, MethodSpec] = {**sessions.METHODS, **messages.METHODS}
"""The contract's entries of the methods these handlers answer (their params types)."""

_encoder = msgspec.json.Encoder()


def list_sessions(store: Store, params: SessionFilter) -> SessionListResult:
    return store.sessions.query(params)


def get_session(store: Store, params: IdParams) -> SessionV2:
    return store.sessions.get(params.id)


def get_messages(store: Store, params: MessagesGetParams) -> list[MessageV2]:
    return store.messages.query(params.session_id, params.options)


def get_tree(store: Store, params: MessagesTreeParams) -> msgspec.Raw:
    return msgspec.Raw(encode_tree(store.messages.tree(params.session_id)))


def search_messages(store: Store, params: MessagesSearchParams) -> list[SearchResult]:
    return store.search.messages(params.query, params.options)


HANDLERS: dict[str, Callable[[Store, Any], Any]] = {
    f.__name__: f for f in (list_sessions, get_session, get_messages, get_tree, search_messages)
}
"""The handlers by the name ``sidecar.bindings.EARLY`` gives them."""


def encode_tree(roots: list[MessageTreeNode]) -> bytes:
    """JSON of ``roots`` (list[MessageTreeNode]) without recursion, at any depth."""
    out: list[bytes] = [b"["]
    # Each frame: the children still to write, and where we are in them.
    stack: list[tuple[list[MessageTreeNode], int]] = [(roots, 0)]
    closers: list[bytes] = [b"]"]
    while stack:
        nodes, i = stack[-1]
        if i == len(nodes):
            stack.pop()
            out.append(closers.pop())
            continue
        stack[-1] = (nodes, i + 1)
        if i:
            out.append(b",")
        node = nodes[i]
        out.append(b'{"message":')
        out.append(_encoder.encode(node.message))
        out.append(b',"children":[')
        stack.append((node.children, 0))
        closers.append(b'],"isActive":' + (b"true" if node.is_active else b"false") + b"}")
    return b"".join(out)
