"""Over the subprocess: a stop that comes while the services are still opening. Every
request read before ``sidecar:shutdown`` (or the end of input) is answered before the
process exits; the ones after it are refused BUSY."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest
from sidecar_proc import SidecarProcess, spawn_sidecar

from protocol.errors import ErrorCode

pytestmark = [pytest.mark.anyio, pytest.mark.sidecar_subprocess]  # exit, stdio, what a host writes at once

UPSERT = {"name": "P", "type": "openai-compat", "baseUrl": "http://127.0.0.1:9/v1", "apiKey": "sk-x"}
WAITS = "the stop waits for "


def _lines(*messages: tuple[Any, str, Any]) -> bytes:
    out = b""
    for request_id, method, params in messages:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        out += json.dumps(message).encode() + b"\n"
    return out


async def _one_migration_behind(data: Path) -> apsw.Connection:
    """A data dir whose store the App must migrate (the last migration runs again), and a
    connection holding its write lock: the App's store waits for it (SQLite's busy timeout)."""
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        await proc.close()
    db = apsw.Connection(str(data / "chat.db"))
    version = db.execute("PRAGMA user_version").fetchall()[0][0]
    db.execute(f"PRAGMA user_version = {version - 1}")
    db.execute("BEGIN IMMEDIATE")
    return db


async def _until_waiting_or_exit(proc: SidecarProcess) -> None:
    """Until the sidecar says its stop waits for an earlier request, or it has exited (a
    process that stops at once, losing that request)."""
    async with anyio.create_task_group() as tg:

        async def first(wait: Any) -> None:
            await wait()
            tg.cancel_scope.cancel()

        tg.start_soon(first, lambda: proc.wait_stderr(WAITS, timeout=20))
        tg.start_soon(first, lambda: proc.wait_exit(timeout=20))


@pytest.mark.parametrize("stop", ["shutdown", "end of input"])
async def test_a_request_read_before_the_stop_is_answered_while_the_services_open(tmp_path: Path, stop: str) -> None:
    data = tmp_path / "data"
    db = await _one_migration_behind(data)
    waiting = _lines(("u", "provider:upsert", UPSERT))
    if stop == "shutdown":
        waiting += _lines(("s", "sidecar:shutdown", None), ("late", "provider:list", {}))
    try:
        async with spawn_sidecar(data, waiting=waiting, env={"CHAT_SIDECAR_LOG_LEVEL": "INFO"}) as proc:
            if stop == "end of input":
                await proc.close_stdin()
            await _until_waiting_or_exit(proc)
            db.execute("ROLLBACK")  # the App's store opens now
            assert (await proc.response("u"))["result"]["name"] == "P"
            if stop == "shutdown":
                assert (await proc.response("s"))["result"] == {"success": True}
                assert (await proc.response("late"))["error"]["code"] == ErrorCode.BUSY
                await proc.close_stdin()
            await proc.assert_exit(0)
    finally:
        db.close()
    async with spawn_sidecar(data) as proc:  # the upsert was stored
        assert [p["name"] for p in await proc.call("provider:list", {})] == ["P"]
        await proc.close()


async def test_a_request_held_up_by_an_opening_that_ends_short_is_answered_cancelled() -> None:
    from sidecar.errors import SidecarError
    from sidecar.startup import Startup, Step

    startup = Startup()
    codes: list[int] = []
    settled = anyio.Event()

    async def held() -> None:
        with pytest.raises(SidecarError) as err:
            await startup.after(Step.SERVICES, lambda: anyio.sleep(0))
        codes.append(err.value.code)

    async def orderly_stop() -> None:
        await startup.settle()
        settled.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(held)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(orderly_stop)
            startup.reach(Step.STORE)  # not the step it needs: it keeps waiting, and the stop too
            await anyio.wait_all_tasks_blocked()
            assert codes == [] and not settled.is_set() and startup.held == 1
            startup.end()  # the App stopped opening (a signal, a failure)
    assert codes == [ErrorCode.REQUEST_CANCELLED] and settled.is_set() and startup.held == 0
