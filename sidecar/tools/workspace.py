"""Workspace tools: read, write, list and run a command inside the session's workspace dir.

Confinement: every path is checked with the project's one rule (``sidecar/confine.py``,
relative paths only, no ``..``, symlinks that lead out refused) before any file is touched,
and files are opened without following a symlink at their name.
What is NOT promised: a shell command run with ``workspace_run_command`` starts in the
workspace but is not sandboxed (it can ``cd /``); that is why it asks for approval by
default.

Commands run through ``sidecar/children/command.py`` (the one way the sidecar runs a
child: its own process group, stdin closed, the allow-listed environment and no other
variable of ours, stdout+stderr captured up to MAX_CAPTURE_BYTES, a timeout, the whole
group killed when the command ends, so background children do not outlive it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

from sidecar import confine
from sidecar.children.command import run_command
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj

__all__ = ["resolve_in", "workspace_tools", "MAX_PATH_CHARS", "MAX_READ_BYTES"]

MAX_PATH_CHARS = confine.MAX_PATH_CHARS
MAX_READ_BYTES = 256 * 1024
MAX_WRITE_CHARS = 4 * 1024 * 1024
MAX_LIST_ENTRIES = 1000
MAX_CAPTURE_BYTES = 1024 * 1024
MAX_COMMAND_CHARS = 16 * 1024


def workspace_root(ctx: ToolContext) -> Path:
    if ctx.workspace is None:
        raise ToolError("this session has no workspace directory")
    root = ctx.workspace
    if not root.is_dir():
        raise ToolError(f"the workspace directory {root} does not exist")
    return root.resolve()


def resolve_in(root: Path, path: str) -> Path:
    """``path`` (relative, as the model gave it) as a real path inside ``root``, or ToolError."""
    try:
        return confine.resolve_in(root, path, relative=True, what="the workspace")
    except confine.PathRefused as exc:
        raise ToolError(str(exc)) from None


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() or "."


class ReadFile(Tool):
    name = "workspace_read_file"
    description = (
        "Read a text file of the workspace. Paths are relative to the workspace root. "
        f"Returns at most {MAX_READ_BYTES} bytes from `offset` (a byte offset); read on with a larger offset."
    )
    parameters = obj(
        {
            "path": {"type": "string", "description": "File path relative to the workspace root."},
            "offset": {"type": "integer", "minimum": 0, "description": "Byte offset to start at."},
            "length": {"type": "integer", "minimum": 1, "maximum": MAX_READ_BYTES},
        },
        ["path"],
    )
    source = "workspace"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        root = workspace_root(ctx)
        target = resolve_in(root, args["path"])
        offset = int(args.get("offset", 0))
        length = int(args.get("length", MAX_READ_BYTES))
        return ToolOutput(text=await anyio.to_thread.run_sync(read_slice, target, offset, length, args["path"]))


def read_slice(target: Path, offset: int, length: int, shown: str) -> str:
    if not target.exists():
        raise ToolError(f"no file {shown!r} in the workspace")
    if target.is_dir():
        raise ToolError(f"{shown!r} is a directory: use workspace_list")
    with os.fdopen(confine.open_nofollow(target), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(offset)
        data = f.read(length)
    if b"\x00" in data[:8192]:
        raise ToolError(f"{shown!r} looks like a binary file ({size} bytes); only text can be read")
    text = data.decode("utf-8", errors="replace")
    end = offset + len(data)
    if end < size:
        text += f"\n\n[bytes {offset}..{end} of {size}; read on with offset={end}]"
    return text


class WriteFile(Tool):
    name = "workspace_write_file"
    description = (
        "Create or overwrite a text file in the workspace (parent folders are created). "
        "Paths are relative to the workspace root."
    )
    parameters = obj(
        {
            "path": {"type": "string"},
            "content": {"type": "string"},
            "append": {"type": "boolean", "description": "Append instead of overwriting."},
        },
        ["path", "content"],
    )
    source = "workspace"
    default_policy = "ask"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        root = workspace_root(ctx)
        content = args["content"]
        if len(content) > MAX_WRITE_CHARS:
            raise ToolError(f"content is too long ({len(content)} characters, at most {MAX_WRITE_CHARS})")
        target = resolve_in(root, args["path"])
        if target == root:
            raise ToolError("path must name a file, not the workspace root")

        def write() -> int:
            if target.is_dir():
                raise ToolError(f"{args['path']!r} is a directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            # re-check after mkdir: the parent chain is now real and must still be inside
            resolve_in(root, _rel(root, target))
            data = content.encode("utf-8")
            with os.fdopen(confine.open_nofollow(target, write=True, append=bool(args.get("append"))), "wb") as f:
                f.write(data)
            return len(data)

        written = await anyio.to_thread.run_sync(write)
        return ToolOutput(text=f"wrote {written} bytes to {_rel(root, target)}")


class ListDir(Tool):
    name = "workspace_list"
    description = "List the entries of a workspace folder (relative path, default the root)."
    parameters = obj({"path": {"type": "string"}})
    source = "workspace"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        root = workspace_root(ctx)
        target = resolve_in(root, args.get("path", "."))

        def listing() -> str:
            if not target.is_dir():
                raise ToolError(f"{args.get('path', '.')!r} is not a folder of the workspace")
            entries = sorted(target.iterdir(), key=lambda p: p.name)
            lines = []
            for entry in entries[:MAX_LIST_ENTRIES]:
                if entry.is_symlink():
                    kind = "link"
                elif entry.is_dir():
                    kind = "dir"
                else:
                    kind = "file"
                size = entry.lstat().st_size if kind == "file" else 0
                lines.append(f"{kind}\t{size}\t{entry.name}")
            if len(entries) > MAX_LIST_ENTRIES:
                lines.append(f"... and {len(entries) - MAX_LIST_ENTRIES} more entries")
            return "\n".join(lines) or "(empty folder)"

        return ToolOutput(text=await anyio.to_thread.run_sync(listing))


class RunCommand(Tool):
    name = "workspace_run_command"
    description = (
        "Run a shell command with the workspace root as its working directory. Returns its exit "
        "code and output (stdout and stderr together)."
    )
    parameters = obj(
        {
            "command": {"type": "string"},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        },
        ["command"],
    )
    source = "workspace"
    default_policy = "ask"

    def __init__(self, default_timeout_s: float) -> None:
        self.default_timeout_s = default_timeout_s
        # the command's own limit applies; the loop's tool timeout must not cut it first
        self.timeout_s = 3600.0

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        root = workspace_root(ctx)
        command = args["command"]
        if not command.strip():
            raise ToolError("command is empty")
        if len(command) > MAX_COMMAND_CHARS:
            raise ToolError(f"command is too long (at most {MAX_COMMAND_CHARS} characters)")
        timeout = float(args.get("timeout_s") or self.default_timeout_s)
        done = await run_command(command, root, timeout, max_capture=MAX_CAPTURE_BYTES)
        tail = f"\n[{done.dropped} more bytes of output not kept]" if done.dropped else ""
        if done.timed_out:
            return ToolOutput(text=f"timed out after {timeout:g} s (killed)\n{done.output}{tail}", is_error=True)
        return ToolOutput(text=f"exit code {done.code}\n{done.output}{tail}", is_error=done.code != 0)


def workspace_tools(command_timeout_s: float) -> list[Tool]:
    return [ReadFile(), WriteFile(), ListDir(), RunCommand(command_timeout_s)]
