"""Our MCP client in-process, against scripted servers: what the real fixture servers of
test_tools_mcp.py never do. Over memory streams (sidecar/tools/mcp_client.py on the peer):
version negotiation and its refusal, ``initialized``, pagination and its cap, ``ping``
answered, other server requests -32601, ``list_changed``, results that do not validate,
the content mapping, ``notifications/cancelled`` for a cancelled call and never for
``initialize``. Over streamable HTTP (sidecar/tools/mcp_http.py, on httpx2's MockTransport):
the session and version headers, SSE answers carrying server messages, every answer that
cannot give a response failing its request, the session's end and the server's loss
closing the channel, the DELETE at close. Through the manager, a raw stdio server (a banner
on stdout, a ping of its own, ``list_changed`` mid-call): the tools are listed again; one
answering a version we do not speak fails with that reason (not with how it was stopped).
And the client imports none of the SDK."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import msgspec
import pytest

from sidecar.errors import PeerClosed, RemoteError
from sidecar.rpc.framing import LineReader
from sidecar.tools.mcp import _result_text
from sidecar.tools.mcp_client import (
    LATEST_PROTOCOL_VERSION,
    MAX_TOOL_PAGES,
    CallToolResult,
    McpProtocolError,
    McpSession,
    new_peer,
)
from sidecar.tools.mcp_http import open_channel
from mcp_helpers import modules_loaded_by, wait_state

pytestmark = pytest.mark.anyio

TOOLS = {"tools": {"listChanged": True}}


class ServerEnd:
    """The server's side of a memory-stream connection: JSON messages in and out."""

    def __init__(self, receive: Any, send: Any) -> None:
        self._reader = LineReader(receive, 1 << 20)
        self._send = send
        self.seen: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        line = await self._reader.receive()
        assert isinstance(line, bytes)
        message: dict[str, Any] = json.loads(line)
        self.seen.append(message)
        return message

    async def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        await self._send.send(data + b"\n")

    async def answer(self, result: Any) -> dict[str, Any]:
        """Receive the next request and answer it with ``result``; the request."""
        request = await self.receive()
        await self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
        return request

    async def handshake(self, version: str = LATEST_PROTOCOL_VERSION, capabilities: Any = TOOLS) -> None:
        await self.answer({"protocolVersion": version, "capabilities": capabilities, "serverInfo": {"name": "s", "version": "1"}})
        assert (await self.receive())["method"] == "notifications/initialized"


Script = Callable[[ServerEnd], Awaitable[None]]


@asynccontextmanager
async def scripted(script: Script, **session: Any) -> AsyncIterator[tuple[McpSession, ServerEnd]]:
    to_server, from_client = anyio.create_memory_object_stream[bytes](100)
    to_client, from_server = anyio.create_memory_object_stream[bytes](100)
    end = ServerEnd(from_client, to_client)

    async def serve() -> None:
        try:
            await script(end)
        except anyio.EndOfStream:  # the client went away first
            pass

    with to_server, from_client, to_client, from_server:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            async with new_peer(from_server, to_server, name="mcp test", max_line_bytes=1 << 20) as peer:
                yield McpSession(peer, **session), end
            tg.cancel_scope.cancel()


async def test_initialize_offers_the_latest_version_and_accepts_an_older_one_we_speak() -> None:
    async def script(end: ServerEnd) -> None:
        await end.handshake("2025-06-18")
        await anyio.sleep_forever()

    async with scripted(script) as (session, end):
        with anyio.fail_after(5):
            result = await session.initialize()
            while len(end.seen) < 2:
                await anyio.sleep(0.01)
        assert result.protocol_version == session.protocol_version == "2025-06-18"
        offer = end.seen[0]
        assert offer["method"] == "initialize" and offer["params"]["protocolVersion"] == LATEST_PROTOCOL_VERSION == "2025-11-25"
        assert offer["params"]["capabilities"] == {} and offer["params"]["clientInfo"]["name"]
        assert end.seen[1] == {"jsonrpc": "2.0", "method": "notifications/initialized"}


