"""Managed skills over the real server: SKILL.md front matter checked, create /
update / delete in <dataDir>/skills, configured skills folders read-only, zip import confined
(``../`` entries, absolute paths, symlinks and zip bombs refused, nothing written) and export;
skill proposals after multi-tool replies are nothing until accepted."""

from __future__ import annotations

import base64
import io
import json
import stat
import zipfile
from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider, wait_final
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


def skill_md(name: str = "csv-report", description: str = "Turn a CSV file into a short report. Use for CSV files.",
             body: str = "# CSV report\n\n1. Read the file.\n2. Summarize each column.\n", **extra: str) -> str:
    fields = "".join(f"{k}: {v}\n" for k, v in extra.items())
    return f"---\nname: {name}\ndescription: {description}\n{fields}---\n{body}"


def zipped(entries: dict[str, str | bytes], *, symlinks: dict[str, str] | None = None) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return base64.b64encode(buffer.getvalue()).decode()


async def refused(proc: SidecarProcess, method: str, params: dict[str, Any], code: int = -32602) -> str:
    with pytest.raises(CallError) as err:
        await proc.call(method, params)
    assert err.value.code == code, (method, params, err.value.message)
    return err.value.message


async def test_create_update_delete_and_the_front_matter_rules(tmp_path: Path) -> None:
    data = tmp_path / "data"
    external = tmp_path / "team-skills"
    (external / "deploy").mkdir(parents=True)
    (external / "deploy" / "SKILL.md").write_text(skill_md("deploy", "Deploy the app. Use before a release."))
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        await proc.call("tool:settings:update", {"skillsDirs": [str(external)]})
        created = await proc.call("skill:create", {"content": skill_md(license="MIT")})
        assert (created["name"], created["readOnly"], created["valid"]) == ("csv-report", False, True)
        assert Path(created["path"]) == data / "skills" / "csv-report"
        listed = {s["name"]: s for s in await proc.call("skill:list", {})}
        assert set(listed) == {"csv-report", "deploy"} and listed["deploy"]["readOnly"] is True
        detail = await proc.call("skill:get", {"name": "csv-report"})
        assert "license: MIT" in detail["content"] and detail["files"] == []
        # the tools the model gets see it
        session = await proc.call("chat:session:create", {"title": "s"})
        names = [t["name"] for t in await proc.call("tool:list", {"sessionId": session["id"]})]
        assert "skill_load" in names
        updated = await proc.call("skill:update", {"name": "csv-report", "content": skill_md(body="# v2\n")})
        assert updated["name"] == "csv-report"
        assert (data / "skills" / "csv-report" / "SKILL.md").read_text().endswith("# v2\n")
        # the rules, each naming its field
        for content, field in (
            ("# no front matter\n", "content"),
            ("---\nname: x\n", "content"),
            ("---\n: : :\n---\n", "content"),
            ("---\n- a list\n---\n", "content"),
            (skill_md(name="Bad_Name"), "content.name"),
            (skill_md(name="a" * 65), "content.name"),
            ("---\nname: nodesc\n---\nbody", "content.description"),
            (skill_md(description="Use <b>bold</b> tags"), "content.description"),
            (skill_md(description="x" * 1025), "content.description"),
            (skill_md(name="nul", body="a\x00b"), "content"),
        ):
            message = await refused(proc, "skill:create", {"content": content})
            assert f"`$.{field}`" in message, (content[:40], message)
        assert "exists" in await refused(proc, "skill:create", {"content": skill_md()}, -32003)
        assert "exists" in await refused(proc, "skill:create", {"content": skill_md("deploy")}, -32003)
        assert "renamed" in await refused(proc, "skill:update", {"name": "csv-report", "content": skill_md("other")})
        for method, params in (("skill:update", {"name": "deploy", "content": skill_md("deploy")}),
                               ("skill:delete", {"name": "deploy"})):
            assert "read-only" in await refused(proc, method, params, -32003)
        assert (external / "deploy" / "SKILL.md").exists()
        assert await proc.call("skill:delete", {"name": "csv-report"}) == {"success": True}
        assert not (data / "skills" / "csv-report").exists()
        await refused(proc, "skill:get", {"name": "csv-report"}, -32001)
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_zip_import_is_confined_and_export_round_trips(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        good = zipped({"pdf-tools/SKILL.md": skill_md("pdf-tools", "Work with PDF files. Use for PDFs."),
                       "pdf-tools/scripts/split.py": "print('split')\n", "pdf-tools/reference/": ""})
        imported = await proc.call("skill:import", {"data": good})
        assert (imported["name"], imported["files"]) == ("pdf-tools", 1)
        detail = await proc.call("skill:get", {"name": "pdf-tools"})
        assert [f["path"] for f in detail["files"]] == ["scripts/split.py"]
        exported = await proc.call("skill:export", {"name": "pdf-tools"})
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(exported["data"]))) as archive:
            assert sorted(archive.namelist()) == ["pdf-tools/SKILL.md", "pdf-tools/scripts/split.py"]
        assert "exists" in await refused(proc, "skill:import", {"data": good}, -32003)
        replaced = zipped({"SKILL.md": skill_md("pdf-tools", "Work with PDF files, v2.")})  # at the top: fine too
        assert (await proc.call("skill:import", {"data": replaced, "replace": True}))["files"] == 0
        assert (data / "skills" / "pdf-tools" / "SKILL.md").read_text().count("v2") == 1
        # refused archives: nothing written anywhere
        bomb = zipped({"bomb/SKILL.md": skill_md("bomb"), "bomb/zeros.bin": b"\0" * (9 * 1024 * 1024)})
        for archive, needle in (
            (zipped({"evil/SKILL.md": skill_md("evil"), "evil/../../escaped.txt": "x"}), "outside"),
            (zipped({"SKILL.md": skill_md("evil"), "../escaped.txt": "x"}), "outside"),
            (zipped({"SKILL.md": skill_md("evil"), "/tmp/escaped.txt": "x"}), "outside"),
            (zipped({"SKILL.md": skill_md("evil"), "C:/escaped.txt": "x"}), "absolute"),
            (zipped({"SKILL.md": skill_md("evil")}, symlinks={"link": "/etc/passwd"}), "symlink"),
            (zipped({"evil/SKILL.md": skill_md("evil")}, symlinks={"evil/data": "../../.."}), "symlink"),
            (bomb, "more than"),
            (zipped({"readme.txt": "no manifest"}), "SKILL.md"),
            (zipped({"SKILL.md": "# no front matter"}), "SKILL.md"),
            (base64.b64encode(b"not a zip").decode(), "not a zip"),
            ("%%%", "base64"),
        ):
            message = await refused(proc, "skill:import", {"data": archive})
            assert needle in message, (needle, message)
        assert sorted(p.name for p in (data / "skills").iterdir()) == ["pdf-tools"]  # no staging left, no evil
        assert not (tmp_path / "escaped.txt").exists() and not (data / "escaped.txt").exists()
        assert [s["name"] for s in await proc.call("skill:list", {})] == ["pdf-tools"]
        await proc.close()


