"""Raw NDJSON into a serving peer (in memory): every bad input gets the right error and the
peer keeps serving. The same cases run over a real subprocess in test_e2e_foundation.py."""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sidecar_proc import jsonrpc_problem
from wire_edges import edge_line

from protocol import ErrorCode, IdParams, SuccessResult
from sidecar.errors import NotFound
from sidecar.rpc import Handler, JsonRpcPeer, connected_pair

pytestmark = pytest.mark.anyio

SENTINEL = b'{"jsonrpc":"2.0","id":"sentinel","method":"echo","params":{"value":"alive"}}'
SENTINEL_REPLY = {"jsonrpc": "2.0", "id": "sentinel", "result": "alive"}


class EchoParams(msgspec.Struct):
    value: Any = None


async def echo(params: EchoParams) -> Any:
    return params.value


async def get(params: IdParams) -> SuccessResult:
    return SuccessResult(success=True)


async def fail(params: IdParams) -> None:
    raise NotFound(f"session {params.id} not found")


async def crash(params: EchoParams) -> None:
    raise ValueError("secret-token-123 in a traceback")


async def unencodable(params: EchoParams) -> Any:
    return object()


HANDLERS: dict[str, Handler[Any]] = {
    "echo": Handler(EchoParams, echo),
    "get": Handler(IdParams, get),
    "fail": Handler(IdParams, fail),
    "crash": Handler(EchoParams, crash),
    "unencodable": Handler(EchoParams, unencodable),
}


async def exchange(lines: list[bytes], *, max_line_bytes: int = 1 << 20, chunk_size: int = 0) -> list[Any]:
    """Send ``lines`` to a serving peer, close its input, and return every reply it wrote
    (parsed) until its output closed. The peer must have answered the sentinel too.
    ``chunk_size`` > 0 sends the whole input in pieces of that many bytes instead."""
    (server_receive, server_send), (client_receive, client_send) = connected_pair(max_buffer=math.inf)
    raw = bytearray()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def collect() -> None:
                with client_receive:
                    async for chunk in client_receive:
                        raw.extend(chunk)

            tg.start_soon(collect)
            async with JsonRpcPeer(server_receive, server_send, HANDLERS, max_line_bytes=max_line_bytes) as peer:
                async with client_send:
                    data = [line + b"\n" for line in [*lines, SENTINEL]]
                    if chunk_size:
                        whole = b"".join(data)
                        data = [whole[i : i + chunk_size] for i in range(0, len(whole), chunk_size)]
                    for piece in data:
                        await client_send.send(piece)
                await peer.closed.wait()  # all input read; leaving the block answers what is in flight
    assert raw.endswith(b"\n") or not raw
    replies = [json.loads(line) for line in raw.splitlines()]
    for reply in replies:
        assert jsonrpc_problem(reply) is None, reply
    assert SENTINEL_REPLY in replies, "the peer stopped serving"
    replies.remove(SENTINEL_REPLY)
    return replies


def error_of(reply: Any) -> tuple[Any, int]:
    return reply["id"], reply["error"]["code"]