async def test_a_version_we_do_not_speak_is_refused_by_name() -> None:
    async def script(end: ServerEnd) -> None:
        await end.answer({"protocolVersion": "2099-01-01", "capabilities": TOOLS})
        await anyio.sleep_forever()

    async with scripted(script) as (session, end):
        with anyio.fail_after(5), pytest.raises(McpProtocolError, match="'2099-01-01'.*2025-11-25"):
            await session.initialize()
        assert [m.get("method") for m in end.seen] == ["initialize"]  # no initialized after it


async def test_tools_are_listed_page_by_page_and_a_server_that_never_stops_is_cut_off() -> None:
    async def script(end: ServerEnd) -> None:
        await end.handshake()
        page = {"tools": [{"name": "a", "inputSchema": {"type": "object"}}], "nextCursor": "c2"}
        assert "cursor" not in (await end.answer(page)).get("params", {})
        last = await end.answer({"tools": [{"name": "b", "description": "B", "inputSchema": "not a schema"}]})
        assert last["params"] == {"cursor": "c2"}
        while True:  # the second listing: a cursor every time
            await end.answer({"tools": [], "nextCursor": "again"})

    async with scripted(script) as (session, end):
        with anyio.fail_after(10):
            await session.initialize()
            tools = await session.list_tools()
            assert [(t.name, t.description, t.schema) for t in tools] == [("a", "", {"type": "object"}), ("b", "B", {})]
            before = len(end.seen)
            assert await session.list_tools() == []
        assert len(end.seen) - before == MAX_TOOL_PAGES


async def test_a_server_without_the_tools_capability_is_not_asked_for_tools() -> None:
    async def script(end: ServerEnd) -> None:
        await end.handshake(capabilities={"prompts": {}})
        await anyio.sleep_forever()

    async with scripted(script) as (session, end):
        with anyio.fail_after(5):
            await session.initialize()
            assert await session.list_tools() == []
            while len(end.seen) < 2:  # initialized, written after initialize returned
                await anyio.sleep(0.01)
            await anyio.sleep(0.05)
        assert [m.get("method") for m in end.seen] == ["initialize", "notifications/initialized"]


async def test_server_requests_and_notifications() -> None:
    changed = anyio.Event()
    answers: dict[Any, dict[str, Any]] = {}

    async def script(end: ServerEnd) -> None:
        await end.handshake()
        await end.send({"jsonrpc": "2.0", "id": "p1", "method": "ping"})
        await end.send({"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage", "params": {"messages": []}})
        await end.send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}})
        await end.send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        while len(answers) < 2:
            message = await end.receive()
            answers[message["id"]] = message
        await anyio.sleep_forever()

    async with scripted(script, on_tools_changed=changed.set) as (session, end):
        with anyio.fail_after(5):
            await session.initialize()
            await changed.wait()
            while len(answers) < 2:
                await anyio.sleep(0.01)
    assert answers["p1"] == {"jsonrpc": "2.0", "id": "p1", "result": {}}
    assert answers[7]["error"]["code"] == -32601


async def test_results_that_do_not_validate_fail_the_request_not_the_session() -> None:
    async def script(end: ServerEnd) -> None:
        await end.handshake()
        await end.answer({"tools": "not a list"})
        await end.answer({"content": [{"type": "text"}]})  # a text block without text
        await end.answer({"content": [{"type": "text", "text": 5}]})
        await end.answer({"content": [{"type": "text", "text": "fine"}]})
        await anyio.sleep_forever()

    async with scripted(script) as (session, _):
        with anyio.fail_after(5):
            await session.initialize()
            with pytest.raises(McpProtocolError, match="tools/list"):
                await session.list_tools()
            with pytest.raises(McpProtocolError, match="text block without text"):
                await session.call_tool("t", {})
            with pytest.raises(McpProtocolError, match="invalid result for tools/call"):
                await session.call_tool("t", {})
            result = await session.call_tool("t", {})
        assert _result_text(result) == "fine" and not result.is_error


