"""The wire bounds in process: every free-form field of every params type is depth-checked
(found from the types, so a new field is covered the moment it exists), depth measured the
same on values and on text, SQLite errors mapped by whose problem they are, error replies
bounded, and encoding that can never end a peer."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import METHODS, ErrorCode
from protocol.limits import MAX_JSON_DEPTH
from sidecar.errors import InvalidParams, NotFound, RpcError, StoreError, excerpt
from sidecar.jsondepth import json_text_too_deep, json_too_deep
from sidecar.rpc import Handler, JsonRpcPeer, connected_pair
from sidecar.rpc.dispatch import MAX_ERROR_DATA_BYTES, MAX_ERROR_MESSAGE_CHARS
from sidecar.store.db import Database
from wire_edges import MARK, deep_text, document, expected_path, free_paths

pytestmark = pytest.mark.anyio



# ---- every free-form field of every params type ------------------------------------------


CASES = [
    pytest.param(method, steps, leaf, id=f"{method}:{expected_path(steps)}")
    for method, spec in sorted(METHODS.items())
    for steps, leaf in free_paths(mi.type_info(spec.params))
]


def test_the_free_form_fields_found_include_the_known_ones() -> None:
    found = {case.id for case in CASES}
    for expected in (
        "chat:session:create:$.channelMeta",
        "chat:session:update:$.updates.channelMeta",
        "provider:upsert:$.body",
        "chat:session:import:$.session.channelMeta",
        "chat:session:import:$.messages[0].acpParts",
        "chat:session:import:$.messages[0].parts[0].input",
        "chat:session:import:$.messages[0].parts[0].hunks",
        "chat:session:import:$.messages[0].parts[0].result",
    ):
        assert expected in found, sorted(found)


@pytest.mark.parametrize(("method", "steps", "leaf"), CASES)
def test_every_free_form_field_is_bounded_and_named(method: str, steps: Any, leaf: Any) -> None:
    handler = Handler(METHODS[method].params, _never)
    where = f"`{expected_path(steps)}`"
    text = json.dumps(document(steps))
    for depth, refused in ((1, False), (MAX_JSON_DEPTH, False), (MAX_JSON_DEPTH + 1, True), (300, True), (3000, True)):
        raw = msgspec.Raw(text.replace(f'"{MARK}"', deep_text(leaf, depth)).encode())
        if not refused:
            handler.decode_params(raw)
            continue
        with pytest.raises(InvalidParams) as err:
            handler.decode_params(raw)
        assert f"nested deeper than {MAX_JSON_DEPTH} levels - at {where}" in err.value.message, (depth, err.value.message)


async def _never(params: Any) -> None:
    raise AssertionError("not called")


def test_a_params_type_without_free_form_fields_is_never_walked() -> None:
    assert not Handler(METHODS["chat:session:get"].params, _never).depth.needed
    assert Handler(METHODS["chat:session:create"].params, _never).depth.needed


# ---- depth on values and on text agree ---------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=3), inner, max_size=3),
    max_leaves=30,
)


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(0, 8))
def test_depth_on_values_and_on_text_agree(value: Any, limit: int) -> None:
    expected = depth_of(value) > limit
    assert json_too_deep(value, limit) is expected
    assert json_text_too_deep(json.dumps(value), limit) is expected


def test_text_depth_ignores_brackets_in_strings_and_handles_huge_depths() -> None:
    assert not json_text_too_deep(json.dumps({"s": "[{" * 10_000, "t": ['\\"[[[']}), 3)
    assert json_text_too_deep("[" * 100_000 + "]" * 100_000, 64)
    assert not json_too_deep(1, 0) and json_too_deep([], 0)


def test_excerpt_keeps_both_ends_and_says_how_much_is_left_out() -> None:
    text = "start-" + "x" * 1_000_000 + "-end"
    short = excerpt(text)
    assert len(short) <= 200 and short.startswith("start-") and short.endswith("-end")
    assert "characters]" in short and excerpt("small") == "small"


# ---- SQLite errors by whose problem they are ----------------------------------------------


def test_store_errors_say_whose_problem_it_is(tmp_path: Path) -> None:
    db = Database(tmp_path / "t.db")
    try:
        with db.write() as conn:
            conn.execute(
                "CREATE TABLE p(id TEXT PRIMARY KEY, n INTEGER NOT NULL);"
                " CREATE TABLE c(p TEXT REFERENCES p(id), v TEXT CHECK (length(v) < 5))"
            )
            conn.execute("INSERT INTO p VALUES ('a', 1)")

        def code_of(sql: str, args: tuple[Any, ...] = ()) -> tuple[ErrorCode, str]:
            with pytest.raises(StoreError) as err:
                with db.write() as conn:
                    conn.execute(sql, args)
            assert not isinstance(err.value, NotFound) or err.value.code == ErrorCode.NOT_FOUND
            return err.value.code, err.value.message

        assert code_of("INSERT INTO c VALUES ('gone', 'v')")[0] == ErrorCode.NOT_FOUND
        assert code_of("INSERT INTO p VALUES ('a', 2)")[0] == ErrorCode.BAD_STATE
        assert code_of("INSERT INTO p VALUES ('b', NULL)")[0] == ErrorCode.INVALID_PARAMS
        assert code_of("INSERT INTO c VALUES ('a', 'toolong')")[0] == ErrorCode.INVALID_PARAMS
        assert code_of("SELECT ? LIKE ?", ("a", "%" + "a" * 60_000 + "%"))[0] == ErrorCode.INVALID_PARAMS
        assert code_of("SELECT nonsense FROM nowhere")[0] == ErrorCode.STORE_ERROR
        with pytest.raises(InvalidParams):
            with db.write() as conn:
                conn.execute("INSERT INTO p VALUES ('z', ?)", (2**63,))
        with pytest.raises(InvalidParams):
            with db.read() as conn:
                conn.execute("SELECT ?", (-(2**63) - 1,)).fetchall()
        with db.read() as conn:  # nothing of the failed writes was kept
            assert conn.execute("SELECT id FROM p ORDER BY id").fetchall() == [("a",)]
    finally:
        db.close()


def test_a_failed_database_is_still_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError) as err:
        db = Database(path)
        with db.read() as conn:
            conn.execute("SELECT * FROM sqlite_master").fetchall()
    assert err.value.code == ErrorCode.STORE_ERROR


# ---- replies and events: bounded, and never fatal ------------------------------------------


class EchoParams(msgspec.Struct):
    value: Any = None


async def _serve(handlers: dict[str, Handler[Any]], lines: list[bytes]) -> list[Any]:
    (server_receive, server_send), (client_receive, client_send) = connected_pair(max_buffer=math.inf)
    raw = bytearray()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:

            async def collect() -> None:
                with client_receive:
                    async for chunk in client_receive:
                        raw.extend(chunk)

            tg.start_soon(collect)
            async with JsonRpcPeer(server_receive, server_send, handlers) as peer:
                async with client_send:
                    for line in lines:
                        await client_send.send(line + b"\n")
                await peer.closed.wait()
    return [json.loads(line) for line in raw.splitlines()]


def _deep_python(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def test_unencodable_results_and_events_never_end_the_peer(caplog: pytest.LogCaptureFixture) -> None:
    peers: list[JsonRpcPeer] = []

    async def deep_result(params: EchoParams) -> Any:
        return _deep_python(50_000)

    async def deep_event(params: EchoParams) -> str:
        await peers[0].notify("chat:stream", {"deep": _deep_python(50_000)})
        await peers[0].notify("chat:stream", {"fine": True})
        return "sent"

    async def deep_request(params: EchoParams) -> str:
        try:
            await peers[0].request("anything", {"deep": _deep_python(50_000)}, timeout=5)
        except RpcError as exc:
            return f"refused: {exc.message}"
        return "sent?"

    handlers = {
        "deep_result": Handler(EchoParams, deep_result),
        "deep_event": Handler(EchoParams, deep_event),
        "deep_request": Handler(EchoParams, deep_request),
        "echo": Handler(EchoParams, _echo),
    }
    (server_receive, server_send), (client_receive, client_send) = connected_pair(max_buffer=math.inf)
    raw = bytearray()
    caplog.set_level(logging.ERROR)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:

            async def collect() -> None:
                with client_receive:
                    async for chunk in client_receive:
                        raw.extend(chunk)

            tg.start_soon(collect)
            async with JsonRpcPeer(server_receive, server_send, handlers) as peer:
                peers.append(peer)
                async with client_send:
                    for i, method in enumerate(["deep_result", "deep_event", "deep_request", "echo"]):
                        await client_send.send(
                            json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": {"value": "ok"}}).encode() + b"\n"
                        )
                await peer.closed.wait()
    replies = {m["id"]: m for m in (json.loads(line) for line in raw.splitlines()) if "id" in m}
    events = [m for m in (json.loads(line) for line in raw.splitlines()) if m.get("method") == "chat:stream"]
    assert replies[0]["error"]["code"] == ErrorCode.INTERNAL_ERROR
    assert replies[1]["result"] == "sent" and events == [{"jsonrpc": "2.0", "method": "chat:stream", "params": {"fine": True}}]
    assert replies[2]["result"].startswith("refused:")
    assert replies[3]["result"] == "ok"
    assert "could not be encoded" in caplog.text


async def _echo(params: EchoParams) -> Any:
    return params.value


async def test_error_messages_and_data_are_bounded() -> None:
    huge = "z" * 10_000_000

    async def missing(params: EchoParams) -> None:
        raise NotFound(f"session {huge!r} not found", data={"sessionId": huge, "n": 1})

    async def odd_data(params: EchoParams) -> None:
        raise StoreError("odd", data=object())

    replies = await _serve(
        {"missing": Handler(EchoParams, missing), "odd": Handler(EchoParams, odd_data)},
        [b'{"jsonrpc":"2.0","id":1,"method":"missing"}', b'{"jsonrpc":"2.0","id":2,"method":"odd"}'],
    )
    by_id = {r["id"]: r["error"] for r in replies}
    error = by_id[1]
    assert error["code"] == ErrorCode.NOT_FOUND
    assert len(error["message"]) <= MAX_ERROR_MESSAGE_CHARS and error["message"].endswith("' not found")
    assert len(json.dumps(error["data"])) <= MAX_ERROR_DATA_BYTES and error["data"]["n"] == 1
    assert error["data"]["sessionId"].startswith("zzz") and "characters]" in error["data"]["sessionId"]
    assert by_id[2] == {"code": ErrorCode.STORE_ERROR, "message": "odd"}


async def test_a_deep_response_to_our_request_fails_that_request() -> None:
    (a_receive, a_send), (b_receive, b_send) = connected_pair(max_buffer=math.inf)
    with anyio.fail_after(20):
        async with JsonRpcPeer(a_receive, a_send, name="client") as client:
            async with anyio.create_task_group() as tg:

                async def answer_deeply() -> None:
                    line = await b_receive.receive()
                    request = json.loads(line)
                    deep = "[" * 100_000 + "]" * 100_000
                    await b_send.send(f'{{"jsonrpc":"2.0","id":{request["id"]},"result":{deep}}}\n'.encode())

                tg.start_soon(answer_deeply)
                with pytest.raises(RpcError) as err:
                    await client.request("ask", {}, timeout=10)
                assert "nesting too deep" in err.value.message
            await b_send.aclose()
        await b_receive.aclose()


def test_tool_arguments_too_deep_to_decode_are_an_error_the_model_sees() -> None:
    from sidecar.tools.registry import ToolRegistry
    from sidecar.tools.workspace import workspace_tools

    registry = ToolRegistry(workspace_tools(5.0))
    checked = registry.check("workspace_read_file", '{"path":' + "[" * 50_000 + "]" * 50_000 + "}")
    assert checked.error is not None and "not valid JSON" in checked.error


def test_model_tool_arguments_nested_too_deep_are_kept_as_raw_text() -> None:
    from sidecar.engine.reply import ReplyBuilder

    reply = ReplyBuilder()
    fine = '{"a":' * 10 + "1" + "}" * 10
    too_deep = '{"a":' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1)
    undecodable = '{"a":' * 50_000 + "1" + "}" * 50_000
    for i, arguments in enumerate((fine, too_deep, undecodable)):
        reply.add_tool_call(f"c{i}", "t", arguments)
    inputs = [p.input for p in reply.parts]  # type: ignore[union-attr]
    assert inputs[0] == json.loads(fine)
    assert inputs[1] == {"_raw": too_deep} and inputs[2] == {"_raw": undecodable}
    assert [c.arguments for c in reply.tool_calls] == [fine, too_deep, undecodable]


def test_a_closed_store_is_busy_not_a_failed_database(tmp_path: Path) -> None:
    db = Database(tmp_path / "c.db")
    db.close()
    with pytest.raises(StoreError) as err:
        with db.read():
            pass
    assert err.value.code == ErrorCode.BUSY


# ---- the envelope of a deep message, whatever the caller's stack -------------------------


def _deep_request(depth: int) -> bytes:
    params = '{"channelMeta":' + '{"a":' * depth + "1" + "}" * depth + "}"
    return f'{{"jsonrpc":"2.0","id":5,"method":"chat:session:create","params":{params}}}'.encode()


def _parse_at_stack_depth(frames: int, line: bytes) -> Any:
    from sidecar.rpc.parse import parse_line

    if frames:
        return _parse_at_stack_depth(frames - 1, line)
    return parse_line(line)


@pytest.mark.parametrize("frames", [0, 200, 600])
def test_a_deep_message_is_read_the_same_however_deep_the_callers_stack(frames: int) -> None:
    from sidecar.rpc.messages import Incoming
    from sidecar.rpc.parse import ENVELOPE_DEPTH, TOO_DEEP, Unreadable

    limit = sys.getrecursionlimit()
    read = _parse_at_stack_depth(frames, _deep_request(975))
    assert isinstance(read, Incoming) and read.envelope.method == "chat:session:create"
    assert read.envelope.params is not None and bytes(read.envelope.params).count(b"{") == 976
    refused = _parse_at_stack_depth(frames, _deep_request(ENVELOPE_DEPTH + 1))
    assert isinstance(refused, Unreadable) and refused.message == TOO_DEEP
    assert b'"id":5' in refused.head
    batch = _parse_at_stack_depth(frames, b"[" + _deep_request(975) + b"," + _deep_request(1) + b"]")
    assert isinstance(batch, list) and all(isinstance(item, Incoming) for item in batch) and len(batch) == 2
    assert sys.getrecursionlimit() == limit
