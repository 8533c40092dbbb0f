"""MCP tools against a real MCP server subprocess (fixtures/mcp_server.py, built with the
official ``mcp`` package): listing, calling, sanitised names, a server that crashes
mid-call or hangs (a bounded tool error, reconnect on next use), stderr drained, the
process stopped on close; and the same server driven end to end through the sidecar."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import anyio
import pytest

from chat_helpers import configure_provider, events_of, wait_final
from protocol.common import NameParams
from protocol.mcp import McpServerUpsertParams
from scripted_server import scripted_provider
from sidecar.store import AsyncStore, Store
from sidecar.tools.base import ToolError
from sidecar.tools.mcp import McpManager, McpServerConfig, mcp_tool_name, sanitize
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio

FIXTURE = str(Path(__file__).resolve().parent.parent / "fixtures" / "mcp_server.py")


def server_params(name: str = "fx", **extra: object) -> McpServerUpsertParams:
    return McpServerUpsertParams(
        name=name, transport="stdio", command=sys.executable, args=[FIXTURE, *extra.pop("args", [])],  # type: ignore[list-item]
        **extra,  # type: ignore[arg-type]
    )


def test_names_are_sanitised() -> None:
    assert sanitize("my server/1") == "my_server_1"
    assert mcp_tool_name("files", "pid.of server") == "mcp__files__pid_of_server"
    assert len(mcp_tool_name("s" * 40, "t" * 80)) == 64


async def test_list_call_crash_hang_reconnect(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        async with anyio.create_task_group() as tg:
            manager = McpManager(AsyncStore(store), tg)
            await manager.load()
            info = await manager.upsert_server(server_params("my fx", tool_timeout_s=2.0, args=["--stderr-lines", "5000"]))
            assert info.name == "my_fx" and info.status == "idle"
            with anyio.fail_after(30):
                tools = {t.name: t for t in await manager.tools()}
            assert set(tools) >= {"mcp__my_fx__echo", "mcp__my_fx__add", "mcp__my_fx__crash", "mcp__my_fx__pid_of_server"}
            add = tools["mcp__my_fx__add"]
            assert add.parameters["required"] == ["a", "b"] and add.server_key == "mcp:my_fx"
            assert add.default_policy == "ask"
            listed = (await manager.list_servers())[0]
            assert listed.status == "connected" and "mcp__my_fx__echo" in listed.tools

            with anyio.fail_after(10):
                out = await manager.call("my_fx", "add", {"a": 2, "b": 40})
                assert out.text == "42" and not out.is_error
                failed = await manager.call("my_fx", "fail", {"message": "nope"})
                assert failed.is_error and "fail" in failed.text  # the server words its own error
                first_pid = int((await manager.call("my_fx", "pid.of server", {})).text)

                # a crash mid-call: a tool error at once, a new process on next use
                with pytest.raises(ToolError, match="restarted on next use"):
                    await manager.call("my_fx", "crash", {})
                again = int((await manager.call("my_fx", "pid.of server", {})).text)
            assert again != first_pid
            assert not _alive(first_pid)

            # a hang: a tool error within the server's tool timeout, then a fresh process
            with anyio.fail_after(10):
                with pytest.raises(ToolError, match="did not answer hang within 2 s"):
                    await manager.call("my_fx", "hang", {})
                third = int((await manager.call("my_fx", "pid.of server", {})).text)
            assert third != again
            with anyio.fail_after(10):
                while _alive(again):
                    await anyio.sleep(0.05)

            await manager.delete_server(NameParams(name="my fx"))
            with anyio.fail_after(10):
                while _alive(third):
                    await anyio.sleep(0.05)
            assert await manager.list_servers() == []
            await manager.aclose()
    finally:
        store.close()


async def test_a_server_that_cannot_start_gives_no_tools_and_an_error(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        async with anyio.create_task_group() as tg:
            manager = McpManager(AsyncStore(store), tg)
            await manager.upsert_server(McpServerUpsertParams(name="ghost", command="/nonexistent/bin/mcp", connect_timeout_s=3))
            await manager.upsert_server(
                McpServerUpsertParams(name="mute", command=sys.executable, args=["-c", "import time; time.sleep(60)"], connect_timeout_s=0.5)
            )
            with anyio.fail_after(15):
                assert await manager.tools() == []
            states = {s.name: s for s in await manager.list_servers()}
            assert states["ghost"].status == "error" and states["ghost"].error
            assert states["mute"].status == "error" and "initialize" in (states["mute"].error or "")
            with pytest.raises(ToolError, match="not available"):
                await manager.call("ghost", "x", {})
            await manager.aclose()
    finally:
        store.close()


async def test_bad_server_configs_are_refused(tmp_path: Path) -> None:
    from sidecar.errors import InvalidParams

    store = Store(tmp_path)
    try:
        async with anyio.create_task_group() as tg:
            manager = McpManager(AsyncStore(store), tg)
            for params in (
                McpServerUpsertParams(name="///", command="x"),
                McpServerUpsertParams(name="a", transport="stdio"),
                McpServerUpsertParams(name="a", transport="http", url="ftp://x"),
                McpServerUpsertParams(name="a", command="x", tool_timeout_s=0),
            ):
                with pytest.raises(InvalidParams):
                    await manager.upsert_server(params)
            assert await manager.list_servers() == []
    finally:
        store.close()


async def test_mcp_tools_end_to_end_through_the_sidecar(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url)
        info = await proc.call(
            "mcp:server:upsert",
            {"name": "fx", "command": sys.executable, "args": [FIXTURE], "env": {"FX_TOKEN": "s3cret"}, "toolTimeoutS": 3},
        )
        assert info["envKeys"] == ["FX_TOKEN"] and "s3cret" not in str(info)
        session = await proc.call("chat:session:create", {})
        await proc.call("tool:policy:set", {"key": "mcp:fx", "policy": "auto"})
        listed = await proc.call("tool:list", {"sessionId": session["id"]})
        echo = next(t for t in listed if t["name"] == "mcp__fx__echo")
        assert echo["source"] == "mcp" and echo["policy"] == "auto" and echo["defaultPolicy"] == "ask"
        await server.script(
            {"tool_calls": [{"id": "m1", "name": "mcp__fx__echo", "arguments": {"text": "hi from mcp"}}]},
            {"tool_calls": [{"id": "m2", "name": "mcp__fx__crash", "arguments": {}}]},
            {"tool_calls": [{"id": "m3", "name": "mcp__fx__add", "arguments": {"a": 1, "b": 2}}]},
            {"text": "All done."},
        )
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "use mcp"}})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "stream_end", final
        results = {e["toolResult"]["toolCallId"]: e["toolResult"] for e in events_of(proc, sent["messageId"]) if e["type"] == "tool_result"}
        assert results["m1"]["output"] == "hi from mcp" and not results["m1"].get("isError")
        assert results["m2"]["isError"] and "fx" in results["m2"]["output"]
        assert results["m3"]["output"] == "3"  # the crashed server was started again
        with pytest.raises(CallError) as err:
            await proc.call("mcp:server:delete", {"name": "nope"})
        assert err.value.code == -32001
        assert (await proc.call("mcp:server:delete", {"name": "fx"})) == {"success": True}
        await proc.close()
    assert "s3cret" not in proc.stderr_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_opening_the_app_imports_neither_mcp_nor_jsonschema(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys, anyio\n"
        "from sidecar.config import Config\n"
        "from sidecar.app import open_app\n"
        "async def main():\n"
        "    async def notify(m, p): pass\n"
        f"    async with open_app(Config(data_dir={str(tmp_path)!r}), notify) as app:\n"
        "        assert app.tools is not None and app.mcp is not None\n"
        "    print(sorted(m for m in ('mcp', 'jsonschema') if m in sys.modules))\n"
        "anyio.run(main)\n"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


async def test_an_http_mcp_server(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import subprocess

    process = await anyio.open_process(
        [sys.executable, FIXTURE, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    store = Store(tmp_path)
    try:
        async with anyio.create_task_group() as tg:
            manager = McpManager(AsyncStore(store), tg)
            await manager.upsert_server(
                McpServerUpsertParams(name="web", transport="http", url=f"http://127.0.0.1:{port}/mcp", connect_timeout_s=5)
            )
            with anyio.fail_after(30):
                while True:  # the server needs a moment to listen
                    tools = await manager.tools()
                    if tools:
                        break
                    await anyio.sleep(0.2)
                assert "mcp__web__echo" in {t.name for t in tools}
                out = await manager.call("web", "add", {"a": 20, "b": 22})
            assert out.text == "42"
            await manager.aclose()
    finally:
        store.close()
        with anyio.CancelScope(shield=True):
            process.kill()
            await process.wait()
            await process.aclose()


async def test_what_a_server_writes_while_shutting_down_is_still_drained(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.tools.mcp")
    # the fixture server, with a last stderr line written after stdin closed (at exit)
    wrapper = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: (sys.stderr.write('bye from the server\\n'), sys.stderr.flush()))\n"
        f"sys.argv = [{FIXTURE!r}]\n"
        f"runpy.run_path({FIXTURE!r}, run_name='__main__')\n"
    )
    store = Store(tmp_path)
    try:
        async with anyio.create_task_group() as tg:
            manager = McpManager(AsyncStore(store), tg)
            await manager.upsert_server(McpServerUpsertParams(name="fx", command=sys.executable, args=["-c", wrapper]))
            with anyio.fail_after(30):
                out = await manager.call("fx", "add", {"a": 1, "b": 2})
                assert out.text == "3"
                await manager.aclose()
    finally:
        store.close()
    assert "[mcp fx] bye from the server" in caplog.text


def test_server_config_reprs_keep_secrets_out() -> None:
    config = McpServerConfig(
        name="s", command="srv", args=["--token", "arg-secret-1"], env={"API_KEY": "env-secret-1"},
        url="https://u:pw-secret-1@mcp.test/x?key=query-secret-1", headers={"Authorization": "Bearer hdr-secret-1"},
    )
    for text in (repr(config), str(config), repr(list(config.__rich_repr__()))):
        for secret in ("arg-secret-1", "env-secret-1", "pw-secret-1", "query-secret-1", "hdr-secret-1"):
            assert secret not in text, (secret, text)
        assert "API_KEY" in text and "Authorization" in text
