"""Cold start over the subprocess: the handshake and the first session list are answered
from the store alone; providers, pipeline, tools, ACP, MCP, jsonschema, jinja2, pypdf...
load afterwards (or when first needed), and every method still works."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio


async def test_the_first_answers_import_no_heavy_module(tmp_path: Path) -> None:
    # no idle warm-up during the test: only the first answers may trigger the loading
    async with spawn_sidecar(tmp_path / "data", "--bench", env={"CHAT_SIDECAR_WARMUP_MS": "600000"}) as proc:
        init_id = await proc.request("sidecar:initialize", {})
        list_id = await proc.request("chat:session:list", {})
        assert "result" in await proc.response(init_id)
        assert (await proc.response(list_id))["result"] == {"sessions": [], "total": 0}
        modules = await proc.call("sidecar:bench:modules", {})
        assert modules["atFirstAnswer"] == [], modules
        # the rest loads in the background, and a method that needs it waits for it
        assert await proc.call("provider:list", {}) == []
        with anyio.fail_after(20):
            while "sidecar.providers" not in (await proc.call("sidecar:bench:modules", {}))["now"]:
                await anyio.sleep(0.05)
        await proc.close()


async def test_an_idle_client_gets_the_services_loaded_without_asking(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data", "--bench", env={"CHAT_SIDECAR_WARMUP_MS": "50"}) as proc:
        await proc.call("sidecar:initialize", {})
        with anyio.fail_after(20):
            while "sidecar.engine.chat" not in (await proc.call("sidecar:bench:modules", {}))["now"]:
                await anyio.sleep(0.05)
        await proc.close()


async def test_shutdown_before_the_services_loaded_is_quick_and_clean(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data", "--bench", env={"CHAT_SIDECAR_WARMUP_MS": "600000"}) as proc:
        await proc.call("sidecar:initialize", {})
        assert (await proc.call("sidecar:bench:modules", {}))["now"] == []  # nothing asked for them
        await proc.call("sidecar:shutdown", {})
        await proc.close_stdin()
        assert await proc.wait_exit(timeout=10) == 0
