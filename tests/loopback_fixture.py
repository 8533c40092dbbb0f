"""Run a fixture server script as a subprocess for a test: it prints ``PORT <n>`` on its
first line, then serves on loopback until it is killed (when the ``async with`` ends,
whatever happened in it)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio


@asynccontextmanager
async def fixture_port(script: Path, *args: str) -> AsyncIterator[int]:
    """The port ``script`` serves on (``python script --port 0 ARGS...``)."""
    process = await anyio.open_process([sys.executable, str(script), "--port", "0", *args])
    try:
        assert process.stdout is not None
        with anyio.fail_after(10):
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(64)
        yield int(line.split()[1])
    finally:
        with anyio.CancelScope(shield=True):
            process.kill()
            with anyio.move_on_after(5):
                await process.wait()
            await process.aclose()