def proposal_answer(content: str, propose: bool = True) -> dict[str, Any]:
    return {"text": json.dumps({"propose": propose, "reason": "a repeatable procedure", "skill": content}),
            "usage": {"prompt_tokens": 400, "completion_tokens": 120}}


async def test_a_proposed_skill_is_nothing_until_accepted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.csv").write_text("x,y\n1,2\n")
    calls = [{"id": "l1", "name": "workspace_list", "arguments": {}},
             {"id": "r1", "name": "workspace_read_file", "arguments": {"path": "a.csv"}}]
    async with scripted_provider() as chat, spawn_sidecar(data) as proc:
        await configure_provider(proc, chat.base_url)
        session = await proc.call("chat:session:create", {"title": "csv", "workspaceDir": str(workspace)})
        await chat.script({"tool_calls": calls}, {"text": "The CSV has 2 columns."})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "Summarize a.csv"}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        await chat.script(proposal_answer(skill_md("csv-summary", "Summarize a CSV file of the workspace.")))
        result = await proc.call("skill:propose", {"sessionId": session["id"]})
        proposal = result["proposal"]
        assert (proposal["name"], proposal["status"], proposal["messageId"]) == ("csv-summary", "pending",
                                                                                  sent["messageId"])
        assert (await proc.next_notification("skill_proposed"))["id"] == proposal["id"]
        side = [b for b in await chat.requests() if not b.get("stream")][-1]
        shown = side["messages"][1]["content"]
        assert 'name="workspace_read_file"' in shown and "Summarize a.csv" in shown
        # nothing on disk, nothing for the tools, before an answer
        assert await proc.call("skill:list", {}) == [] and not (data / "skills" / "csv-summary").exists()
        assert [p["id"] for p in await proc.call("skill:proposal:list", {"sessionId": session["id"]})] == [proposal["id"]]
        accepted = await proc.call("skill:accept", {"id": proposal["id"]})
        assert accepted["name"] == "csv-summary" and (data / "skills" / "csv-summary" / "SKILL.md").exists()
        await refused(proc, "skill:accept", {"id": proposal["id"]}, -32003)
        # the model declines, or writes a SKILL.md that breaks the rules: no proposal
        await chat.script(proposal_answer("", propose=False))
        assert (await proc.call("skill:propose", {"sessionId": session["id"]}))["proposal"] is None
        await chat.script(proposal_answer("---\nname: Bad Name\ndescription: x\n---\n"))
        declined = await proc.call("skill:propose", {"sessionId": session["id"]})
        assert declined["proposal"] is None and "not valid" in declined["reason"]
        # automatic proposals after a reply with enough tool calls; rejected: still nothing
        await proc.call("skill:settings:update", {"autoPropose": True, "minToolCalls": 2})
        await chat.script({"tool_calls": calls}, {"text": "Again 2 columns."},
                          proposal_answer(skill_md("csv-columns", "Count the columns of a CSV file.")))
        again = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "And again"}})
        assert (await wait_final(proc, again["messageId"]))["type"] == "stream_end"
        auto = await proc.next_notification("skill_proposed", timeout=20)
        assert (auto["name"], auto["messageId"]) == ("csv-columns", again["messageId"])
        assert await proc.call("skill:reject", {"id": auto["id"]}) == {"success": True}
        assert [s["name"] for s in await proc.call("skill:list", {})] == ["csv-summary"]
        assert await proc.call("skill:proposal:list", {}) == []
        # a reply without tool calls has no procedure to propose
        await chat.script({"text": "Hello!"})
        plain = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hi"}})
        await wait_final(proc, plain["messageId"])
        with anyio.fail_after(10):
            while (await proc.call("chat:messages:get", {"sessionId": session["id"]}))[-1]["status"] != "completed":
                await anyio.sleep(0.05)
        await refused(proc, "skill:propose", {"sessionId": session["id"]}, -32003)
        await proc.close()
