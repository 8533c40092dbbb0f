"""ACP building blocks in-process, the client side of an agent: fs confinement and the
files it reads and writes for the agent (sidecar.acp.fs), and the connection
(sidecar.acp.client.AcpConnection) over memory streams: prompts, updates, permissions,
remote errors, timeouts and the agent going away."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from sidecar.acp import fs
from sidecar.acp.client import AcpConnection, PromptCall
from sidecar.acp.types import CancelledOutcome, RequestPermissionParams, RequestPermissionResult, TextBlock
from sidecar.errors import InvalidParams, ProviderError, RemoteError, SidecarError
from sidecar.rpc import Handler, JsonRpcPeer

pytestmark = pytest.mark.anyio
enc = msgspec.json.encode


# ---- fs confinement --------------------------------------------------------------------


def test_confine_refuses_everything_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("x")
    os.symlink(tmp_path / "outside.txt", root / "out-link")
    os.symlink(tmp_path, root / "dir-link")
    os.symlink(root / "sub", root / "in-link")
    assert fs.confine(root, str(root / "sub" / "new.txt")) == (root / "sub" / "new.txt").resolve()
    assert fs.confine(root, str(root / "in-link" / "f")) == (root / "sub" / "f").resolve()
    for bad, why in (
        (str(tmp_path / "outside.txt"), "outside"),
        (f"{root}/../outside.txt", "outside"),
        (f"{root}/sub/../../outside.txt", "outside"),
        (str(root / "out-link"), "outside"),
        (str(root / "dir-link" / "outside.txt"), "outside"),
        (str(root) + "x/file", "outside"),  # a sibling whose name starts like the root
        ("relative/path", "absolute"),
        (str(root / "a\0b"), "NUL"),
        (str(root / ("a" * 5000)), "longer"),
        ("", "non-empty"),
    ):
        with pytest.raises(InvalidParams) as err:
            fs.confine(root, bad)
        assert why in err.value.message, (bad, err.value.message)


async def test_read_and_write_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    assert await fs.read_text_file(str(tmp_path), str(tmp_path / "a.txt")) == "one\ntwo\nthree\n"
    assert await fs.read_text_file(str(tmp_path), str(tmp_path / "a.txt"), line=2, limit=1) == "two\n"
    with pytest.raises(SidecarError) as err:
        await fs.read_text_file(str(tmp_path), str(tmp_path / "missing.txt"))
    assert int(err.value.code) == -32002
    with pytest.raises(InvalidParams):
        await fs.read_text_file(str(tmp_path), str(tmp_path / "a.txt"), line=0)
    await fs.write_text_file(str(tmp_path), str(tmp_path / "new" / "deep" / "b.txt"), "written")
    assert (tmp_path / "new" / "deep" / "b.txt").read_text() == "written"
    assert not [p for p in (tmp_path / "new" / "deep").iterdir() if p.name.startswith(".acp-write-")]
    with pytest.raises(InvalidParams):
        await fs.write_text_file(str(tmp_path), str(tmp_path / "new"), "a directory")


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
async def test_writes_keep_the_mode_of_the_file_they_replace(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("old")
    script.chmod(0o754)
    await fs.write_text_file(str(tmp_path), str(script), "new")
    assert script.read_text() == "new" and stat.S_IMODE(script.stat().st_mode) == 0o754
    # a new file gets what open() would give it, not mkstemp's 0600
    mask = os.umask(0o022)
    os.umask(mask)
    await fs.write_text_file(str(tmp_path), str(tmp_path / "fresh.txt"), "x")
    assert stat.S_IMODE((tmp_path / "fresh.txt").stat().st_mode) == 0o666 & ~mask


# ---- the connection over memory streams ------------------------------------------------


class _Lines:
    """Messages from a memory stream of bytes (the peer's writer may join several lines)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> Any:
        while b"\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return msgspec.json.decode(line)


class QueueSink:
    def __init__(self) -> None:
        self.updates: list[bytes] = []
        self.asked = anyio.Event()
        self.cancelled = anyio.Event()

    def on_update(self, update: msgspec.Raw) -> None:
        self.updates.append(bytes(update))

    async def request_permission(self, params: RequestPermissionParams) -> RequestPermissionResult:
        self.asked.set()
        await self.cancelled.wait()
        return RequestPermissionResult(outcome=CancelledOutcome())

    def cancel_permissions(self) -> None:
        self.cancelled.set()


async def test_updates_arrive_before_the_prompt_result_and_exit_fails_the_prompt() -> None:
    """Through the peer path (no line filter): 500 updates then the result in one burst."""
    agent_out_send, agent_out_recv = anyio.create_memory_object_stream[bytes](1000)
    client_out_send, client_out_recv = anyio.create_memory_object_stream[bytes](1000)
    async with anyio.create_task_group() as tg:
        async with JsonRpcPeer(agent_out_recv, client_out_send, cancel_method=None, autostart=False) as peer:
            conn = AcpConnection(peer=peer, agent=None, task_group=tg, engine_id="e", name="fake")
            sink = QueueSink()
            conn.attach("s1", sink)
            peer.start_reading()
            out = _Lines(client_out_recv)
            seen_at_done: list[int] = []
            call = conn.start_prompt("s1", [TextBlock(text="go")], lambda: seen_at_done.append(len(sink.updates)))
            request = await out.next()
            assert request["method"] == "session/prompt" and request["params"]["prompt"] == [{"type": "text", "text": "go"}]
            burst = b"".join(
                enc({"jsonrpc": "2.0", "method": "session/update",
                     "params": {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk", "n": i}}}) + b"\n"
                for i in range(500)
            ) + enc({"jsonrpc": "2.0", "id": request["id"], "result": {"stopReason": "end_turn"}}) + b"\n"
            await agent_out_send.send(burst)
            with anyio.fail_after(5):
                await call.done.wait()
            assert seen_at_done == [500] and call.result is not None and call.result.stop_reason == "end_turn"

            # a permission request waits for the sink; cancel() answers it "cancelled"
            await agent_out_send.send(enc({"jsonrpc": "2.0", "id": 9, "method": "session/request_permission", "params": {
                "sessionId": "s1", "toolCall": {"toolCallId": "t"}, "options": []}}) + b"\n")
            with anyio.fail_after(5):
                await sink.asked.wait()
                await conn.cancel("s1")
                replies = [await out.next() for _ in range(2)]
            assert {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1"}} in replies
            assert {"jsonrpc": "2.0", "id": 9, "result": {"outcome": {"outcome": "cancelled"}}} in replies

            # fs for a session this connection never opened is refused
            await agent_out_send.send(enc({"jsonrpc": "2.0", "id": 10, "method": "fs/read_text_file",
                                           "params": {"sessionId": "nope", "path": "/etc/hostname"}}) + b"\n")
            with anyio.fail_after(5):
                reply = await out.next()
            assert reply["id"] == 10 and reply["error"]["code"] == -32602

            # the agent goes away mid-prompt: the prompt fails at once with a ProviderError
            second: PromptCall = conn.start_prompt("s1", [TextBlock(text="again")], lambda: None)
            await out.next()
            await agent_out_send.aclose()
            with anyio.fail_after(5):
                await second.done.wait()
            assert isinstance(second.error, ProviderError) and "closed its connection" in second.error.message
            assert not conn.alive
            with pytest.raises(ProviderError):
                await conn.new_session("/tmp", [])
        tg.cancel_scope.cancel()
    await client_out_recv.aclose()


async def test_remote_errors_and_timeouts_become_provider_errors(tmp_path: Path) -> None:
    (a_recv, a_send), (b_recv, b_send) = _pair()
    async with anyio.create_task_group() as tg:
        async with (
            JsonRpcPeer(a_recv, a_send, cancel_method=None, shutdown_grace=0.1) as client,
            JsonRpcPeer(b_recv, b_send, shutdown_grace=0.1) as agent,
        ):
            async def fail_new(params: Any) -> Any:
                raise SidecarError("no sessions today", code=-32000)  # type: ignore[arg-type]

            async def slow_load(params: Any) -> Any:
                await anyio.sleep_forever()

            agent.dispatcher.add("session/new", Handler(msgspec.Raw, fail_new))
            agent.dispatcher.add("session/load", Handler(msgspec.Raw, slow_load))
            conn = AcpConnection(peer=client, agent=None, task_group=tg, engine_id="e", name="fake", request_timeout_s=0.2)
            with pytest.raises(ProviderError) as err:
                await conn.new_session("/tmp", [])
            assert "failed session/new: no sessions today" in err.value.message
            with pytest.raises(ProviderError) as err:
                await conn.load_session("x", str(tmp_path), [])
            assert "did not answer session/load within 0.2 s" in err.value.message
            # a session that failed to load serves no fs requests
            (tmp_path / "f.txt").write_text("private")
            with anyio.fail_after(5), pytest.raises(RemoteError) as refused:
                await agent.request("fs/read_text_file", {"sessionId": "x", "path": str(tmp_path / "f.txt")})
            assert refused.value.code == -32602 and "unknown session" in refused.value.message
            with pytest.raises(ProviderError):  # -32601 from a peer without the method
                await conn.fork_session("x", "/tmp", [])
        tg.cancel_scope.cancel()


def _pair() -> tuple[Any, Any]:
    from sidecar.rpc import connected_pair

    return connected_pair()
