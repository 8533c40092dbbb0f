"""JsonRpcPeer as client and server: two peers connected over memory streams."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest

from protocol import ErrorCode, IdParams, SuccessResult
from sidecar.errors import NotFound, PeerClosed, RemoteError, RpcError
from sidecar.rpc import Handler, JsonRpcPeer, connected_pair

pytestmark = pytest.mark.anyio


class EchoParams(msgspec.Struct):
    value: Any = None


class Gate:
    """Handlers that block until the test lets them go (no sleeps)."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.cancelled = False

    async def block(self, params: EchoParams) -> Any:
        self.entered.set()
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        return params.value


@asynccontextmanager
async def two_peers(
    server_handlers: dict[str, Handler[Any]] | None = None,
    client_handlers: dict[str, Handler[Any]] | None = None,
) -> AsyncIterator[tuple[JsonRpcPeer, JsonRpcPeer]]:
    (a_receive, a_send), (b_receive, b_send) = connected_pair()
    with anyio.fail_after(10):
        async with JsonRpcPeer(a_receive, a_send, server_handlers, name="server") as server:
            async with JsonRpcPeer(b_receive, b_send, client_handlers, name="client") as client:
                yield server, client


async def echo(params: EchoParams) -> Any:
    return params.value


async def test_request_response_with_result_type() -> None:
    async def get(params: IdParams) -> SuccessResult:
        return SuccessResult(success=params.id == "yes")

    async with two_peers({"get": Handler(IdParams, get), "echo": Handler(EchoParams, echo)}) as (_, client):
        assert await client.request("get", {"id": "yes"}, result_type=SuccessResult) == SuccessResult(success=True)
        assert await client.request("get", IdParams(id="no")) == {"success": False}
        assert await client.request("echo", {"value": [1, "二", None]}) == [1, "二", None]
        assert await client.request("echo") is None  # absent params = {} -> value defaults to None


async def test_concurrent_requests_are_matched_by_id() -> None:
    gate = Gate()

    async def slow_then_fast(params: EchoParams) -> Any:
        if params.value % 2 == 0:
            await gate.release.wait()  # even ones finish after the odd ones
        return params.value * 10

    async with two_peers({"calc": Handler(EchoParams, slow_then_fast)}) as (_, client):
        results: dict[int, Any] = {}

        async def call(n: int) -> None:
            results[n] = await client.request("calc", {"value": n})

        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(call, n)
            with anyio.fail_after(5):
                while len(results) < 20:  # all odd ones answered while the even ones wait
                    await anyio.wait_all_tasks_blocked()
            assert sorted(results) == list(range(1, 40, 2))
            gate.release.set()
        assert results == {n: n * 10 for n in range(40)}


async def test_errors_map_to_codes_and_remote_error() -> None:
    async def missing(params: IdParams) -> None:
        raise NotFound(f"session {params.id} not found", data={"id": params.id})

    async def crash(params: EchoParams) -> None:
        raise RuntimeError("secret /home/user/.key details")

    handlers = {"missing": Handler(IdParams, missing), "crash": Handler(EchoParams, crash)}
    async with two_peers(handlers) as (_, client):
        with pytest.raises(RemoteError) as err:
            await client.request("missing", {"id": "s1"})
        assert (err.value.code, err.value.message, err.value.data) == (
            ErrorCode.NOT_FOUND, "session s1 not found", {"id": "s1"}
        )
        with pytest.raises(RemoteError) as err:
            await client.request("crash")
        assert err.value.code == ErrorCode.INTERNAL_ERROR
        assert "secret" not in err.value.message and err.value.data is None
        with pytest.raises(RemoteError) as err:
            await client.request("missing", {"id": 7})
        assert err.value.code == ErrorCode.INVALID_PARAMS
        assert err.value.message == "invalid params: Expected `str`, got `int` - at `$.id`"
        with pytest.raises(RemoteError) as err:
            await client.request("missing", {})
        assert err.value.code == ErrorCode.INVALID_PARAMS and "`id`" in err.value.message
        with pytest.raises(RemoteError) as err:
            await client.request("nope")
        assert err.value.code == ErrorCode.METHOD_NOT_FOUND and "nope" in err.value.message


