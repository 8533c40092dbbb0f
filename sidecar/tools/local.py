"""Built-in local tools (always cheap, read-only): the current time, reading a spilled
tool output, and ``get_session_capabilities`` (what this request really offers).

``read_tool_output`` reads only outputs of the calling session: the file name is made
from the session's own id and the given tool call id (sidecar/tools/spill.py), so no id
names another session's file; an untagged file of an older version is read only when
``owners`` (the store's record of who owns a file) names this session and no other.

LOCAL_TOOLS maps the names settings may enable (ToolSettings.localTools) to factories.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio

from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj
from sidecar.tools.spill import OUTPUT_DIR, legacy_spill_name, open_spill, spill_name, spill_path

__all__ = ["LOCAL_TOOLS", "ReadToolOutput", "SessionCapabilities", "SpillOwners"]

READ_SLICE_BYTES = 16 * 1024

SpillOwners = Callable[[str, str], Awaitable[set[str]]]
"""``(root, path) -> ids of the sessions owning that file`` (FileRepo.owners: root "" is the
data dir, else the workspace as the session names it; path ``tool_outputs/<name>``)."""


class CurrentTime(Tool):
    name = "get_current_time"
    description = "The current date and time (ISO 8601), in a given IANA time zone or the local one."
    parameters = obj({"timezone": {"type": "string", "description": "e.g. Europe/Paris; default local."}})

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        zone_name = args.get("timezone")
        if zone_name:
            try:
                zone: dt.tzinfo | None = ZoneInfo(zone_name)
            except (ZoneInfoNotFoundError, ValueError):
                raise ToolError(f"unknown time zone {zone_name!r}") from None
            now = dt.datetime.now(zone)
        else:
            now = dt.datetime.now().astimezone()
        return ToolOutput(text=now.isoformat(timespec="seconds"))


class ReadToolOutput(Tool):
    name = "read_tool_output"
    description = "Read a slice of a large tool output that was saved to a file (by tool call id)."
    parameters = obj(
        {
            "tool_call_id": {"type": "string"},
            "offset": {"type": "integer", "minimum": 0},
            "length": {"type": "integer", "minimum": 1, "maximum": 65536},
        },
        ["tool_call_id"],
    )
    source = "system"

    def __init__(self, owners: SpillOwners | None = None) -> None:
        """``owners``: the store's file ownership; None reads no file of an older version."""
        self._owners = owners

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        offset = int(args.get("offset", 0))
        length = int(args.get("length", READ_SLICE_BYTES))
        call_id = args["tool_call_id"]
        name = spill_name(ctx.session.id, call_id)

        def read_own() -> str | None:
            for workspace in (ctx.workspace, None):
                text = _read_slice(spill_path(workspace, ctx.data_dir, name), offset, length)
                if text is not None:
                    return text
            return None

        found = await anyio.to_thread.run_sync(read_own)
        if found is None and self._owners is not None:  # an untagged file of an older version
            legacy = legacy_spill_name(call_id)
            for workspace in (ctx.workspace, None):
                root = "" if workspace is None else str(workspace)
                if await self._owners(root, f"{OUTPUT_DIR}/{legacy}") == {ctx.session.id}:
                    path = spill_path(workspace, ctx.data_dir, legacy)
                    found = await anyio.to_thread.run_sync(_read_slice, path, offset, length)
                    break
        if found is None:
            raise ToolError(f"no saved output for tool call {call_id!r}")
        return ToolOutput(text=found)


def _read_slice(path: Path, offset: int, length: int) -> str | None:
    """``length`` bytes of the spill file at ``path`` from ``offset`` (None: no such file)."""
    if not os.path.lexists(path):
        return None
    try:
        fd = open_spill(path, write=False)  # never through a symlink
    except OSError as exc:
        raise ToolError(f"the saved output {path.name} cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ToolError(f"the saved output {path.name} is not a regular file")
        size = os.fstat(f.fileno()).st_size
        f.seek(offset)
        data = f.read(length)
    end = offset + len(data)
    more = f"\n[bytes {offset}..{end} of {size}]" if end < size else ""
    return data.decode("utf-8", errors="replace") + more


class SessionCapabilities(Tool):
    name = "get_session_capabilities"
    description = (
        "Which tools and retrieval modes this conversation really has right now. Call it before "
        "claiming you can (or cannot) search, read files, run commands or use a tool."
    )
    source = "system"

    def __init__(self, describe: Callable[[], dict[str, Any]]) -> None:
        self._describe = describe

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(text=json.dumps(self._describe(), ensure_ascii=False, indent=1))


LOCAL_TOOLS: dict[str, Callable[[], Tool]] = {
    "get_current_time": CurrentTime,
}