def test_the_content_mapping() -> None:
    raw = {
        "content": [
            {"type": "text", "text": "one"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}},
            {"type": "resource", "resource": {"uri": "file:///b", "blob": "AAAA"}},
            {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
            {"type": "resource_link", "uri": "file:///c", "name": "c"},
        ],
        "isError": True,
    }
    result = msgspec.json.decode(json.dumps(raw), type=CallToolResult)
    assert result.is_error
    assert _result_text(result).split("\n") == [
        "one", "[image image/png omitted]", "inside", "[resource file:///b]",
        "[audio content omitted]", "[resource_link content omitted]",
    ]
    structured = msgspec.json.decode(b'{"content": [], "structuredContent": {"n": 1}}', type=CallToolResult)
    assert _result_text(structured) == '{"n":1}' and not structured.is_error


async def test_a_cancelled_call_is_announced_and_initialize_never_is() -> None:
    async def script(end: ServerEnd) -> None:
        await end.receive()  # initialize, never answered
        await anyio.sleep_forever()

    async with scripted(script) as (session, end):
        with anyio.move_on_after(0.2):
            await session.initialize()
        await anyio.sleep(0.2)
        assert [m.get("method") for m in end.seen] == ["initialize"]

    async def script2(end: ServerEnd) -> None:
        await end.handshake()
        await end.receive()  # tools/call, never answered
        await end.receive()

    async with scripted(script2) as (session, end):
        with anyio.fail_after(5):
            await session.initialize()
        with anyio.move_on_after(0.2):
            await session.call_tool("slow", {})
        with anyio.fail_after(5):
            while len(end.seen) < 4:
                await anyio.sleep(0.01)
        call, cancel = end.seen[2], end.seen[3]
        assert call["method"] == "tools/call" and call["params"] == {"name": "slow", "arguments": {}}
        assert cancel["method"] == "notifications/cancelled" and cancel["params"]["requestId"] == call["id"]


async def test_a_server_that_goes_away_fails_what_is_pending_with_peer_closed() -> None:
    async def script(end: ServerEnd) -> None:
        await end.handshake()
        await end.receive()
        await end._send.aclose()

    async with scripted(script) as (session, _):
        with anyio.fail_after(5):
            await session.initialize()
            with pytest.raises(PeerClosed):
                await session.call_tool("t", {})
            await session.closed.wait()


# ---- streamable HTTP ----------------------------------------------------------------------

URL = "http://mcp.test/mcp"


def _rpc(body: bytes) -> dict[str, Any]:
    return json.loads(body) if body else {}


def _sse(*messages: dict[str, Any]) -> bytes:
    return b"".join(b"event: message\ndata: " + json.dumps(m).encode() + b"\n\n" for m in messages)


class FakeHttpServer:
    """Streamable HTTP in a handler: ``answers[method](request, message)`` -> Response."""

    def __init__(self, answers: dict[str, Callable[[httpx2.Request, dict[str, Any]], httpx2.Response]]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        message = _rpc(request.content) if request.method == "POST" else {}
        self.requests.append((request.method, dict(request.headers), message))
        if request.method != "POST":
            return self.answers.get(request.method, lambda r, m: httpx2.Response(405))(request, message)
        key = message.get("method") or "response"
        if key == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": TOOLS}
            return httpx2.Response(200, json={"jsonrpc": "2.0", "id": message["id"], "result": result}, headers={"mcp-session-id": "S1"})
        if key in self.answers:
            return self.answers[key](request, message)
        return httpx2.Response(202)


@asynccontextmanager
async def http_session(server: FakeHttpServer, **session: Any) -> AsyncIterator[tuple[McpSession, Any]]:
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(server)) as client:
        async with open_channel(client, URL, max_bytes=4096) as channel:
            async with new_peer(channel.peer_receive, channel.peer_send, name="mcp http", max_line_bytes=4096) as peer:
                s = McpSession(peer, on_version=channel.use_version, **session)
                with anyio.fail_after(5):
                    await s.initialize()
                yield s, channel


