"""Bounded input over a real sidecar subprocess: JSON nesting, the int64 range, string
lengths, numeric and huge ids, error codes that say whose problem it is, and stored values
that can never again kill the process (each case below was once a crash, a -32603 or a
-32007).

Deep JSON is written as text here (never built and encoded as nested Python values), so the
test itself never hits a recursion limit whatever the depth.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest

from chat_helpers import configure_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MARK = "@@DEEP@@"


def nested(depth: int, leaf: str = "1") -> str:
    """``{"a":{"a":...leaf...}}``, ``depth`` objects deep, as JSON text."""
    return '{"a":' * depth + leaf + "}" * depth


def nested_list(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def with_deep(params: Any, text: str) -> str:
    """``params`` as JSON text with the string MARK replaced by the raw JSON ``text``."""
    encoded = json.dumps(params, separators=(",", ":"))
    assert encoded.count(f'"{MARK}"') == 1
    return encoded.replace(f'"{MARK}"', text)


async def call_text(proc: SidecarProcess, method: str, params_text: str, request_id: Any = None) -> dict[str, Any]:
    """Send a request whose params are the given JSON text; its reply (result or error)."""
    request_id = proc.new_id() if request_id is None else request_id
    line = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"method":"{method}","params":{params_text}}}'
    await proc.send_line(line)
    reply: dict[str, Any] = await proc.next_matching(  # a reused id: each of its answers in turn
        f"reply:{request_id!r}",
        lambda m: isinstance(m, dict) and "method" not in m and m.get("id") == request_id
        and type(m.get("id")) is type(request_id),
        timeout=20,
    )
    return reply


def error_of(reply: dict[str, Any]) -> tuple[int, str]:
    assert "error" in reply, reply
    return reply["error"]["code"], reply["error"]["message"]


async def still_serving(proc: SidecarProcess, session_id: str | None = None) -> None:
    """The reads that a poisoned store used to kill all answer."""
    listed = await proc.call("chat:session:list", {"limit": 500})
    assert isinstance(listed["sessions"], list)
    assert isinstance(await proc.call("provider:list"), list)
    if session_id is not None:
        await proc.call("chat:messages:get", {"sessionId": session_id})
        await proc.call("chat:session:export", {"id": session_id})


# ---- nesting depth -----------------------------------------------------------------------


@pytest.mark.sidecar_subprocess  # nesting near Python's recursion limit: the server's own stack, as in a process
async def test_deep_channel_meta_is_refused_naming_the_field_and_nothing_is_poisoned(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        code, message = error_of(await call_text(proc, "chat:session:create", with_deep({"channelMeta": MARK}, nested(975))))
        assert code == -32602 and "`$.channelMeta`" in message and "64" in message
        # the limit itself is accepted, one more level is not
        ok = await call_text(proc, "chat:session:create", with_deep({"channelMeta": MARK}, nested(64)))
        session = ok["result"]
        assert json.dumps(session["channelMeta"], separators=(",", ":")) == nested(64)
        code, message = error_of(await call_text(proc, "chat:session:create", with_deep({"channelMeta": MARK}, nested(65))))
        assert code == -32602 and "`$.channelMeta`" in message
        code, message = error_of(await call_text(
            proc, "chat:session:update", with_deep({"id": session["id"], "updates": {"channelMeta": MARK}}, nested(200))
        ))
        assert code == -32602 and "`$.updates.channelMeta`" in message
        await still_serving(proc, session["id"])
        await proc.close()
    async with spawn_sidecar(tmp_path) as proc:  # a restart on the same data dir
        await still_serving(proc, session["id"])
        listed = await proc.call("chat:session:list", {})
        assert [s["id"] for s in listed["sessions"]] == [session["id"]]
        await proc.close()
    assert "Traceback" not in proc.stderr_text()


@pytest.mark.sidecar_subprocess  # nesting near Python's recursion limit: the server's own stack, as in a process
async def test_deep_provider_body_and_tool_inputs_are_refused(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        provider = {"name": "p", "type": "openai-compat", "baseUrl": "http://127.0.0.1:9/v1", "body": MARK}
        code, message = error_of(await call_text(proc, "provider:upsert", with_deep(provider, nested(975))))
        assert code == -32602 and "`$.body`" in message
        code, message = error_of(await call_text(proc, "provider:upsert", with_deep(provider, '{"x":' + nested_list(300) + "}")))
        assert code == -32602 and "`$.body`" in message
        stored = (await call_text(proc, "provider:upsert", with_deep(provider, nested(64))))["result"]
        assert [p["id"] for p in await proc.call("provider:list")] == [stored["id"]]

        session = await proc.call("chat:session:create", {})
        tool_use = {"type": "tool_use", "id": "call-1", "name": "t", "input": MARK}
        code, message = error_of(await call_text(
            proc, "chat:send", with_deep({"sessionId": session["id"], "input": {"content": [tool_use]}}, nested(500))
        ))
        # a user message takes no tool_use part at all (refused by its type, deep or not)
        assert code == -32602 and "`$.input.content[0]" in message

        exported = await proc.call("chat:session:export", {"id": session["id"]})
        message_row = {
            "id": "0190a000-0000-7000-8000-000000000001", "sessionId": session["id"], "role": "assistant",
            "textContent": "hi", "status": "completed", "createdAt": 1, "updatedAt": 1,
        }
        for field, value, deep, where in (
            ("acpParts", MARK, nested_list(700), "`$.messages[0].acpParts`"),
            ("parts", [tool_use], nested(700), "`$.messages[0].parts[0].input`"),
            ("parts", [{"type": "step_finish", "stepId": "s", "result": MARK}], nested(100), "`$.messages[0].parts[0].result`"),
            ("parts", [{"type": "diff", "filePath": "f", "hunks": MARK}], nested_list(65), "`$.messages[0].parts[0].hunks`"),
        ):
            params = {"session": exported["session"], "messages": [{**message_row, field: value}], "replace": True}
            code, message = error_of(await call_text(proc, "chat:session:import", with_deep(params, deep)))
            assert code == -32602 and where in message, (field, message)
        await still_serving(proc, session["id"])
        await proc.close()


@pytest.mark.parametrize("request_id", [17, "deep-request", 7.5])
async def test_params_nested_past_the_decoder_get_a_parse_error_with_their_id(tmp_path: Path, request_id: Any) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        for depth in (1_000, 5_000, 100_000):
            reply = await call_text(proc, "chat:session:create", with_deep({"channelMeta": MARK}, nested(depth)), request_id)
            assert reply["id"] == request_id and type(reply["id"]) is type(request_id)
            code, _ = error_of(reply)
            assert code in (-32700, -32602)
            if depth > 1_000:
                assert code == -32700
        await still_serving(proc)
        await proc.close()
    proc.assert_all_jsonrpc()


# ---- integers ----------------------------------------------------------------------------


async def test_integers_past_int64_are_invalid_params_and_the_edges_are_stored(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        for params, where in (
            ({"offset": 2**63}, "`$.offset`"),
            ({"offset": -1}, "`$.offset`"),
            ({"limit": 1001}, "`$.limit`"),
            ({"limit": 10**30}, "`$.limit`"),
        ):
            with pytest.raises(CallError) as err:
                await proc.call("tool:audit:list", params)
            assert err.value.code == -32602 and where in err.value.message, err.value.message
        assert await proc.call("tool:audit:list", {"offset": 10_000_000, "limit": 1000}) == []
        with pytest.raises(CallError) as err:
            await proc.call("chat:session:list", {"offset": 10_000_001})
        assert err.value.code == -32602

        session = await proc.call("chat:session:create", {"title": "edges"})
        exported = await proc.call("chat:session:export", {"id": session["id"]})
        message = {
            "id": "0190a000-0000-7000-8000-000000000002", "sessionId": session["id"], "role": "assistant",
            "textContent": "hi", "status": "completed", "createdAt": 5, "updatedAt": 5,
        }
        for patch, where in (
            ({"session": {"totalTokens": 2**63}}, "`$.session.totalTokens`"),
            ({"session": {"createdAt": INT64_MIN - 1}}, "`$.session.createdAt`"),
            ({"message": {"createdAt": 2**63}}, "`$.messages[0].createdAt`"),
            ({"message": {"latencyMs": 2**64}}, "`$.messages[0].latencyMs`"),
            ({"message": {"usage": {"inputTokens": 2**63}}}, "`$.messages[0].usage.inputTokens`"),
        ):
            params = {
                "session": {**exported["session"], **patch.get("session", {})},
                "messages": [{**message, **patch.get("message", {})}],
                "replace": True,
            }
            with pytest.raises(CallError) as err:
                await proc.call("chat:session:import", params)
            assert err.value.code == -32602 and where in err.value.message, (where, err.value.message)

        edge_session = {**exported["session"], "totalTokens": INT64_MAX, "messageCount": 0}
        edge_message = {**message, "createdAt": INT64_MAX, "updatedAt": INT64_MIN, "latencyMs": INT64_MAX,
                        "usage": {"inputTokens": INT64_MAX, "outputTokens": 0}}
        stored = await proc.call("chat:session:import", {"session": edge_session, "messages": [edge_message], "replace": True})
        assert stored["totalTokens"] == INT64_MAX
        (got,) = await proc.call("chat:messages:get", {"sessionId": session["id"], "options": {"allBranches": True}})
        assert got["createdAt"] == INT64_MAX and got["updatedAt"] == INT64_MIN and got["latencyMs"] == INT64_MAX
        assert got["usage"]["inputTokens"] == INT64_MAX
        await still_serving(proc, session["id"])
        await proc.close()
    assert "OverflowError" not in proc.stderr_text()


# ---- strings -----------------------------------------------------------------------------


async def test_long_search_is_invalid_params_and_the_maximum_works(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await proc.call("chat:session:create", {"title": "a" * 1000})
        with pytest.raises(CallError) as err:
            await proc.call("chat:session:list", {"search": "a" * 49_999})
        assert err.value.code == -32602 and "`$.search`" in err.value.message
        found = await proc.call("chat:session:list", {"search": "a" * 1000})
        assert found["total"] == 1
        # the longest search of characters that LIKE escapes, or that take 3 bytes each
        for search in ("%_\\" * 333, "漢" * 1000):
            assert (await proc.call("chat:session:list", {"search": search}))["total"] == 0
        with pytest.raises(CallError) as err:
            await proc.call("chat:messages:search", {"query": "q" * 1001})
        assert err.value.code == -32602 and "`$.query`" in err.value.message
        assert await proc.call("chat:messages:search", {"query": "漢字 " * 333 + "a"}) == []
        for method, params, where in (
            ("chat:session:get", {"id": "x" * 257}, "`$.id`"),
            ("chat:session:create", {"title": "t" * 1001}, "`$.title`"),
            ("chat:messages:get", {"sessionId": "s" * 300}, "`$.sessionId`"),
            ("provider:setDefault", {"providerId": "p" * 257, "modelId": "m"}, "`$.providerId`"),
        ):
            with pytest.raises(CallError) as err:
                await proc.call(method, params)
            assert err.value.code == -32602 and where in err.value.message, (method, err.value.message)
        await proc.close()


# ---- ids ---------------------------------------------------------------------------------


async def test_numeric_ids_are_answered_as_given(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        for raw_id in ("7.0", "1.5", "-0.25", "1e3", "123456789012345678901234567890", "-9223372036854775809"):
            await proc.send_line(f'{{"jsonrpc":"2.0","id":{raw_id},"method":"sidecar:initialize"}}')
            expected = json.loads(raw_id)
            reply = await proc.response(expected)
            assert "result" in reply and reply["id"] == expected, reply
        # the raw line says 7.0, not 7 (the same number, as sent)
        assert any(line.startswith(b'{"jsonrpc":"2.0","id":7.0,') for line in proc.lines)
        # a float id in a batch, and cancelling by a float id
        await proc.send_line('[{"jsonrpc":"2.0","id":2.5,"method":"sidecar:initialize"}]')
        (item,) = await proc.next_batch_reply()
        assert item["id"] == 2.5 and "result" in item
        await proc.notify("$/cancelRequest", {"id": 99.5})
        await proc.call("sidecar:initialize")
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_huge_ids_are_never_echoed_in_error_messages(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await proc.call("settings:get", {})  # the services are open (a store method would not wait for them)
        before = len(proc.lines)
        with pytest.raises(CallError) as err:
            await proc.call("chat:session:get", {"id": "x" * 10_000_000}, timeout=30)
        assert err.value.code == -32602
        assert max(len(line) for line in proc.lines[before:]) < 4096

        # a request id of 5 MB is echoed once (it must be, to settle the request), nothing more
        big_id = "r" * 5_000_000
        before = len(proc.lines)
        reply = await call_text(proc, "chat:session:get", json.dumps({"id": "nope"}), request_id=big_id)
        assert reply["id"] == big_id and reply["error"]["code"] == -32001
        assert len(proc.lines[before]) < len(big_id) + 4096

        # a not-found id at the maximum length is named whole
        with pytest.raises(CallError) as err:
            await proc.call("chat:session:get", {"id": "y" * 256})
        assert err.value.code == -32001 and "y" * 256 in err.value.message
        await proc.close()


# ---- error codes: whose problem it is ------------------------------------------------------


class _GatedProvider:
    """An OpenAI-compatible endpoint on loopback whose answers wait for ``release``."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.release = threading.Event()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                gate.received.set()
                gate.release.wait(30)
                if body.get("stream"):
                    payload = (
                        b'data: {"choices":[{"index":0,"delta":{"content":"SUMMARY"}}]}\n\n'
                        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
                    )
                    content_type = "text/event-stream"
                else:
                    payload = json.dumps({
                        "id": "c", "object": "chat.completion", "model": body.get("model", "m"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "SUMMARY"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                    }).encode()
                    content_type = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@contextmanager
def gated_provider() -> Iterator[_GatedProvider]:
    gate = _GatedProvider()
    thread = threading.Thread(target=gate.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield gate
    finally:
        gate.release.set()
        gate.server.shutdown()
        gate.server.server_close()
        thread.join(10)


async def test_compaction_racing_a_delete_is_not_found_not_a_store_error(tmp_path: Path) -> None:
    with gated_provider() as gate:
        async with spawn_sidecar(tmp_path) as proc:
            await configure_provider(proc, gate.base_url)
            session = await proc.call("chat:session:create", {"title": "long"})
            history, parent = [], None
            for i in range(10):
                mid = f"0190a000-0000-7000-8000-{i:012d}"
                history.append({
                    "id": mid, "sessionId": session["id"], "parentId": parent,
                    "role": "user" if i % 2 == 0 else "assistant", "textContent": f"msg{i} " + "lorem " * 60,
                    "status": "completed", "createdAt": 1_700_000_000_000 + i, "updatedAt": 1_700_000_000_000 + i,
                })
                parent = mid
            exported = await proc.call("chat:session:export", {"id": session["id"]})
            exported["session"]["activeLeafId"] = history[-1]["id"]
            await proc.call("chat:session:import", {"session": exported["session"], "messages": history, "replace": True})

            compact_id = await proc.request("chat:context:compact", {"sessionId": session["id"], "targetTokens": 400})
            with anyio.fail_after(20):
                assert await anyio.to_thread.run_sync(gate.received.wait, 20)  # the summary call is in flight
            assert await proc.call("chat:session:delete", {"id": session["id"]}) == {"success": True}
            gate.release.set()
            reply = await proc.response(compact_id, timeout=20)
            assert reply["error"]["code"] == -32001, reply
            assert (await proc.call("chat:session:list", {}))["total"] == 0
            await proc.close()
    assert "Traceback" not in proc.stderr_text()


# ---- values stored before the bounds existed ------------------------------------------------


async def test_deep_values_already_in_the_database_are_served_row_by_row(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        poisoned = await proc.call("chat:session:create", {"title": "poisoned"})
        healthy = await proc.call("chat:session:create", {"title": "healthy", "channelMeta": {"k": [1, 2]}})
        kept = await proc.call("chat:session:create", {"title": "deep but servable"})
        provider = await proc.call("provider:upsert", {"name": "p", "type": "openai-compat", "baseUrl": "http://127.0.0.1:9/v1"})
        exported = await proc.call("chat:session:export", {"id": poisoned["id"]})
        message = {
            "id": "0190a000-0000-7000-8000-000000000003", "sessionId": poisoned["id"], "role": "assistant",
            "textContent": "the text survives", "status": "completed", "createdAt": 1, "updatedAt": 1,
            "parts": [{"type": "text", "text": "the text survives"}, {"type": "tool_use", "id": "c", "name": "t", "input": {}}],
            "acpParts": [{"sessionUpdate": "agent_message_chunk"}],
        }
        await proc.call("chat:session:import", {"session": exported["session"], "messages": [message], "replace": True})
        await proc.close()

    # What an older build let in, written straight into the file.
    db = apsw.Connection(str(tmp_path / "chat.db"))
    db.execute("UPDATE sessions_v2 SET channel_meta = ? WHERE id = ?", (nested(975), poisoned["id"]))
    db.execute("UPDATE sessions_v2 SET channel_meta = ? WHERE id = ?", (nested(256), kept["id"]))
    deep_parts = '[{"type":"text","text":"the text survives"},{"type":"tool_use","id":"c","name":"t","input":' + nested(980) + "}]"
    db.execute("UPDATE messages_v2 SET parts = ?, acp_parts = ? WHERE id = ?", (deep_parts, "[" + nested(990) + "]", message["id"]))
    db.execute("UPDATE providers SET body = ? WHERE id = ?", (nested(975), provider["id"]))
    db.close()

    for _ in range(2):  # and again after a restart
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            listed = {s["id"]: s for s in (await proc.call("chat:session:list", {}))["sessions"]}
            assert set(listed) == {poisoned["id"], healthy["id"], kept["id"]}
            assert listed[poisoned["id"]]["channelMeta"] is None  # the broken field, not the row
            assert listed[healthy["id"]]["channelMeta"] == {"k": [1, 2]}
            assert json.dumps(listed[kept["id"]]["channelMeta"], separators=(",", ":")) == nested(256)
            assert (await proc.call("chat:session:get", {"id": poisoned["id"]}))["title"] == "poisoned"
            (got,) = await proc.call("chat:messages:get", {"sessionId": poisoned["id"]})
            assert got["textContent"] == "the text survives" and got["parts"] is None and got["acpParts"] is None
            exported = await proc.call("chat:session:export", {"id": poisoned["id"]})
            assert [m["id"] for m in exported["messages"]] == [message["id"]]
            (listed_provider,) = await proc.call("provider:list")
            assert listed_provider["id"] == provider["id"] and listed_provider["body"] == {}
            await proc.close()
        log = proc.stderr_text()
        assert f"stored channel_meta of {poisoned['id']}" in log and "served without it" in log
        assert "Traceback" not in log