BAD_LINES = [
    pytest.param(b"{not json", (None, ErrorCode.PARSE_ERROR), id="invalid-json"),
    pytest.param(b"\xff\xfe\x00\x01\x80garbage", (None, ErrorCode.PARSE_ERROR), id="binary-garbage"),
    pytest.param(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"value":"\xff"}}', (None, ErrorCode.PARSE_ERROR), id="bad-utf8"),
    pytest.param(b"[" * 5000 + b"]" * 5000, (None, ErrorCode.PARSE_ERROR), id="deep-batch"),
    pytest.param(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":' + b"[" * 5000 + b"]" * 5000 + b"}", (1, ErrorCode.PARSE_ERROR), id="deep-params"),
    pytest.param(b'[{"x":' + b"[" * 5000 + b"]" * 5000 + b"}]", (None, ErrorCode.PARSE_ERROR), id="deep-batch-item"),
    pytest.param(b"[]", (None, ErrorCode.INVALID_REQUEST), id="empty-batch"),
    pytest.param(b'"just a string"', (None, ErrorCode.INVALID_REQUEST), id="scalar"),
    pytest.param(b'{"jsonrpc":"2.0","id":1}', (1, ErrorCode.INVALID_REQUEST), id="no-method"),
    pytest.param(b'{"jsonrpc":"2.0","id":2,"method":5}', (2, ErrorCode.INVALID_REQUEST), id="method-not-string"),
    pytest.param(b'{"jsonrpc":"1.0","id":3,"method":"echo"}', (3, ErrorCode.INVALID_REQUEST), id="wrong-version"),
    pytest.param(b'{"id":4,"method":"echo"}', (4, ErrorCode.INVALID_REQUEST), id="missing-version"),
    pytest.param(b'{"jsonrpc":"2.0","id":{"a":1},"method":"echo"}', (None, ErrorCode.INVALID_REQUEST), id="object-id"),
    pytest.param(b'{"jsonrpc":"2.0","id":true,"method":"echo"}', (None, ErrorCode.INVALID_REQUEST), id="bool-id"),
    pytest.param(b'{"jsonrpc":"2.0","id":5,"method":"nope"}', (5, ErrorCode.METHOD_NOT_FOUND), id="unknown-method"),
    pytest.param(b'{"jsonrpc":"2.0","id":6,"method":"get","params":{"id":6}}', (6, ErrorCode.INVALID_PARAMS), id="wrong-type"),
    pytest.param(b'{"jsonrpc":"2.0","id":7,"method":"get","params":{}}', (7, ErrorCode.INVALID_PARAMS), id="missing-field"),
    pytest.param(b'{"jsonrpc":"2.0","id":8,"method":"get","params":["x"]}', (8, ErrorCode.INVALID_PARAMS), id="positional"),
    pytest.param(b'{"jsonrpc":"2.0","id":9,"method":"fail","params":{"id":"s"}}', (9, ErrorCode.NOT_FOUND), id="app-error"),
    pytest.param(b'{"jsonrpc":"2.0","id":10,"method":"crash"}', (10, ErrorCode.INTERNAL_ERROR), id="crash"),
    pytest.param(b'{"jsonrpc":"2.0","id":11,"method":"unencodable"}', (11, ErrorCode.INTERNAL_ERROR), id="unencodable"),
]


@pytest.mark.parametrize(("line", "expected"), BAD_LINES)
async def test_bad_line_gets_one_error_and_the_peer_keeps_serving(line: bytes, expected: tuple[Any, int]) -> None:
    replies = await exchange([line])
    assert len(replies) == 1, replies
    assert error_of(replies[0]) == expected
    assert "secret" not in json.dumps(replies[0]) and "Traceback" not in json.dumps(replies[0])


async def test_invalid_params_message_names_the_field() -> None:
    wrong_type, missing = await exchange(
        [
            b'{"jsonrpc":"2.0","id":1,"method":"get","params":{"id":6}}',
            b'{"jsonrpc":"2.0","id":2,"method":"get","params":{}}',
        ]
    )
    by_id = {r["id"]: r["error"]["message"] for r in (wrong_type, missing)}
    assert by_id[1] == "invalid params: Expected `str`, got `int` - at `$.id`"
    assert by_id[2] == "invalid params: Object missing required field `id`"


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"   \t \r", id="whitespace"),
        pytest.param(b'{"jsonrpc":"2.0","method":"nope","params":{}}', id="unknown-notification"),
        pytest.param(b'{"jsonrpc":"2.0","method":"get","params":{"id":1}}', id="bad-params-notification"),
        pytest.param(b'{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"gone"}}', id="cancel-unknown-id"),
        pytest.param(b'{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"x":1}}', id="malformed-cancel"),
        pytest.param(b'{"jsonrpc":"2.0","id":99,"result":1}', id="response-to-unknown-id"),
        pytest.param(b'[{"jsonrpc":"2.0","method":"echo"},{"jsonrpc":"2.0","method":"nope"}]', id="notification-batch"),
    ],
)
async def test_inputs_that_get_no_reply(line: bytes) -> None:
    assert await exchange([line]) == []


