"""MCP tools against a real MCP server subprocess (fixtures/mcp_server.py, built with the
official ``mcp`` package): listing, calling, sanitised names, a server that crashes
mid-call or hangs (a bounded tool error, a reconnect in the background), servers that
cannot start (failed, with the error and the next attempt), disable and delete stopping
the process, stderr drained, the process stopped on close; and the same server driven end
to end through the sidecar. Exit and isolation over the subprocess: test_tools_mcp_exit.py
and test_tools_mcp_isolation.py."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import time
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
from sidecar.tools.mcp_config import tool_name_prefix
from mcp_helpers import FIXTURE, HUNG, http_fixture, modules_loaded_by, spawns, wait_state, wait_status
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio


def server_params(name: str = "fx", **extra: object) -> McpServerUpsertParams:
    return McpServerUpsertParams(
        name=name, transport="stdio", command=sys.executable, args=[FIXTURE, *extra.pop("args", [])],  # type: ignore[list-item]
        **extra,  # type: ignore[arg-type]
    )


def test_names_are_sanitised_and_no_two_tools_share_one() -> None:
    assert sanitize("my server/1") == "my_server_1"
    assert mcp_tool_name("files", "read_file") == "mcp__files__read_file"  # plain names stay as they are
    assert mcp_tool_name("files", "pid.of server") == "mcp__files__pid_of_server__" + _digest("files", "pid.of server")
    pairs = [("a", "b__c"), ("a__b", "c"), ("a", "b_c"), ("a_b", "c"), ("x", "read.file"), ("x", "read_file"),
             ("x", "read file"), ("a_", "_b"), ("a", "__b"), ("a", "_b"), ("s" * 40, "t"), ("s" * 40 + "z", "t"),
             ("s", "t" * 80), ("s", "t" * 80 + "u"), ("s", "中文"), ("s", "日本"), ("s", ""), ("s", "_")]
    names = [mcp_tool_name(server, tool) for server, tool in pairs]
    assert len(set(names)) == len(pairs), names  # one name, one tool: a policy cannot pass to another
    assert all(len(n) <= 64 and re.fullmatch(r"[A-Za-z0-9_-]+", n) for n in names)
    for (server, _), name in zip(pairs, names):
        assert name.startswith(tool_name_prefix(server))  # what enabledTools checks a server not ready by


def _digest(server: str, tool: str) -> str:
    return hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:16]


async def test_list_call_crash_hang_reconnect(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        async with McpManager.open(AsyncStore(store)) as manager:
            info = await manager.upsert_server(server_params("my fx", tool_timeout_s=6.0, args=["--stderr-lines", "5000"]))
            assert info.name == "my_fx" and info.status == "connecting"  # connects in the background
            listed = await wait_state(manager, "my_fx", {"ready"})
            assert "mcp__my_fx__echo" in listed.tools and listed.error is None and listed.retry_at is None
            tools = {t.name: t for t in manager.tools()}
            assert set(tools) >= {"mcp__my_fx__echo", "mcp__my_fx__add", "mcp__my_fx__crash", mcp_tool_name("my_fx", "pid.of server")}
            add = tools["mcp__my_fx__add"]
            assert add.parameters["required"] == ["a", "b"] and add.server_key == "mcp:my_fx"
            assert add.default_policy == "ask"
            assert manager.unavailable() == []

            with anyio.fail_after(30):
                out = await manager.call("my_fx", "add", {"a": 2, "b": 40})
                assert out.text == "42" and not out.is_error
                failed = await manager.call("my_fx", "fail", {"message": "nope"})
                assert failed.is_error and "fail" in failed.text  # the server words its own error
                first_pid = int((await manager.call("my_fx", "pid.of server", {})).text)

                # a crash mid-call: a tool error at once; the supervisor reconnects in the background
                with pytest.raises(ToolError, match="reconnected in the background"):
                    await manager.call("my_fx", "crash", {})
            down = await wait_state(manager, "my_fx", {"connecting", "failed"})
            assert down.tools == []
            assert [name for name, _ in manager.unavailable()] == ["my_fx"] and manager.tools() == []
            with pytest.raises(ToolError, match="not connected"):
                await manager.call("my_fx", "add", {"a": 1, "b": 1})  # never waits for the reconnect
            await wait_state(manager, "my_fx", {"ready"})
            with anyio.fail_after(30):
                again = int((await manager.call("my_fx", "pid.of server", {})).text)
            assert again != first_pid
            assert not _alive(first_pid)

            # a hang: a tool error within the server's tool timeout, then a fresh process
            with anyio.fail_after(30):
                with pytest.raises(ToolError, match="did not answer hang within 6 s"):
                    await manager.call("my_fx", "hang", {})
            await wait_state(manager, "my_fx", {"ready"})
            with anyio.fail_after(30):
                third = int((await manager.call("my_fx", "pid.of server", {})).text)
            assert third != again
            assert not _alive(again)  # stopped before the new one was spawned

            with anyio.fail_after(30):
                await manager.delete_server(NameParams(name="my fx"))
            assert not _alive(third)  # the answer comes once the process is gone
            assert await manager.list_servers() == []
    finally:
        store.close()


async def test_a_server_that_cannot_start_fails_and_backs_off(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        async with McpManager.open(AsyncStore(store)) as manager:
            await manager.upsert_server(McpServerUpsertParams(name="ghost", command="/nonexistent/bin/mcp", connect_timeout_s=3))
            await manager.upsert_server(
                McpServerUpsertParams(name="mute", command=sys.executable, args=["-c", "import time; time.sleep(60)"], connect_timeout_s=0.5)
            )
            await manager.upsert_server(
                McpServerUpsertParams(name="nodir", command=sys.executable, cwd=str(tmp_path / "missing"))
            )
            assert manager.tools() == []
            ghost = await wait_state(manager, "ghost", {"failed"})
            assert "cannot start '/nonexistent/bin/mcp'" in (ghost.error or "")
            assert ghost.retry_at is not None and ghost.retry_at > time.time() * 1000 - 5000
            mute = await wait_state(manager, "mute", {"failed"})
            assert "no answer to initialize within 0.5 s" in (mute.error or "")
            nodir = await wait_state(manager, "nodir", {"failed"})
            assert "does not exist" in (nodir.error or "")
            with pytest.raises(ToolError, match="not connected .failed: cannot start"):
                await manager.call("ghost", "x", {})
            with pytest.raises(ToolError, match="not available: not configured"):
                await manager.call("nobody", "x", {})
    finally:
        store.close()


async def test_disabled_servers_run_nothing_and_a_disable_stops_the_process(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        async with McpManager.open(AsyncStore(store)) as manager:
            info = await manager.upsert_server(server_params("fx", enabled=False))
            assert info.status == "disabled" and not manager.configured
            await manager.upsert_server(server_params("fx"))
            await wait_state(manager, "fx", {"ready"})
            pid = int((await manager.call("fx", "pid.of server", {})).text)
            with anyio.fail_after(30):
                info = await manager.upsert_server(server_params("fx", enabled=False))
            assert info.status == "disabled" and info.tools == [] and not _alive(pid)
            with pytest.raises(ToolError, match="not available: disabled"):
                await manager.call("fx", "add", {"a": 1, "b": 1})
    finally:
        store.close()


async def test_stored_enabled_servers_connect_when_the_manager_opens(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        async with McpManager.open(AsyncStore(store)) as manager:
            await manager.upsert_server(server_params("fx"))
            await manager.upsert_server(server_params("off", enabled=False))
        async with McpManager.open(AsyncStore(store)) as manager:
            states = {s.name: s.status for s in await manager.list_servers()}
            assert states == {"fx": "connecting", "off": "disabled"}
            await wait_state(manager, "fx", {"ready"})
    finally:
        store.close()


async def test_the_close_deadline_kills_the_whole_process_group(tmp_path: Path) -> None:
    # a server (and its child) that ignore SIGTERM, and a close deadline shorter than the
    # polite stop: the group is SIGKILLed at the deadline and the close still returns
    pid_file = tmp_path / "spawns.txt"
    store = Store(tmp_path)
    try:
        with anyio.fail_after(20):
            async with McpManager.open(AsyncStore(store), close_deadline_s=0.2) as manager:
                await manager.upsert_server(
                    McpServerUpsertParams(
                        name="stuck", command=sys.executable, connect_timeout_s=60,
                        args=[HUNG, "--pid-file", str(pid_file), "--child", "--ignore-term"],
                    )
                )
                while len(spawns(pid_file, "server")) < 1 or len(spawns(pid_file, "child")) < 1:
                    await anyio.sleep(0.05)
                assert (await manager.list_servers())[0].status == "connecting"
        for kind in ("server", "child"):
            ((pid, _),) = spawns(pid_file, kind)
            with anyio.fail_after(2):
                while _alive(pid):
                    await anyio.sleep(0.02)
    finally:
        store.close()


async def test_an_outside_cancellation_does_not_hang_the_teardown(tmp_path: Path) -> None:
    # What the engine's shutdown used to do: cancel the task group the connections ran in
    # while they were open. The connections now belong to the manager, which stops them
    # (bounded) even when the block around it is cancelled.
    store = Store(tmp_path)
    try:
        with anyio.fail_after(20):
            with anyio.CancelScope() as outer:
                async with McpManager.open(AsyncStore(store)) as manager:
                    await manager.upsert_server(server_params("fx"))
                    await wait_state(manager, "fx", {"ready"})
                    pid = int((await manager.call("fx", "pid.of server", {})).text)
                    outer.cancel()
                    await anyio.sleep_forever()
            assert outer.cancelled_caught
        assert not _alive(pid)
    finally:
        store.close()


async def test_bad_server_configs_are_refused(tmp_path: Path) -> None:
    from sidecar.errors import InvalidParams

    store = Store(tmp_path)
    try:
        async with McpManager.open(AsyncStore(store)) as manager:
            for params in (
                McpServerUpsertParams(name="///", command="x"),
                McpServerUpsertParams(name="a", transport="stdio"),
                McpServerUpsertParams(name="a", transport="http", url="ftp://x"),
                McpServerUpsertParams(name="a", command="x", tool_timeout_s=0),
                # headers an HTTP request cannot carry
                McpServerUpsertParams(name="a", transport="http", url="http://127.0.0.1:9/mcp", headers={"X-Key": "a\r\nb"}),
                McpServerUpsertParams(name="a", transport="http", url="http://127.0.0.1:9/mcp", headers={"X-Key": "漢"}),
                McpServerUpsertParams(name="a", transport="http", url="http://127.0.0.1:9/mcp", headers={"X Key": "v"}),
            ):
                with pytest.raises(InvalidParams):
                    await manager.upsert_server(params)
            assert await manager.list_servers() == []
    finally:
        store.close()


async def test_stored_headers_no_request_can_carry_fail_the_link_by_name_not_value() -> None:
    """Headers stored by a version that did not check them: the link fails before any request."""
    from sidecar.tools.mcp_config import McpServerConfig
    from sidecar.tools.mcp_transport import LinkError, open_link

    config = McpServerConfig(name="a", transport="http", url="http://127.0.0.1:9/mcp", headers={"X-Key": "sk-漢字"})
    with pytest.raises(LinkError) as err:
        async with open_link(config):
            pass
    assert "the value of header 'X-Key'" in str(err.value) and "mcp:server:upsert" in str(err.value)
    assert "漢" not in str(err.value)


async def test_mcp_tools_end_to_end_through_the_sidecar(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url)
        info = await proc.call(
            "mcp:server:upsert",
            {"name": "fx", "command": sys.executable, "args": [FIXTURE], "env": {"FX_TOKEN": "s3cret"}, "toolTimeoutS": 10},
        )
        assert info["envKeys"] == ["FX_TOKEN"] and "s3cret" not in str(info)
        assert info["status"] == "connecting"
        session = await proc.call("chat:session:create", {})
        await proc.call("tool:policy:set", {"key": "mcp:fx", "policy": "auto"})
        ready = await wait_status(proc, "fx", {"ready"})
        assert "mcp__fx__echo" in ready["tools"] and ready["error"] is None
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
        # the reply does not wait for the reconnect: the next call is an error at once
        assert results["m3"]["isError"] and "not connected" in results["m3"]["output"]
        await wait_status(proc, "fx", {"ready"})  # reconnected in the background
        await server.script(
            {"tool_calls": [{"id": "m4", "name": "mcp__fx__add", "arguments": {"a": 1, "b": 2}}]},
            {"text": "Done again."},
        )
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "again"}})
        assert (await wait_final(proc, sent["messageId"], timeout=60))["type"] == "stream_end"
        results = {e["toolResult"]["toolCallId"]: e["toolResult"] for e in events_of(proc, sent["messageId"]) if e["type"] == "tool_result"}
        assert results["m4"]["output"] == "3"
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
    code = (
        "import anyio\n"
        "from sidecar.config import Config\n"
        "from sidecar.app import open_app\n"
        "async def main():\n"
        "    async def notify(m, p): pass\n"
        f"    async with open_app(Config(data_dir={str(tmp_path)!r}), notify) as app:\n"
        "        assert app.tools is not None and app.mcp is not None\n"
        "anyio.run(main)\n"
    )
    assert modules_loaded_by(code, ("mcp", "jsonschema")) == []


async def test_an_http_mcp_server(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        async with http_fixture() as (url, process), McpManager.open(AsyncStore(store)) as manager:
            await manager.upsert_server(
                McpServerUpsertParams(name="web", transport="http", url=url, connect_timeout_s=5, tool_timeout_s=5)
            )
            await wait_state(manager, "web", {"ready"})
            assert "mcp__web__echo" in {t.name for t in manager.tools()}
            with anyio.fail_after(30):
                out = await manager.call("web", "add", {"a": 20, "b": 22})
            assert out.text == "42"
            # the server goes away: a call fails fast, the supervisor backs off and retries
            process.kill()
            await process.wait()
            with pytest.raises(ToolError):
                with anyio.fail_after(15):
                    await manager.call("web", "add", {"a": 1, "b": 1})
            failed = await wait_state(manager, "web", {"failed"})
            assert failed.error and failed.retry_at
    finally:
        store.close()


async def test_what_a_server_writes_while_shutting_down_is_still_drained(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.children.stderr")
    # the fixture server, with a last stderr line written after stdin closed (at exit)
    wrapper = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: (sys.stderr.write('bye from the server\\n'), sys.stderr.flush()))\n"
        f"sys.argv = [{FIXTURE!r}]\n"
        f"runpy.run_path({FIXTURE!r}, run_name='__main__')\n"
    )
    store = Store(tmp_path)
    try:
        async with McpManager.open(AsyncStore(store)) as manager:
            await manager.upsert_server(McpServerUpsertParams(name="fx", command=sys.executable, args=["-c", wrapper]))
            await wait_state(manager, "fx", {"ready"})
            with anyio.fail_after(30):
                out = await manager.call("fx", "add", {"a": 1, "b": 2})
            assert out.text == "3"
    finally:
        store.close()
    assert "mcp fx: bye from the server" in caplog.text


def test_server_config_reprs_keep_secrets_out() -> None:
    config = McpServerConfig(
        name="s", command="srv", args=["--token", "arg-secret-1"], env={"API_KEY": "env-secret-1"},
        url="https://u:pw-secret-1@mcp.test/x?key=query-secret-1", headers={"Authorization": "Bearer hdr-secret-1"},
    )
    for text in (repr(config), str(config), repr(list(config.__rich_repr__()))):
        for secret in ("arg-secret-1", "env-secret-1", "pw-secret-1", "query-secret-1", "hdr-secret-1"):
            assert secret not in text, (secret, text)
        assert "API_KEY" in text and "Authorization" in text