async def test_peer_without_handlers_answers_method_not_found() -> None:
    async with two_peers() as (server, client):
        with pytest.raises(RemoteError) as err:
            await server.request("anything", {"x": 1})  # the client side has no handler table
        assert err.value.code == ErrorCode.METHOD_NOT_FOUND


async def test_result_of_wrong_type_is_rpc_error() -> None:
    async with two_peers({"echo": Handler(EchoParams, echo)}) as (_, client):
        with pytest.raises(RpcError) as err:
            await client.request("echo", {"value": "text"}, result_type=SuccessResult)
        assert "invalid result for echo" in err.value.message


async def test_eof_fails_every_pending_request_with_peer_closed() -> None:
    (a_receive, a_send), (b_receive, b_send) = connected_pair()
    outcomes: list[BaseException] = []
    with anyio.fail_after(10):
        async with JsonRpcPeer(b_receive, b_send, name="client") as client:

            async def call() -> None:
                try:
                    await client.request("block", {"value": 1})
                except PeerClosed as exc:
                    outcomes.append(exc)

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(call)
                # The "server" reads the three requests, then goes away without answering.
                with a_receive:
                    received = b""
                    while received.count(b"\n") < 3:  # the writer may batch them into one write
                        received += await a_receive.receive()
                await a_send.aclose()
            assert client.closed.is_set()
            with pytest.raises(PeerClosed):
                await client.request("after")
    assert len(outcomes) == 3 and all(isinstance(e, PeerClosed) for e in outcomes)


async def test_cancel_request_cancels_the_handler_and_answers_request_cancelled() -> None:
    gate = Gate()
    async with two_peers({"block": Handler(EchoParams, gate.block), "echo": Handler(EchoParams, echo)}) as (_, client):
        async with anyio.create_task_group() as tg:
            errors: list[RemoteError] = []

            async def call() -> None:
                with pytest.raises(RemoteError) as err:
                    await client.request("block", {"value": 1})
                errors.append(err.value)

            tg.start_soon(call)
            await gate.entered.wait()
            await client.notify("$/cancelRequest", {"id": 0})  # the client's first id is 0
        assert errors[0].code == ErrorCode.REQUEST_CANCELLED
        assert gate.cancelled
        # The peer goes on serving.
        assert await client.request("echo", {"value": "still here"}) == "still here"


async def test_timeout_sends_cancel_request_to_the_other_side() -> None:
    gate = Gate()
    async with two_peers({"block": Handler(EchoParams, gate.block)}) as (_, client):
        with pytest.raises(TimeoutError):
            await client.request("block", {"value": 1}, timeout=0.2)
        # The server-side handler was cancelled by the $/cancelRequest the client sent.
        with anyio.fail_after(5):
            while not gate.cancelled:
                await anyio.wait_all_tasks_blocked()


async def test_cancelling_the_caller_does_not_break_the_peer() -> None:
    gate = Gate()
    async with two_peers({"block": Handler(EchoParams, gate.block), "echo": Handler(EchoParams, echo)}) as (_, client):
        with anyio.move_on_after(0.2):
            await client.request("block", {"value": 1})
        assert await client.request("echo", {"value": 2}) == 2