async def test_batch_mixing_good_and_bad_entries() -> None:
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"value": "a"}},
        {"jsonrpc": "2.0", "method": "echo", "params": {"value": "notification"}},
        {"foo": 1},
        5,
        {"jsonrpc": "2.0", "id": 2, "method": "nope"},
        {"jsonrpc": "2.0", "id": 3, "method": "get", "params": {"id": 1}},
        {"jsonrpc": "2.0", "id": 4, "method": "get", "params": {"id": "x"}},
    ]
    (reply,) = await exchange([json.dumps(batch).encode()])
    assert isinstance(reply, list)
    assert reply[0] == {"jsonrpc": "2.0", "id": 1, "result": "a"}
    assert [error_of(r) for r in reply[1:5]] == [
        (None, ErrorCode.INVALID_REQUEST),
        (None, ErrorCode.INVALID_REQUEST),
        (2, ErrorCode.METHOD_NOT_FOUND),
        (3, ErrorCode.INVALID_PARAMS),
    ]
    assert reply[5] == {"jsonrpc": "2.0", "id": 4, "result": {"success": True}}


async def test_input_fed_one_byte_at_a_time_gets_the_same_replies() -> None:
    lines = [
        b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"value":"\xe4\xbd\xa0\xe5\xa5\xbd"}}',
        b"",
        b'[{"jsonrpc":"2.0","id":2,"method":"get","params":{"id":"x"}},{"jsonrpc":"2.0","id":3,"method":"nope"}]',
        b"{broken",
        b'{"jsonrpc":"2.0","id":4,"method":"fail","params":{"id":"s"}}',
    ]
    whole = await exchange(lines)
    assert len(whole) == 4

    def key(reply: Any) -> str:
        return json.dumps(reply, sort_keys=True)

    for chunk_size in (1, 7, 64):
        assert sorted(map(key, await exchange(lines, chunk_size=chunk_size))) == sorted(map(key, whole))


async def test_oversized_line_is_answered_and_the_next_line_served() -> None:
    big = b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"value":"' + b"x" * 10_000 + b'"}}'
    replies = await exchange([big], max_line_bytes=4096)
    assert len(replies) == 1
    # The id is read from the kept start of the line, so the caller's request settles.
    assert error_of(replies[0]) == (1, ErrorCode.MESSAGE_TOO_LARGE)
    assert str(len(big)) in replies[0]["error"]["message"]


PAD = b'"' + b"x" * 10_000 + b'"'


@pytest.mark.parametrize(
    ("line", "expected_id"),
    [
        pytest.param(b'{"id":"req-\\"7","jsonrpc":"2.0","method":"echo","params":{"value":' + PAD + b"}}",
                     'req-"7', id="string-id-with-escape"),
        pytest.param(b' {"jsonrpc":"2.0", "method":"echo", "id" : -12, "params":{"value":' + PAD + b"}}",
                     -12, id="negative-int-after-method"),
        pytest.param(b'{"jsonrpc":"2.0","method":"echo","params":{"id":5,"value":' + PAD + b'},"id":9}',
                     None, id="nested-id-only-then-id-past-the-head"),
        pytest.param(b'{"jsonrpc":"2.0","method":"echo","params":{"value":' + PAD + b'},"id":9}',
                     None, id="id-past-the-head"),
        pytest.param(b'{"jsonrpc":"2.0","id":1.5,"method":"echo","params":{"value":' + PAD + b"}}",
                     1.5, id="float-id"),
        pytest.param(b'{"jsonrpc":"2.0","id":-2.5e3,"method":"echo","params":{"value":' + PAD + b"}}",
                     -2500.0, id="float-id-exponent"),
        pytest.param(b'{"jsonrpc":"2.0","id":true,"method":"echo","params":{"value":' + PAD + b"}}",
                     None, id="bool-id"),
        pytest.param(b'{"jsonrpc":"2.0","id":' + b"1" * 5000 + b',"method":"echo"}', None, id="id-cut-off"),
        pytest.param(b'[{"jsonrpc":"2.0","id":3,"method":"echo","params":{"value":' + PAD + b"}}]",
                     None, id="batch"),
    ],
)
async def test_oversized_line_echoes_only_a_top_level_id_it_can_read(line: bytes, expected_id: Any) -> None:
    replies = await exchange([line], max_line_bytes=4096)
    assert [error_of(r) for r in replies] == [(expected_id, ErrorCode.MESSAGE_TOO_LARGE)]


