"""End to end over a real subprocess (``python -m sidecar``), exactly as Electron talks to it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sidecar_proc import CallError, sidecar_command, spawn_sidecar
from wire_edges import edge_line

import sidecar
from protocol import METHODS, PROTOCOL_VERSION, ErrorCode, InitializeResult
from sidecar.errors import PeerClosed, RemoteError
from sidecar.rpc import JsonRpcPeer

pytestmark = [pytest.mark.anyio, pytest.mark.sidecar_subprocess]  # exit codes, signals, stdio framing and fd guarding, memory peaks


async def test_spawn_initialize_errors_and_shutdown(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with spawn_sidecar(data_dir) as proc:
        info = await proc.call(
            "sidecar:initialize",
            {"protocolVersion": PROTOCOL_VERSION, "clientInfo": {"name": "e2e", "version": "0"}},
            result_type=InitializeResult,
        )
        assert info.protocol_version == PROTOCOL_VERSION
        assert (info.server_info.name, info.server_info.version) == (sidecar.SERVER_NAME, sidecar.__version__)
        assert info.capabilities.methods == sorted(METHODS)
        assert info.data_dir == str(data_dir) and data_dir.is_dir()

        with pytest.raises(CallError) as err:
            await proc.call("chat:nope", {})
        assert err.value.code == ErrorCode.METHOD_NOT_FOUND
        with pytest.raises(CallError) as err:
            await proc.call("chat:session:get", {"id": 42})
        assert err.value.code == ErrorCode.INVALID_PARAMS and "`$.id`" in err.value.message

        await proc.close()
    proc.assert_all_jsonrpc()
    assert "Traceback" not in proc.stderr_text()


async def test_stdin_eof_exits_0(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await proc.close_stdin()
        await proc.assert_exit(0)
    proc.assert_all_jsonrpc()


async def test_request_then_eof_is_still_answered(tmp_path: Path) -> None:
    """`echo request | chat-sidecar`: the answer is written before the process exits."""
    async with spawn_sidecar(tmp_path) as proc:
        request_id = await proc.request("sidecar:initialize", {})
        await proc.close_stdin()
        await proc.assert_exit(0)
        reply = await proc.response(request_id, timeout=1)
        assert reply["result"]["serverInfo"]["name"] == sidecar.SERVER_NAME


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_exits_0(tmp_path: Path, sig: signal.Signals) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})  # the signal handlers are installed by now
        proc.send_signal(sig)
        await proc.assert_exit(0)
    proc.assert_all_jsonrpc()
    assert "stopping" in proc.stderr_text()


STRAY_LAUNCHER = """
import os, sys
import sidecar.__main__ as cli
import sidecar.server as server

original = server.Server.initialize

async def initialize(self, params):
    print("STRAY print() while serving")
    os.write(1, b"STRAY write to fd 1\\n")
    return await original(self, params)