def _ok(result: Any) -> Callable[[httpx2.Request, dict[str, Any]], httpx2.Response]:
    return lambda r, m: httpx2.Response(200, json={"jsonrpc": "2.0", "id": m["id"], "result": result})


async def test_http_headers_session_sse_and_the_delete_at_close() -> None:
    changed = anyio.Event()

    def call(request: httpx2.Request, message: dict[str, Any]) -> httpx2.Response:
        body = _sse(
            {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"},
            {"jsonrpc": "2.0", "id": "srv-1", "method": "ping"},
            {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [{"type": "text", "text": "via sse"}]}},
        )
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    server = FakeHttpServer({"tools/list": _ok({"tools": [{"name": "t", "inputSchema": {}}]}), "tools/call": call})
    async with http_session(server, on_tools_changed=changed.set) as (session, channel):
        with anyio.fail_after(5):
            assert [t.name for t in await session.list_tools()] == ["t"]
            assert _result_text(await session.call_tool("t", {})) == "via sse"
            await changed.wait()
            while not any(m.get("id") == "srv-1" and "result" in m for _, _, m in server.requests):
                await anyio.sleep(0.01)
        assert channel.session_id == "S1"
    methods = [(verb, m.get("method")) for verb, _, m in server.requests]
    assert methods[:2] == [("POST", "initialize"), ("POST", "notifications/initialized")]
    assert ("GET", None) in methods and methods[-1] == ("DELETE", None)
    init_headers = server.requests[0][1]
    assert "mcp-session-id" not in init_headers and "mcp-protocol-version" not in init_headers
    assert "text/event-stream" in init_headers["accept"] and "application/json" in init_headers["accept"]
    for _, headers, _ in server.requests[1:]:
        assert headers["mcp-session-id"] == "S1" and headers["mcp-protocol-version"] == "2025-06-18"


async def test_http_answers_that_give_no_response_fail_their_request() -> None:
    def error_body(r: httpx2.Request, m: dict[str, Any]) -> httpx2.Response:
        return httpx2.Response(400, json={"jsonrpc": "2.0", "id": None, "error": {"code": -32602, "message": "bad args"}})

    cases: list[tuple[Callable[[httpx2.Request, dict[str, Any]], httpx2.Response], str]] = [
        (lambda r, m: httpx2.Response(202), "without answering it .HTTP 202"),
        (error_body, "bad args"),
        (lambda r, m: httpx2.Response(500, text="oops"), "with HTTP 500"),
        (lambda r, m: httpx2.Response(307, headers={"location": "http://elsewhere.test/"}), "redirects to http://elsewhere.test/"),
        (lambda r, m: httpx2.Response(200, text="hello"), "content type 'text/plain'"),
        (lambda r, m: httpx2.Response(200, content=b"", headers={"content-type": "text/event-stream"}), "ended without a response"),
        (lambda r, m: httpx2.Response(200, content=b"x" * 5000, headers={"content-type": "application/json"}), "over 4096 bytes"),
        (lambda r, m: httpx2.Response(200, content=b"data: " + b"x" * 5000 + b"\n\n", headers={"content-type": "text/event-stream"}), "broke"),
    ]
    for answer, expected in cases:
        server = FakeHttpServer({"tools/call": answer})
        async with http_session(server) as (session, channel):
            with anyio.fail_after(5), pytest.raises(RemoteError, match=expected):
                await session.call_tool("t", {})
            assert not channel.closed.is_set()  # one request failed, the session goes on


