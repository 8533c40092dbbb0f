"""Memory upkeep over the real server and the scripted provider: consolidation
(two contradicting memories become one version chain with nothing lost; propose mode waits
for an answer), expiry by policy, statistics, export and import as JSON and Markdown, a
memory-consolidate task, and the encoder reading server-mode replies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest

from chat_helpers import configure_provider, wait_final
from memory_helpers import active, assistant
from qiming_helpers import configure, qiming_server
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

DAY = 86_400_000


def merges(*items: dict[str, Any]) -> dict[str, Any]:
    return {"text": json.dumps({"merges": list(items)}), "usage": {"prompt_tokens": 200, "completion_tokens": 30}}


async def remember(proc: SidecarProcess, scope: str, *texts: str, **extra: Any) -> list[dict[str, Any]]:
    return [await proc.call("memory:create", {"text": t, "scope": scope, **extra}) for t in texts]


async def test_contradicting_memories_become_one_version_chain_and_nothing_is_lost(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook")
        lyon, paris, tea = await remember(proc, "cook", "The user lives in Lyon.", "The user lives in Paris now.",
                                          "The user likes green tea.")
        await chat.script(merges({"ids": [paris["id"], lyon["id"]], "text": "The user lives in Paris (moved from Lyon).",
                                  "kind": "fact", "contradiction": True, "reason": "Paris is newer"}))
        result = await proc.call("memory:consolidate", {"scope": "cook", "mode": "auto"})
        assert (result["mode"], result["examined"], result["groups"], result["proposed"]) == ("auto", 3, 1, [])
        [merge] = result["applied"]
        assert merge["status"] == "applied" and merge["contradiction"] is True
        assert merge["memoryIds"] == [lyon["id"], paris["id"]]  # oldest first, whatever order the model gave
        # one active memory about the city, the chain holds every version
        left = {m["text"]: m for m in await active(proc, "cook")}
        assert set(left) == {"The user lives in Paris (moved from Lyon).", "The user likes green tea."}
        head = left["The user lives in Paris (moved from Lyon)."]
        assert head["id"] == merge["resultId"] and head["source"]["kind"] == "encoder"
        for member in (lyon, paris, head):
            versions = (await proc.call("memory:get", {"id": member["id"]}))["versions"]
            assert [v["text"] for v in versions] == [
                "The user lives in Lyon.", "The user lives in Paris now.", "The user lives in Paris (moved from Lyon)."]
            assert [v["status"] for v in versions] == ["superseded", "superseded", "active"]
        # the model saw the group as data, with ids, and the tea memory was not in it
        [side] = [b for b in await chat.requests() if not b.get("stream")]
        shown = side["messages"][1]["content"]
        assert lyon["id"] in shown and paris["id"] in shown and tea["id"] not in shown
        # a second pass: nothing left to group
        again = await proc.call("memory:consolidate", {"scope": "cook", "mode": "auto"})
        assert again["groups"] == 0 and again["applied"] == []
        await proc.close()


async def test_propose_mode_waits_for_an_answer_and_bad_answers_change_nothing(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        a, b = await remember(proc, "global", "The user prefers dark mode in every app.",
                              "The user prefers dark mode in apps.")
        c, d = await remember(proc, "global", "The user owns a black cat called Miso.",
                              "The user owns a cat called Miso, a black one.")
        await chat.script(merges({"ids": [a["id"], b["id"]], "text": "The user prefers dark mode in every app.",
                                  "kind": "preference"}),
                          {"text": "I think these are fine as they are."})  # not JSON: that group stays
        result = await proc.call("memory:consolidate", {"scope": "global"})  # the default mode: propose
        assert result["mode"] == "propose" and result["groups"] == 2 and result["applied"] == []
        [proposal] = result["proposed"]
        assert len(result["notes"]) == 1 and "not valid" in result["notes"][0]
        note = await proc.next_notification("memory_consolidation_proposed")
        assert note["id"] == proposal["id"] and [m["id"] for m in note["memories"]] == [a["id"], b["id"]]
        # nothing changed before the answer
        assert {m["id"] for m in await active(proc, "global")} == {a["id"], b["id"], c["id"], d["id"]}
        listed = await proc.call("memory:consolidation:list", {})
        assert [p["id"] for p in listed] == [proposal["id"]] and listed[0]["status"] == "pending"
        # a pass meanwhile does not propose the same memories again
        await chat.script({"text": json.dumps({"merges": []})})
        assert (await proc.call("memory:consolidate", {"scope": "global"}))["proposed"] == []
        accepted = await proc.call("memory:consolidation:accept", {"id": proposal["id"],
                                                                    "text": "The user wants dark mode everywhere."})
        assert accepted["status"] == "accepted"
        head = await proc.call("memory:get", {"id": accepted["resultId"]})
        assert head["memory"]["text"] == "The user wants dark mode everywhere."
        assert head["memory"]["source"]["kind"] == "manual" and len(head["versions"]) == 3
        with pytest.raises(CallError) as err:
            await proc.call("memory:consolidation:accept", {"id": proposal["id"]})
        assert err.value.code == -32003
        # a proposal whose memories changed meanwhile cannot be applied: BAD_STATE, nothing written
        await chat.script(merges({"ids": [c["id"], d["id"]], "text": "The user owns a black cat, Miso.",
                                  "kind": "fact"}))
        [stale] = (await proc.call("memory:consolidate", {"scope": "global"}))["proposed"]
        await proc.call("memory:delete", {"id": d["id"]})
        with pytest.raises(CallError) as err:
            await proc.call("memory:consolidation:accept", {"id": stale["id"]})
        assert err.value.code == -32003
        assert (await proc.call("memory:get", {"id": c["id"]}))["memory"]["status"] == "active"
        assert await proc.call("memory:consolidation:reject", {"id": stale["id"]}) == {"success": True}
        assert await proc.call("memory:consolidation:list", {}) == []
        # a merge naming a memory outside its group is dropped
        e, f = await remember(proc, "global", "The user drives a blue car.", "The user drives a blue car daily.")
        await chat.script(merges({"ids": [e["id"], a["id"]], "text": "x", "kind": "fact"}))
        dropped = await proc.call("memory:consolidate", {"scope": "global", "mode": "auto"})
        assert dropped["applied"] == [] and "outside its group" in " ".join(dropped["notes"])
        await proc.close()


async def test_expiry_stats_export_and_import(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        await assistant(proc, "coach")
        manual = await remember(proc, "coach", "The user runs on Sundays.", kind="preference", key="user.run_day")
        await remember(proc, "global", "Multi-line\nmemory <!-- with a comment -->", kind="note")
        await proc.close()
    # memories the model wrote long ago and never used (an encoder's and a tool's), one it used often
    db = apsw.Connection(str(data / "chat.db"))
    old = 1_600_000_000_000
    for i, (source, uses) in enumerate((("encoder", 0), ("tool", 1), ("encoder", 9))):
        db.execute(
            "INSERT INTO memories(id, scope, kind, text, norm_hash, source_kind, flags, use_count, tokens,"
            " created_at, updated_at) VALUES (?, 'coach', 'fact', ?, ?, ?, '[]', ?, 5, ?, ?)",
            (f"old-{i}", f"Old fact number {i}.", f"hash-{i}", source, uses, old, old),
        )
    db.close()
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        stats = await proc.call("memory:stats", {"scope": "coach"})
        [coach] = stats["scopes"]
        assert (coach["active"], coach["neverUsed"], coach["expirable"]) == (4, 2, 0)  # the policy is off
        assert coach["byKind"] == {"fact": 3, "preference": 1}
        settings = await proc.call("memory:settings:update", {"expireAfterDays": 30, "expireMaxUses": 1})
        assert settings["expireAfterDays"] == 30 and settings["consolidationMode"] == "propose"
        [coach] = (await proc.call("memory:stats", {"scope": "coach"}))["scopes"]
        assert coach["expirable"] == 2  # old, unused enough, written by the model; never a manual one
        await proc.close()
    async with spawn_sidecar(data) as proc:  # the policy runs at start
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        with anyio.fail_after(20):
            while len(await active(proc, "coach")) != 2:
                await anyio.sleep(0.05)
        assert {m["id"] for m in await active(proc, "coach")} == {"old-2", manual[0]["id"]}
        restored = await proc.call("memory:restore", {"id": "old-0"})  # expired, not lost
        assert restored["status"] == "active"
        totals = await proc.call("memory:stats", {})
        assert [s["scope"] for s in totals["scopes"]] == ["coach", "global"] and totals["active"] == 4
        # export: JSON with history, Markdown per scope
        exported = await proc.call("memory:export", {"format": "json"})
        assert {m["id"] for m in exported["memories"]} >= {"old-0", "old-1", "old-2"}
        markdown = await proc.call("memory:export", {"format": "markdown", "assistantId": "coach"})
        files = {f["name"]: f["content"] for f in markdown["files"]}
        assert set(files) == {"coach.md", "global.md"}
        assert "## Preferences\n\n- The user runs on Sundays. <!-- key: user.run_day;" in files["coach.md"]
        assert "old-1" not in files["coach.md"]  # deleted ones are not in the readable file
        assert "- Multi-line <!--" in files["global.md"] and "  memory <!-\u200b- with" in files["global.md"]
        await proc.close()
    async with spawn_sidecar(tmp_path / "other") as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        await assistant(proc, "coach")
        imported = await proc.call("memory:import", {"format": "json", "memories": exported["memories"]})
        assert (imported["created"], imported["duplicates"]) == (4, 0)
        assert imported["skipped"] == 1  # old-1 was deleted: not imported
        again = await proc.call("memory:import", {"format": "markdown", "scope": "coach",
                                                  "content": files["coach.md"]})
        assert (again["created"], again["duplicates"]) == (0, 3)
        edited = files["coach.md"].replace("The user runs on Sundays.", "The user runs on Saturdays.")
        edited += "\n## Events\n\n- The user ran a marathon in May.\n  - task: marathon\n"
        changed = await proc.call("memory:import", {"format": "markdown", "scope": "coach", "content": edited})
        assert (changed["created"], changed["superseded"], changed["duplicates"]) == (1, 1, 2)  # the key supersedes
        texts = {m["text"]: m for m in await active(proc, "coach")}
        assert texts["The user ran a marathon in May."]["kind"] == "event"
        assert texts["The user ran a marathon in May."]["task"] == "marathon"
        assert "The user runs on Saturdays." in texts and "The user runs on Sundays." not in texts
        global_texts = [m["text"] for m in await active(proc, "global")]
        assert global_texts == ["Multi-line\nmemory <!-- with a comment -->"]
        for params, field in (({"format": "markdown", "content": "x"}, "scope"),
                              ({"format": "markdown", "scope": "coach"}, "content"),
                              ({"format": "json", "content": "x"}, "content")):
            with pytest.raises(CallError) as err:
                await proc.call("memory:import", params)
            assert err.value.code == -32602 and field in err.value.message
        with pytest.raises(CallError) as err:
            await proc.call("memory:import", {"format": "markdown", "scope": "nobody", "content": "- x"})
        assert err.value.code == -32001
        await proc.close()


async def test_a_memory_consolidate_task_runs_the_upkeep(tmp_path: Path) -> None:
    start = 1_773_129_600_000  # 2026-03-10 08:00 UTC
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data", "--test-clock", str(start)) as proc:
        await configure_provider(proc, chat.base_url)
        await proc.call("memory:settings:update", {"consolidationMode": "auto"})
        a, b = await remember(proc, "global", "The user's dog is called Rex.", "The user's dog is named Rex.")
        task = await proc.call("task:create", {"name": "tidy memories", "kind": "memory-consolidate",
                                               "schedule": {"kind": "cron", "expression": "0 9 * * *"},
                                               "scope": "global"})
        await chat.script(merges({"ids": [a["id"], b["id"]], "text": "The user's dog is named Rex.", "kind": "fact"}))
        assert (await proc.call("sidecar:test:clock", {"now": start + 3_600_000}))["now"] == start + 3_600_000
        _, done = await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "task_finished", timeout=20)
        assert done["params"]["taskId"] == task["id"] and done["params"]["status"] == "completed", done
        [left] = await active(proc, "global")
        assert left["id"] == b["id"]  # the same text: the newest one ends the chain, no new version
        assert [v["id"] for v in (await proc.call("memory:get", {"id": a["id"]}))["versions"]] == [a["id"], b["id"]]
        await proc.close()


async def test_the_encoder_reads_server_mode_replies(tmp_path: Path) -> None:
    async with qiming_server() as server, scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await configure(proc, server, agentId=1128)
        provider = (await proc.call("provider:list"))[0]["id"]
        await assistant(proc, "remote", encoder="auto", encoderModel={"providerId": provider, "modelId": "scripted-1"})
        session = await proc.call("server:session:create", {"title": "Forwarded"})
        await proc.call("chat:context:update", {"sessionId": session["id"], "assistantId": "remote"})
        await server.control("chat", {"events": [{"eventType": "MESSAGE", "data": {"type": "CHAT", "text": "Noted."}}]})
        await chat.script({"text": json.dumps({"remember": True, "reason": "told", "memories": [
            {"kind": "fact", "text": "The user works in Berlin.", "subject": "user"}]})})
        sent = await proc.call("chat:send", {"sessionId": session["id"],
                                             "input": {"content": "I work in Berlin, remember that."}})
        assert (await wait_final(proc, sent["messageId"], timeout=60))["type"] == "stream_end"
        with anyio.fail_after(20):
            while not (found := await active(proc, "remote")):
                await anyio.sleep(0.05)
        assert found[0]["text"] == "The user works in Berlin."
        assert found[0]["source"]["messageId"] == sent["messageId"]
        await proc.close()
