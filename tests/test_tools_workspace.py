"""Workspace tools, large-output spill and the registry's handling of bad calls."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from protocol.types import SessionV2
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj
from sidecar.tools.local import CurrentTime, ReadToolOutput
from sidecar.tools.registry import ToolRegistry
from sidecar.tools.spill import PREVIEW_BYTES, SPILL_BYTES, legacy_spill_name, maybe_spill, spill_name
from sidecar.children.command import run_command
from sidecar.tools.workspace import MAX_CAPTURE_BYTES, MAX_PATH_CHARS, resolve_in, workspace_tools

pytestmark = pytest.mark.anyio


def ctx(tmp_path: Path, workspace: Path | None, call_id: str = "call_1") -> ToolContext:
    session = SessionV2(id="s", provider_id="p", model_id="m", created_at=0, updated_at=0,
                        workspace_dir=str(workspace) if workspace else None)
    return ToolContext(session=session, message_id="m1", tool_call_id=call_id,
                       data_dir=tmp_path / "data", workspace=workspace)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("outside")
    os.symlink(tmp_path / "secret.txt", root / "link_out.txt")
    os.symlink(tmp_path, root / "dir_out")
    os.symlink(root / "sub" / "f.txt", root / "link_in.txt")
    return root


def tools_by_name() -> dict[str, Tool]:
    return {t.name: t for t in workspace_tools(5.0)}


# ---- confinement -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("../secret.txt", "'..'"),
        ("sub/../../secret.txt", "'..'"),
        ("..\\secret.txt", "'..'"),
        ("/etc/passwd", "absolute"),
        ("C:\\Windows\\win.ini", "absolute"),
        ("link_out.txt", "outside the workspace"),
        ("dir_out/secret.txt", "outside the workspace"),
        ("a" * (MAX_PATH_CHARS + 1), "too long"),
        ("x/" + "b" * 300, "longer than 255"),
        ("bad\x00name", "NUL"),
    ],
)
def test_paths_outside_the_root_are_refused(ws: Path, path: str, fragment: str) -> None:
    with pytest.raises(ToolError) as err:
        resolve_in(ws, path)
    assert fragment in str(err.value)


def test_paths_inside_are_resolved(ws: Path) -> None:
    assert resolve_in(ws, "sub/f.txt") == (ws / "sub" / "f.txt").resolve()
    assert resolve_in(ws, "./sub//f.txt") == (ws / "sub" / "f.txt").resolve()
    assert resolve_in(ws, "link_in.txt") == (ws / "sub" / "f.txt").resolve()  # a link that stays inside
    assert resolve_in(ws, "") == ws.resolve()
    assert resolve_in(ws, "new/dir/file.txt") == ws.resolve() / "new" / "dir" / "file.txt"


@pytest.mark.parametrize("name", ["workspace_read_file", "workspace_write_file"])
@pytest.mark.parametrize("path", ["../secret.txt", "/tmp/f-escape.txt", "link_out.txt", "dir_out/new.txt", "z" * 2000])
async def test_tools_refuse_escapes_and_touch_nothing(tmp_path: Path, ws: Path, name: str, path: str) -> None:
    registry = ToolRegistry(workspace_tools(5.0))
    args: dict[str, Any] = {"path": path}
    if name == "workspace_write_file":
        args["content"] = "pwned"
    checked = registry.check(name, json.dumps(args))
    assert checked.error is None
    out = await registry.execute(checked, ctx(tmp_path, ws))
    assert out.is_error
    assert any(w in out.text for w in ("'..'", "absolute", "outside the workspace", "too long")), out.text
    assert "outside" not in out.text or "leads outside" in out.text
    assert (tmp_path / "secret.txt").read_text() == "outside"
    assert not (tmp_path / "new.txt").exists() and not Path("/tmp/f-escape.txt").exists()


async def test_read_write_list(tmp_path: Path, ws: Path) -> None:
    t = tools_by_name()
    c = ctx(tmp_path, ws)
    out = await t["workspace_write_file"].run({"path": "notes/a.md", "content": "héllo"}, c)
    assert "wrote 6 bytes to notes/a.md" == out.text
    assert (ws / "notes" / "a.md").read_text() == "héllo"
    assert (await t["workspace_read_file"].run({"path": "notes/a.md"}, c)).text == "héllo"
    listing = (await t["workspace_list"].run({}, c)).text
    assert "dir\t0\tnotes" in listing and "link\t" in listing
    (ws / "big.txt").write_text("x" * 1000)
    part = (await t["workspace_read_file"].run({"path": "big.txt", "offset": 10, "length": 5}, c)).text
    assert part.startswith("xxxxx\n\n[bytes 10..15 of 1000; read on with offset=15]")
    with pytest.raises(ToolError, match="no workspace"):
        await t["workspace_list"].run({}, ctx(tmp_path, None))


async def test_run_command_output_exit_code_and_timeout(tmp_path: Path, ws: Path) -> None:
    t = tools_by_name()["workspace_run_command"]
    out = await t.run({"command": "pwd; echo err >&2; exit 3"}, ctx(tmp_path, ws))
    assert out.is_error and out.text.startswith("exit code 3\n")
    assert str(ws.resolve()) in out.text and "err" in out.text
    with anyio.fail_after(10):
        out = await t.run({"command": "sleep 30", "timeout_s": 0.3}, ctx(tmp_path, ws))
    assert out.is_error and out.text.startswith("timed out after 0.3 s")
    done = await run_command("head -c 3000000 /dev/zero | tr '\\0' y", ws, 20, max_capture=MAX_CAPTURE_BYTES)
    assert done.code == 0 and len(done.output) == 1024 * 1024 and done.dropped == 3000000 - 1024 * 1024
    assert not done.timed_out


async def test_cancelling_a_command_kills_its_process_group(tmp_path: Path, ws: Path) -> None:
    t = tools_by_name()["workspace_run_command"]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(t.run, {"command": "sleep 60 & echo $! > child.pid; wait"}, ctx(tmp_path, ws))
            while not (ws / "child.pid").exists() or not (ws / "child.pid").read_text().strip():
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        child = int((ws / "child.pid").read_text())
        while _alive(child):
            await anyio.sleep(0.01)


@pytest.mark.parametrize(
    "command, timeout",
    [
        # the child holds stdout open: the read waits out the timeout, then the group dies
        ("sleep 57 & echo $! > child.pid; echo started", 0.5),
        # the child let go of stdout: the command returns at once and the child still dies
        ("sleep 57 > /dev/null 2>&1 & echo $! > child.pid; echo started", 20),
    ],
)
async def test_background_children_do_not_outlive_the_command(ws: Path, command: str, timeout: float) -> None:
    with anyio.fail_after(15):
        done = await run_command(command, ws, timeout, max_capture=MAX_CAPTURE_BYTES)
        assert done.code == 0 and "started" in done.output
        child = int((ws / "child.pid").read_text())
        while _alive(child):
            await anyio.sleep(0.01)


# ---- spill -----------------------------------------------------------------------------


async def test_a_1_mib_output_spills_with_a_4_kib_preview(tmp_path: Path, ws: Path) -> None:
    class Big(Tool):
        name = "big"

        async def run(self, args: dict[str, Any], c: ToolContext) -> ToolOutput:
            return ToolOutput(text="é" + "0123456789abcdef" * 65536)  # > 1 MiB, a 2-byte char first

    registry = ToolRegistry([Big(), ReadToolOutput()])
    for workspace in (ws, None):
        out = await registry.execute(registry.check("big", "{}"), ctx(tmp_path, workspace, "call_big"))
        full = "é" + "0123456789abcdef" * 65536
        name = spill_name("s", "call_big")
        base = (workspace if workspace else tmp_path / "data") / "tool_outputs" / name
        assert base.read_text() == full
        preview, _, note = out.text.partition("\n\n[output truncated: ")
        assert full.startswith(preview) and len(preview.encode()) in (PREVIEW_BYTES, PREVIEW_BYTES - 1)
        assert f"{len(full.encode())} bytes in total" in note and f"tool_outputs/{name}" in note
        if workspace is None:
            assert 'read_tool_output(tool_call_id="call_big"' in note
            again = await ReadToolOutput().run({"tool_call_id": "call_big", "offset": 2, "length": 16}, ctx(tmp_path, None))
            assert again.text.startswith("0123456789abcdef\n[bytes 2..18 of")
        else:
            assert f'workspace_read_file(path="tool_outputs/{name}"' in note
    small = maybe_spill("x" * SPILL_BYTES, "s", "c", None, tmp_path)
    assert small == "x" * SPILL_BYTES


class Big(Tool):
    name = "big"

    async def run(self, args: dict[str, Any], c: ToolContext) -> ToolOutput:
        return ToolOutput(text="y" * (SPILL_BYTES + 1))


@pytest.mark.parametrize("planted", ["folder", "file", "file_inside"])
async def test_spill_files_never_leave_the_workspace_through_symlinks(tmp_path: Path, ws: Path, planted: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "call_x.txt").write_text("precious")
    if planted == "folder":
        os.symlink(outside, ws / "tool_outputs")
    else:
        (ws / "tool_outputs").mkdir()
        target = outside / "call_x.txt" if planted == "file" else ws / "sub" / "f.txt"
        os.symlink(target, ws / "tool_outputs" / spill_name("s", "call_x"))
    registry = ToolRegistry([Big(), ReadToolOutput()])
    out = await registry.execute(registry.check("big", "{}"), ctx(tmp_path, ws, "call_x"))
    assert "saving it failed" in out.text
    assert (outside / "call_x.txt").read_text() == "precious" and (ws / "sub" / "f.txt").read_text() == "inside"
    assert sorted(p.name for p in outside.iterdir()) == ["call_x.txt"]
    # reading does not go through the symlink either (nor falls back past it)
    read = await registry.execute(registry.check("read_tool_output", '{"tool_call_id": "call_x"}'), ctx(tmp_path, ws))
    why = "symbolic link" if planted == "file_inside" else "leads outside the workspace"
    assert read.is_error and why in read.text and "precious" not in read.text
    assert why in out.text


def test_spill_names_from_untrusted_ids() -> None:
    assert legacy_spill_name("call_AbC-1") == "call_AbC-1.txt"
    tag, _, rest = spill_name("s1", "call_AbC-1").partition("-")
    assert rest == "call_AbC-1.txt" and len(tag) == 16
    assert spill_name("s2", "call_AbC-1") != spill_name("s1", "call_AbC-1")  # one file per session
    for bad in ("../../etc/passwd", "a/b", "x" * 200, "", "id with space"):
        name = legacy_spill_name(bad)
        assert name.startswith("call-") and "/" not in name and len(name) == 41
        assert spill_name("s1", bad) == f"{tag}-{name}"


# ---- bad calls ---------------------------------------------------------------------------


class Boom(Tool):
    name = "boom"

    async def run(self, args: dict[str, Any], c: ToolContext) -> ToolOutput:
        raise RuntimeError("kaput")


class Slow(Tool):
    name = "slow"
    timeout_s = 0.2

    async def run(self, args: dict[str, Any], c: ToolContext) -> ToolOutput:
        await anyio.sleep(30)
        return ToolOutput(text="never")


class Strict(Tool):
    name = "strict"
    parameters = obj({"n": {"type": "integer", "minimum": 1}}, ["n"])

    async def run(self, args: dict[str, Any], c: ToolContext) -> ToolOutput:
        return ToolOutput(text=str(args["n"] * 2))


async def test_bad_calls_become_error_results(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    registry = ToolRegistry([Boom(), Slow(), Strict(), CurrentTime()])
    assert "unknown tool 'nope'" in registry.check("nope", "{}").error
    assert "not valid JSON" in registry.check("strict", '{"n": ').error
    assert "must be a JSON object" in registry.check("strict", "[1, 2]").error
    problem = registry.check("strict", '{"n": 0}').error
    assert "do not match its schema" in problem and "minimum" in problem and "(at n)" in problem
    assert "'n' is a required property" in registry.check("strict", "{}").error
    assert "Additional properties" in registry.check("strict", '{"n": 2, "x": 1}').error
    assert registry.check("get_current_time", "").error is None  # empty arguments mean {}
    ok = await registry.execute(registry.check("strict", '{"n": 21}'), ctx(tmp_path, None))
    assert ok == ToolOutput(text="42")
    boom = await registry.execute(registry.check("boom", "{}"), ctx(tmp_path, None))
    assert boom.is_error and "RuntimeError: kaput" in boom.text
    with anyio.fail_after(5):
        slow = await registry.execute(registry.check("slow", "{}"), ctx(tmp_path, None))
    assert slow.is_error and "timed out after 0.2 s" in slow.text


class Loose(Tool):
    name = "loose"

    def __init__(self, schema: dict[str, Any]) -> None:
        self.parameters = schema

    async def run(self, args: dict[str, Any], c: ToolContext) -> ToolOutput:
        return ToolOutput(text=f"ran with {sorted(args)}")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
        {"type": "object", "properties": {"x": {"type": "bogus"}}},
        {"type": "object", "properties": {"x": {"type": "string", "pattern": "("}}},
        {"type": "object", "properties": {"x": {"$ref": "https://unreachable.invalid/s.json"}}},
    ],
)
async def test_a_broken_tool_schema_checks_nothing_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, schema: dict[str, Any]
) -> None:
    registry = ToolRegistry([Loose(schema)])
    for _ in range(3):
        checked = registry.check("loose", '{"x": "a"}')
        assert checked.error is None and checked.args == {"x": "a"}
    out = await registry.execute(checked, ctx(tmp_path, None))
    assert out == ToolOutput(text="ran with ['x']")
    assert len([r for r in caplog.records if "JSON Schema is unusable" in r.getMessage()]) == 1, caplog.text


async def test_execute_propagates_cancellation(tmp_path: Path) -> None:
    registry = ToolRegistry([Slow()])
    registry.get("slow").timeout_s = 60
    with anyio.fail_after(5):
        with anyio.move_on_after(0.1) as scope:
            await registry.execute(registry.check("slow", "{}"), ctx(tmp_path, None))
    assert scope.cancelled_caught


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