async def test_http_the_end_of_the_session_or_of_the_server_closes_the_channel() -> None:
    def gone(r: httpx2.Request, m: dict[str, Any]) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused", request=r)

    for answer, note in (
        (lambda r, m: httpx2.Response(404), "the server ended the session (HTTP 404)"),
        (gone, "cannot reach the server: ConnectError: connection refused"),
    ):
        server = FakeHttpServer({"tools/call": answer})
        async with http_session(server) as (session, channel):
            with anyio.fail_after(5):
                with pytest.raises(PeerClosed):
                    await session.call_tool("t", {})
                await session.closed.wait()
            assert channel.closed.is_set() and channel.exit_note() == note


async def test_http_a_server_stream_that_asks_for_no_wait_is_reopened_no_faster_than_once_a_second() -> None:
    """A GET stream that brings a message and ends, asking (``retry: 0``) to be reopened at once,
    is reopened after GET_RETRY_S: a server cannot make the channel reconnect in a loop."""

    def stream(r: httpx2.Request, m: dict[str, Any]) -> httpx2.Response:
        body = b"retry: 0\n\n" + _sse({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}})
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    server = FakeHttpServer({"GET": stream})
    async with http_session(server):
        await anyio.sleep(1.5)
    gets = sum(1 for verb, _, _ in server.requests if verb == "GET")
    assert 1 <= gets <= 2, gets  # opened, reopened once after a second (a loop: hundreds)


def test_the_client_imports_none_of_the_sdk() -> None:
    code = "import sidecar.tools.mcp, sidecar.tools.mcp_transport, sidecar.tools.mcp_http\n"
    assert modules_loaded_by(code, ("mcp", "mcp_types", "pydantic", "pydantic_core", "starlette")) == []


# ---- a raw stdio server through the manager -------------------------------------------------

RAW_SERVER = r'''
import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
print("a banner on stdout, not JSON"); sys.stdout.flush()
listings = 0
for line in sys.stdin:
    m = json.loads(line)
    method, mid = m.get("method"), m.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": "2025-03-26", "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": "raw", "version": "0"}}})
    elif method == "tools/list":
        listings += 1
        name = "first" if listings == 1 else "second"
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": [{"name": name, "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": "srv-ping", "method": "ping"})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "called " + m["params"]["name"]}]}})
    elif mid == "srv-ping":
        sys.stderr.write("ping answered: " + json.dumps(m.get("result")) + "\n"); sys.stderr.flush()
'''


async def test_a_raw_stdio_server_its_pings_and_its_changed_tools(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from protocol.mcp import McpServerUpsertParams
    from sidecar.store import AsyncStore, Store
    from sidecar.tools.mcp import McpManager

    caplog.set_level(logging.INFO, logger="sidecar.children.stderr")
    store = Store(tmp_path)
    try:
        async with McpManager.open(AsyncStore(store)) as manager:
            await manager.upsert_server(McpServerUpsertParams(name="raw", command=sys.executable, args=["-c", RAW_SERVER]))
            with anyio.fail_after(30):
                while [t.name for t in manager.tools()] != ["mcp__raw__first"]:
                    await anyio.sleep(0.02)
                out = await manager.call("raw", "first", {})
                assert out.text == "called first" and not out.is_error
                while [t.name for t in manager.tools()] != ["mcp__raw__second"]:  # list_changed: listed again
                    await anyio.sleep(0.02)
                while "ping answered: {}" not in caplog.text:
                    await anyio.sleep(0.02)
    finally:
        store.close()


async def test_a_stdio_server_speaking_another_version_fails_with_that_reason(tmp_path: Path) -> None:
    from protocol.mcp import McpServerUpsertParams
    from sidecar.store import AsyncStore, Store
    from sidecar.tools.mcp import McpManager

    old = RAW_SERVER.replace('"protocolVersion": "2025-03-26"', '"protocolVersion": "1999-01-01"')
    store = Store(tmp_path)
    try:
        async with McpManager.open(AsyncStore(store)) as manager:
            await manager.upsert_server(McpServerUpsertParams(name="old", command=sys.executable, args=["-c", old]))
            failed = await wait_state(manager, "old", {"failed"})
            assert "the server speaks MCP version '1999-01-01'" in (failed.error or ""), failed.error
    finally:
        store.close()