async def test_ids_colliding_between_directions_route_by_shape() -> None:
    """Both sides use id 0 for their first request at the same time; each gets its own answer."""
    server_gate, client_gate = Gate(), Gate()

    async def server_side(params: EchoParams) -> Any:
        await server_gate.release.wait()
        return ("server", params.value)

    async def client_side(params: EchoParams) -> Any:
        await client_gate.release.wait()
        return ("client", params.value)

    async with two_peers({"who": Handler(EchoParams, server_side)}, {"who": Handler(EchoParams, client_side)}) as (
        server,
        client,
    ):
        results: dict[str, Any] = {}

        async def ask(peer: JsonRpcPeer, name: str) -> None:
            results[name] = await peer.request("who", {"value": name})

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, client, "from-client")
            tg.start_soon(ask, server, "from-server")
            await anyio.wait_all_tasks_blocked()
            server_gate.release.set()
            client_gate.release.set()
        assert results == {"from-client": ["server", "from-client"], "from-server": ["client", "from-server"]}


async def test_notifications_reach_handlers_and_get_no_reply() -> None:
    seen: list[Any] = []
    got = anyio.Event()

    async def note(params: EchoParams) -> None:
        seen.append(params.value)
        got.set()

    async with two_peers({"note": Handler(EchoParams, note)}) as (_, client):
        await client.notify("note", {"value": "hello"})
        await client.notify("unknown:method", {"value": 1})  # dropped silently
        await got.wait()
    assert seen == ["hello"]


async def test_leaving_the_block_answers_in_flight_requests_first() -> None:
    """A normal exit lets running requests finish and writes their replies before closing."""
    gate = Gate()
    (a_receive, a_send), (b_receive, b_send) = connected_pair()
    replies: list[Any] = []
    with anyio.fail_after(10):
        async with JsonRpcPeer(b_receive, b_send, name="client") as client:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    replies.append(await client.request("block", {"value": "done"}))

                async with JsonRpcPeer(a_receive, a_send, {"block": Handler(EchoParams, gate.block)}) as server:
                    tg.start_soon(call)
                    await gate.entered.wait()
                    server.shutdown_grace = 5
                    gate.release.set()
                # server block left: its reply was written before its output closed
    assert replies == ["done"]


async def test_shutdown_grace_cancels_stuck_requests_with_request_cancelled() -> None:
    gate = Gate()
    (a_receive, a_send), (b_receive, b_send) = connected_pair()
    errors: list[RemoteError] = []
    with anyio.fail_after(10):
        async with JsonRpcPeer(b_receive, b_send, name="client") as client:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    with pytest.raises(RemoteError) as err:
                        await client.request("block", {"value": 1})
                    errors.append(err.value)

                async with JsonRpcPeer(
                    a_receive, a_send, {"block": Handler(EchoParams, gate.block)}, shutdown_grace=0.1
                ):
                    tg.start_soon(call)
                    await gate.entered.wait()
    assert errors[0].code == ErrorCode.REQUEST_CANCELLED and "shutting down" in errors[0].message
    assert gate.cancelled


async def test_requests_beyond_max_concurrent_wait_their_turn_and_can_be_cancelled_while_waiting() -> None:
    gate = Gate()
    running: list[Any] = []
    (a_receive, a_send), (b_receive, b_send) = connected_pair()

    async def block(params: EchoParams) -> Any:
        running.append(params.value)
        await gate.release.wait()
        return params.value

    results: dict[Any, Any] = {}
    with anyio.fail_after(10):
        async with JsonRpcPeer(a_receive, a_send, {"block": Handler(EchoParams, block)}, max_concurrent=2):
            async with JsonRpcPeer(b_receive, b_send, name="client") as client:

                async def call(value: str) -> None:
                    try:
                        results[value] = await client.request("block", {"value": value})
                    except RemoteError as exc:
                        results[value] = exc.code

                async with anyio.create_task_group() as tg:
                    for value in ("a", "b", "c", "d"):  # ids 0..3
                        tg.start_soon(call, value)
                        await anyio.wait_all_tasks_blocked()
                    assert running == ["a", "b"]  # two workers busy, c and d queued
                    await client.notify("$/cancelRequest", {"id": 2})  # c, still queued
                    while "c" not in results:
                        await anyio.wait_all_tasks_blocked()
                    assert results == {"c": ErrorCode.REQUEST_CANCELLED}  # answered at once
                    gate.release.set()
    assert results == {"a": "a", "b": "b", "c": ErrorCode.REQUEST_CANCELLED, "d": "d"}
    assert running == ["a", "b", "d"]  # c never ran


