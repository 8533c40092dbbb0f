"""Built-in local tools (always cheap, read-only): the current time, reading a spilled
tool output, and ``get_session_capabilities`` (what this request really offers).

LOCAL_TOOLS maps the names settings may enable (ToolSettings.localTools) to factories.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio

from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj
from sidecar.tools.spill import open_spill, spill_name, spill_path

__all__ = ["LOCAL_TOOLS", "ReadToolOutput", "SessionCapabilities"]

READ_SLICE_BYTES = 16 * 1024


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

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        offset = int(args.get("offset", 0))
        length = int(args.get("length", READ_SLICE_BYTES))
        name = spill_name(args["tool_call_id"])

        def read() -> str:
            for workspace in (ctx.workspace, None):
                path = spill_path(workspace, ctx.data_dir, name)  # confined to the workspace
                if not os.path.lexists(path):
                    continue
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
            raise ToolError(f"no saved output for tool call {args['tool_call_id']!r}")

        return ToolOutput(text=await anyio.to_thread.run_sync(read))


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