server.Server.initialize = initialize
sys.exit(cli.main(sys.argv[1:]))
"""


async def test_stray_print_cannot_reach_the_wire(tmp_path: Path) -> None:
    """fd 1 is redirected to stderr at start: a print() or a raw write to fd 1 while
    serving lands in the log, and stdout carries only the protocol."""
    command = [sys.executable, "-c", STRAY_LAUNCHER, "--data-dir", str(tmp_path)]
    async with spawn_sidecar(tmp_path, command=command) as proc:
        await proc.call("sidecar:initialize", {})  # may be answered before the server runs
        await proc.call("sidecar:initialize", {})  # by the server's (patched) handler
        await proc.close()
    proc.assert_all_jsonrpc()
    assert not any(b"STRAY" in line for line in proc.lines)
    assert "STRAY print() while serving" in proc.stderr_text()
    assert "STRAY write to fd 1" in proc.stderr_text()


async def test_bad_input_over_the_pipe_and_the_process_keeps_serving(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})

        async def null_id_error(line: bytes) -> int:
            await proc.send_line(line)
            reply = await proc.next_null_id_reply()
            return reply["error"]["code"]

        assert await null_id_error(b"{this is not json") == ErrorCode.PARSE_ERROR
        assert await null_id_error(bytes(range(256)).replace(b"\n", b"")) == ErrorCode.PARSE_ERROR
        assert await null_id_error(b"[" * 100_000 + b"]" * 100_000) == ErrorCode.PARSE_ERROR  # nesting bomb
        assert await null_id_error(b"[]") == ErrorCode.INVALID_REQUEST
        assert await null_id_error(b'{"jsonrpc":"2.0","method":7}') == ErrorCode.INVALID_REQUEST

        async def error_for(message: dict[str, Any]) -> dict[str, Any]:
            await proc.send(message)
            reply = await proc.response(message["id"])
            return reply["error"]

        assert (await error_for({"jsonrpc": "2.0", "id": 101}))["code"] == ErrorCode.INVALID_REQUEST
        assert (await error_for({"jsonrpc": "1.0", "id": 102, "method": "sidecar:initialize"}))["code"] == (
            ErrorCode.INVALID_REQUEST
        )
        assert (await error_for({"jsonrpc": "2.0", "id": 103, "method": "no:such"}))["code"] == (
            ErrorCode.METHOD_NOT_FOUND
        )
        wrong_type = await error_for({"jsonrpc": "2.0", "id": 104, "method": "chat:session:pin", "params": {"id": "s", "pinned": "yes"}})
        assert wrong_type["code"] == ErrorCode.INVALID_PARAMS and "`$.pinned`" in wrong_type["message"]
        missing = await error_for({"jsonrpc": "2.0", "id": 105, "method": "chat:session:pin", "params": {"id": "s"}})
        assert missing["code"] == ErrorCode.INVALID_PARAMS and "`pinned`" in missing["message"]

        # A notification for an unknown method gets no reply at all.
        before = len(proc.lines)
        await proc.notify("no:such:notification", {"x": 1})
        await proc.call("sidecar:initialize", {})
        assert len(proc.lines) == before + 1

        await proc.send_line(
            json.dumps(
                [
                    {"jsonrpc": "2.0", "id": 201, "method": "sidecar:initialize", "params": {}},
                    {"jsonrpc": "2.0", "method": "sidecar:initialize"},
                    {"jsonrpc": "2.0", "id": 202, "method": "no:such"},
                    "junk",
                ]
            )
        )
        batch = await proc.next_batch_reply()
        assert [item["id"] for item in batch] == [201, 202, None]
        assert "result" in batch[0]
        assert [item["error"]["code"] for item in batch[1:]] == [ErrorCode.METHOD_NOT_FOUND, ErrorCode.INVALID_REQUEST]
        await proc.send_line(json.dumps([{"jsonrpc": "2.0", "method": "a"}, {"jsonrpc": "2.0", "method": "b"}]))

        info = await proc.call("sidecar:initialize", {})  # still serving
        assert info["serverInfo"]["name"] == sidecar.SERVER_NAME
        await proc.close()
    proc.assert_all_jsonrpc()
    assert not any(isinstance(m, list) and not m for m in proc.messages)
    assert "Traceback" not in proc.stderr_text()


async def test_oversized_line_is_rejected_without_blowing_memory(tmp_path: Path) -> None:
    limit = 64 * 1024
    async with spawn_sidecar(tmp_path, "--max-line-bytes", str(limit)) as proc:
        info = await proc.call("sidecar:initialize", {})
        assert info["capabilities"]["maxLineBytes"] == limit
        await proc.call("settings:get", {})  # the services are open (a store method would not wait for them)
        peak_before = proc.vm_hwm_kib()

        total = 32 * 1024 * 1024  # 32 MiB in one line: buffering it whole would show in RSS
        head = b'{"jsonrpc":"2.0","id":"big","method":"sidecar:initialize","params":{"pad":"'
        chunk = b"x" * (1024 * 1024)
        assert proc.process.stdin is not None
        await proc.process.stdin.send(head)
        for _ in range(total // len(chunk)):
            await proc.process.stdin.send(chunk)
        await proc.send_line(b'"}}')
        reply = await proc.response("big", timeout=30)  # the id is read from the kept first bytes
        assert reply["error"]["code"] == ErrorCode.MESSAGE_TOO_LARGE
        assert str(len(head) + total + 3) in reply["error"]["message"]

        assert (await proc.call("sidecar:initialize", {}))["serverInfo"]["name"] == sidecar.SERVER_NAME
        peak_after = proc.vm_hwm_kib()
        if peak_before is not None and peak_after is not None:
            assert peak_after - peak_before < 8 * 1024, f"peak RSS grew by {peak_after - peak_before} KiB"
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_cancel_request_over_the_pipe_for_unknown_id_is_harmless(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.notify("$/cancelRequest", {"id": 12345})
        await proc.notify("$/cancelRequest", {"nonsense": True})
        await proc.call("sidecar:initialize", {})
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_a_second_sidecar_on_the_same_data_dir_exits_1_and_leaves_the_first_alone(
    tmp_path: Path,
) -> None:
    async with spawn_sidecar(tmp_path) as first:
        await first.call("sidecar:initialize", {})
        session = await first.call("chat:session:create", {"title": "mine"})  # the store is open
        async with spawn_sidecar(tmp_path) as second:
            assert await second.wait_exit() == 1
            assert f"another chat-sidecar is using {tmp_path}" in second.stderr_text()
            assert "Traceback" not in second.stderr_text()
            assert second.lines == []
        listed = await first.call("chat:session:list", {})
        assert [s["id"] for s in listed["sessions"]] == [session["id"]]
        await first.close()
    assert "Traceback" not in first.stderr_text()


def test_bad_command_line_exits_2(tmp_path: Path) -> None:
    for args in (["--log-level", "loud"], ["--max-line-bytes", "12"], ["frobnicate"]):
        done = subprocess.run(
            [sys.executable, "-m", "sidecar", "--data-dir", str(tmp_path), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == b""


# ---- property over the subprocess: a few arbitrary batches of lines -------------------------

any_line = st.one_of(
    edge_line([
        "sidecar:initialize", "chat:session:list", "chat:session:get", "chat:session:create",
        "provider:upsert", "tool:audit:list", "chat:messages:search", "no:such",
    ]),
    st.binary(max_size=80),
    st.text(max_size=40).map(str.encode),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "x"]), inner, max_size=4),
        max_leaves=6,
    ).map(lambda v: json.dumps(v).encode()),
).map(lambda b: b.replace(b"\n", b""))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(any_line, min_size=1, max_size=25))
# one id for a method of the contract and for one outside it: a result and an error come back
@example(lines=[b'{"jsonrpc":"2.0","id":7.0,"method":"sidecar:initialize","params":{}}',
                b'{"jsonrpc":"2.0","id":7.0,"method":"no:such","params":{}}'])
async def test_arbitrary_lines_over_the_pipe(tmp_path: Path, lines: list[bytes]) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        for line in lines:
            await proc.send_line(line)
        # still serving (an id the generated lines cannot hold: one of them may still be in
        # flight, e.g. waiting for the services to load, and ids must be unique)
        answer = await proc.response(await proc.request("sidecar:initialize", {}, request_id="still-serving"))
        assert "result" in answer
        await proc.close_stdin()
        await proc.assert_exit(0)
    proc.assert_all_jsonrpc()
    assert "Traceback" not in proc.stderr_text()


async def test_json_rpc_peer_as_client_over_process_pipes(tmp_path: Path) -> None:
    """The same peer class the ACP/MCP clients use, on a child's stdin/stdout."""
    with anyio.fail_after(20):
        process = await anyio.open_process(sidecar_command(tmp_path), stderr=subprocess.DEVNULL)
        async with process:
            assert process.stdout is not None and process.stdin is not None
            async with JsonRpcPeer(process.stdout, process.stdin, name="client") as client:
                info = await client.request("sidecar:initialize", {}, result_type=InitializeResult)
                assert info.server_info.name == sidecar.SERVER_NAME
                with pytest.raises(RemoteError) as err:
                    await client.request("no:such")
                assert err.value.code == ErrorCode.METHOD_NOT_FOUND
                assert await client.request("sidecar:shutdown") == {"success": True}
                await client.closed.wait()  # the child closed its stdout as it exited
                with pytest.raises(PeerClosed):
                    await client.request("sidecar:initialize")
            assert await process.wait() == 0