async def test_duplicate_in_flight_id_is_rejected() -> None:
    gate = anyio.Event()
    entered = anyio.Event()

    async def block(params: EchoParams) -> Any:
        entered.set()
        await gate.wait()
        return params.value

    (server_receive, server_send), (client_receive, client_send) = connected_pair(max_buffer=math.inf)
    with anyio.fail_after(10), client_receive:
        async with JsonRpcPeer(server_receive, server_send, {"block": Handler(EchoParams, block)}):
            async with client_send:
                await client_send.send(b'{"jsonrpc":"2.0","id":1,"method":"block","params":{"value":"first"}}\n')
                await entered.wait()
                await client_send.send(b'{"jsonrpc":"2.0","id":1,"method":"block","params":{"value":"again"}}\n')
                duplicate = json.loads(await client_receive.receive())
                gate.set()
        first = json.loads(await client_receive.receive())
    assert error_of(duplicate) == (1, ErrorCode.INVALID_REQUEST)
    assert first == {"jsonrpc": "2.0", "id": 1, "result": "first"}


# ---- property: arbitrary input never kills the peer, every reply is JSON-RPC 2.0 ---------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
ids = st.none() | st.integers(-3, 3) | st.sampled_from(["a", "sentinel", ""]) | st.booleans() | st.floats() | json_values
methods = st.sampled_from(["echo", "get", "fail", "crash", "unencodable", "nope", "$/cancelRequest", ""]) | json_values


@st.composite
def rpc_like(draw: st.DrawFn) -> Any:
    message: dict[str, Any] = {}
    for key, values in (
        ("jsonrpc", st.sampled_from(["2.0", "1.0", 2.0]) | st.none()),
        ("id", ids),
        ("method", methods),
        ("params", st.fixed_dictionaries({}, optional={"value": json_values, "id": ids}) | json_values),
        ("result", json_values),
        ("error", json_values),
    ):
        if draw(st.booleans()) if key not in ("jsonrpc", "method") else draw(st.integers(0, 9)) > 0:
            message[key] = draw(values)
    return message


def as_line(value: Any) -> bytes:
    return json.dumps(value).encode()


lines = st.one_of(
    st.binary(max_size=120),
    st.text(max_size=60).map(str.encode),
    json_values.map(as_line),
    rpc_like().map(as_line),
    st.lists(rpc_like() | json_values, max_size=4).map(as_line),
).map(lambda b: b.replace(b"\n", b" "))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(lines, max_size=12))
async def test_arbitrary_lines_never_kill_the_peer(batch: list[bytes]) -> None:
    replies = await exchange(batch, max_line_bytes=4096)
    for reply in replies:
        for item in reply if isinstance(reply, list) else [reply]:
            assert "method" not in item  # the peer only ever answers


EDGE_METHODS = ["echo", "get", "fail", "crash", "unencodable", "nope"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(edge_line(EDGE_METHODS), min_size=1, max_size=10))
async def test_edge_values_get_exactly_one_reply_each_with_their_id(batch: list[bytes]) -> None:
    """int64 edges, nesting at and past the limits, long strings, float and huge ids: each
    request is answered once, with the id it was sent with, and the peer keeps serving."""
    replies = await exchange(batch, max_line_bytes=1 << 20)
    sent_ids = sorted(json.dumps(json.loads(line)["id"]) if _parses(line) else "?" for line in batch)
    assert len(replies) == len(batch), replies
    got_ids = sorted(json.dumps(r["id"]) for r in replies)
    readable = [i for i in sent_ids if i != "?"]
    assert all(i in got_ids for i in readable), (sent_ids, got_ids)
    for reply in replies:
        if "error" in reply:
            assert len(reply["error"]["message"]) <= 2000


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


async def test_a_bug_while_routing_a_line_is_answered_and_reading_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import sidecar.rpc.parse as parse_module

    real_classify = parse_module.classify

    def buggy_classify(envelope: Any) -> Any:
        if envelope.method == "trigger-bug":
            raise KeyError("simulated bug")
        return real_classify(envelope)

    monkeypatch.setattr(parse_module, "classify", buggy_classify)
    replies = await exchange([b'{"jsonrpc":"2.0","id":1,"method":"trigger-bug"}'])
    assert [error_of(r) for r in replies] == [(None, ErrorCode.INTERNAL_ERROR)]
