"""An ACP agent's file reads and writes, over the subprocess, while another thread swaps
the file for a symlink that leads out of the session's working directory: no read ever
returns the outside file and no write ever lands outside (the confinement rule's
no-follow open, sidecar/confine.py)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from acp_helpers import acp_session, add_engine, send_and_wait
from chat_helpers import events_of, streamed_text
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

READS = 4000
INSIDE = "inside text"
OUTSIDE = "OUTSIDE SECRET"


@contextmanager
def swapping(name: Path, outside: Path) -> Iterator[list[int]]:
    """Swap ``name`` between a regular file and a symlink to ``outside`` (each swap atomic,
    by rename) until the block ends; yields the swap count."""
    stop = threading.Event()
    swaps = [0]

    def run() -> None:
        link, plain = name.with_name(name.name + ".link"), name.with_name(name.name + ".plain")
        while not stop.is_set():
            for prepare, staged in ((lambda p: os.symlink(outside, p), link), (lambda p: p.write_text(INSIDE), plain)):
                try:
                    staged.unlink()
                except FileNotFoundError:
                    pass
                prepare(staged)
                os.replace(staged, name)
                swaps[0] += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield swaps
    finally:
        stop.set()
        thread.join(10)
        assert not thread.is_alive()


async def test_racing_symlink_swaps_never_let_a_read_or_a_write_out(tmp_path: Path) -> None:
    workspace = tmp_path / "work"
    workspace.mkdir()
    target = workspace / "f.txt"
    target.write_text(INSIDE)
    outside = tmp_path / "outside.txt"
    outside.write_text(OUTSIDE)
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc)
        session = await acp_session(proc, engine["id"], workspaceDir=str(workspace))

        with swapping(target, outside) as swaps:
            sent, final = await send_and_wait(proc, session["id"], f"fs-read-many {READS} {target}", timeout=240)
        assert final["type"] == "stream_end", final
        text = streamed_text(events_of(proc, sent["messageId"]))
        tally: dict[str, int] = json.loads(text.removeprefix("tally "))
        assert sum(tally.values()) == READS and swaps[0] > 100, (tally, swaps)
        outside_reads = sum(n for content, n in tally.items() if OUTSIDE in content)
        assert outside_reads == 0, tally
        assert set(tally) <= {INSIDE, "error"}, tally
        assert tally.get(INSIDE, 0) > 0  # reads did happen while the name was a plain file

        # writes: the swapped-in symlink is never followed; the outside file stays as it was
        with swapping(target, outside):
            for _ in range(50):
                await send_and_wait(proc, session["id"], f"fs-write {target}")
        assert outside.read_text() == OUTSIDE
        await proc.close()