async def test_many_pipelined_requests_use_a_bounded_number_of_tasks() -> None:
    peaks: list[int] = []
    servers: list[JsonRpcPeer] = []

    async def observe(params: EchoParams) -> Any:
        peaks.append(servers[0]._workers)
        await anyio.lowlevel.checkpoint()
        return params.value

    async with two_peers({"observe": Handler(EchoParams, observe)}) as (server, client):
        servers.append(server)
        results: list[Any] = []

        async def call(n: int) -> None:
            results.append(await client.request("observe", {"value": n}))

        async with anyio.create_task_group() as tg:
            for n in range(500):
                tg.start_soon(call, n)
        assert sorted(results) == list(range(500))
        assert 1 < max(peaks) <= server.max_concurrent  # concurrent, and never past the bound
        assert server._workers == 0 and not server._queued and not server._inflight


async def test_batch_items_share_the_max_concurrent_workers() -> None:
    gate = Gate()
    running = [0]
    peak = [0]

    async def block(params: EchoParams) -> Any:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            await gate.release.wait()
        finally:
            running[0] -= 1
        return params.value

    (server_receive, server_send), (client_receive, client_send) = connected_pair(max_buffer=64)

    def line(message: Any) -> bytes:
        return msgspec.json.encode(message) + b"\n"

    received = bytearray()
    with anyio.fail_after(10), client_receive:
        async with JsonRpcPeer(server_receive, server_send, {"block": Handler(EchoParams, block)}, max_concurrent=2):
            for first in (0, 100):  # two batches of 6 requests, then two single requests
                batch = [{"jsonrpc": "2.0", "id": first + n, "method": "block", "params": {"value": first + n}}
                         for n in range(6)]
                await client_send.send(line(batch))
            for n in (200, 201):
                await client_send.send(line({"jsonrpc": "2.0", "id": n, "method": "block", "params": {"value": n}}))
            await anyio.wait_all_tasks_blocked()
            assert running[0] == 2  # every request is read; only two run, the rest wait their turn
            gate.release.set()
            while received.count(b"\n") < 4:
                received.extend(await client_receive.receive())
            await client_send.aclose()
    replies = [msgspec.json.decode(raw) for raw in bytes(received).splitlines()]
    batches = sorted((r for r in replies if isinstance(r, list)), key=lambda b: b[0]["id"])
    assert [[item["result"] for item in b] for b in batches] == [list(range(6)), list(range(100, 106))]
    assert sorted(r["result"] for r in replies if isinstance(r, dict)) == [200, 201]
    assert peak[0] == 2


async def test_an_oversized_response_fails_the_request_it_answers() -> None:
    (a_receive, a_send), (raw_receive, raw_send) = connected_pair()
    with anyio.fail_after(10), raw_receive:
        async with JsonRpcPeer(a_receive, a_send, name="client", max_line_bytes=4096) as client:
            outcome: list[Any] = []

            async def call() -> None:
                try:
                    outcome.append(await client.request("big"))
                except RemoteError as exc:
                    outcome.append(exc.code)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                request = msgspec.json.decode(await raw_receive.receive())
                big = {"jsonrpc": "2.0", "id": request["id"], "result": "x" * 10_000}
                await raw_send.send(msgspec.json.encode(big) + b"\n")
            assert outcome == [ErrorCode.MESSAGE_TOO_LARGE]
            # Nothing was sent back for the dropped response: the next line out is our next request.
            tg_result: list[Any] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: client.request("again"))
                second = msgspec.json.decode(await raw_receive.receive())
                tg_result.append(second)
                await raw_send.send(msgspec.json.encode({"jsonrpc": "2.0", "id": second["id"], "result": 1}) + b"\n")
            assert tg_result[0]["method"] == "again"
            await raw_send.aclose()
