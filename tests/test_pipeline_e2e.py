"""The request pipeline over the real server and the scripted loopback provider:
every input transformer and their order, asserted on the exact request bodies the provider
received; stored messages byte-identical; summary failure -> recent window only; manual
compaction; assistant and context methods; output transforms on the stored reply."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider, wait_final
from scripted_server import scripted_provider
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio
DOCS = Path(__file__).resolve().parent.parent / "fixtures" / "documents"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def content_text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, list):
        return "\n\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content or ""


def streamed(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in bodies if b.get("stream")]


async def test_every_transformer_in_order_on_the_wire_and_nothing_stored_changes(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "README.md").write_text("hi")
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url)
        profile = await proc.call("assistant:upsert", {
            "id": "default", "name": "Tutor",
            "systemPrompt": "You are {char}, talking to {user} using {model_id}.",
            "regexRules": [{"pattern": "colour", "replacement": "color", "scope": "user"}],
            "modes": [{"content": "MODE for {model_id}", "position": "after_system"}],
            "lorebook": [{"keywords": ["current time"], "content": "LORE on {cur_date}", "position": "after_system"}],
            "transformers": {
                "timeReminder": True, "userName": "Ada",
                "ocr": {"enabled": True, "prompt": "Read the text."},
                "template": {"enabled": True, "template": "[{{ role }} #{{ index }}] {{ message }}"},
            },
        })
        assert profile["isDefault"] and profile["name"] == "Tutor"
        session = await proc.call("chat:session:create", {"workspaceDir": str(workspace)})
        await server.script({"text": "OCR TEXT 123"}, {"text": "All <think>hidden reasoning</think>done."})
        content = "What colour is this? {model_id}"
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {
            "content": content,
            "attachments": [
                {"name": "data.csv", "mimeType": "text/csv", "data": b64(DOCS / "sample.csv")},
                {"name": "notes.html", "mimeType": "text/html", "data": b64(DOCS / "sample.html")},
                {"name": "report.pdf", "mimeType": "application/pdf", "data": b64(DOCS / "sample.pdf")},
                {"name": "shot.png", "mimeType": "image/png", "data": base64.b64encode(PNG).decode()},
            ],
        }})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end", final
        stored_before = await proc.call("chat:messages:get", {"sessionId": session["id"]})

        bodies = await server.requests()
        ocr = bodies[0]
        assert ocr["stream"] is False
        ocr_parts = ocr["messages"][0]["content"]
        assert ocr_parts[0] == {"type": "text", "text": "Read the text."}
        assert ocr_parts[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
        chat = streamed(bodies)[0]
        system = chat["messages"][0]
        assert system["role"] == "system"
        sys_text = content_text(system)
        # 3 Placeholder ran after 2 PromptInjection (the injected mode's placeholder is resolved),
        # and 2 ran after 1 TimeReminder (the lorebook keyword only occurs in the reminder)
        assert sys_text.startswith("You are Tutor, talking to Ada using scripted-1.")
        assert "MODE for scripted-1" in sys_text and "LORE on 20" in sys_text and "{cur_date}" not in sys_text
        user = chat["messages"][-1]
        assert user["role"] == "user"
        text = content_text(user)
        # 6 Template wraps the user text, the time reminder, the documents (4) and the OCR text (5)
        assert text.startswith("[user #0] What color is this? scripted-1")  # UserRegex + Placeholder
        rendered = text.split("\n\n", 1)[0]
        segments = text.split("\n\n")
        head = text[: text.index("[image omitted")]
        for expected in ("<time_reminder>Current time:", '<document name="data.csv" type="text/csv">',
                         "keep {model_id} literal",  # 3 ran before 4: document text is not a template
                         "Trip to Lyon", "Take the TGV at 9:00.", "Hello PDF: quarterly report",
                         "<image_ocr>OCR TEXT 123</image_ocr>"):
            assert expected in head, expected
        assert "alert(" not in text and rendered.startswith("[user #0]")
        # the model has no image input: a note instead of the picture, OCR text kept
        omitted = next(s for s in segments if s.startswith("[image omitted"))
        assert "scripted-1" in omitted
        # 7 WorkspaceReminder ran after the Template: it is outside the rendered text
        workspace_note = text[text.index("<workspace>"):]
        assert workspace_note.startswith(f"<workspace>Working directory: {workspace}")
        assert "README.md" in workspace_note and "src/" in workspace_note
        assert text.index("<workspace>") > text.index("[image omitted")

        # output transforms: the stored reply has the reasoning apart and no tags
        reply = stored_before[-1]
        assert reply["textContent"] == "All done."
        assert {"type": "thinking", "text": "hidden reasoning", "signature": None} in reply["parts"]

        # stored messages are byte-identical after more requests are built from them
        stored_user = stored_before[0]
        assert stored_user["textContent"].startswith(content)
        assert [p["type"] for p in stored_user["parts"]] == ["text", "file", "file", "file", "image"]
        regen = await proc.call("chat:regenerate", {"sessionId": session["id"], "messageId": sent["messageId"]})
        assert (await wait_final(proc, regen["messageId"]))["type"] == "stream_end"
        after = await proc.call("chat:messages:get", {"sessionId": session["id"], "options": {"allBranches": True}})
        assert json.dumps(after[0], sort_keys=True) == json.dumps(stored_user, sort_keys=True)
        assert json.dumps(after[1], sort_keys=True) == json.dumps(reply, sort_keys=True)
        second = streamed(await server.requests())[-1]
        assert content_text(second["messages"][-1]) == text  # same request copy again (OCR cached)
        await proc.close()


def _history(n: int, session_id: str, words: int = 60) -> list[dict[str, Any]]:
    messages, parent = [], None
    for i in range(n):
        mid = f"0190a000-0000-7000-8000-{i:012d}"
        messages.append({
            "id": mid, "sessionId": session_id, "parentId": parent,
            "role": "user" if i % 2 == 0 else "assistant",
            "textContent": f"msg{i} " + "lorem " * words, "status": "completed",
            "createdAt": 1_700_000_000_000 + i, "updatedAt": 1_700_000_000_000 + i,
        })
        parent = mid
    return messages


async def _long_session(proc: Any, n: int = 12) -> tuple[str, list[dict[str, Any]]]:
    session = await proc.call("chat:session:create", {"title": "long"})
    history = _history(n, session["id"])
    exported = await proc.call("chat:session:export", {"id": session["id"]})
    exported["session"]["activeLeafId"] = history[-1]["id"]
    await proc.call("chat:session:import", {"session": exported["session"], "messages": history, "replace": True})
    return session["id"], history


async def test_failing_summary_sends_only_the_recent_window(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("assistant:upsert", {"id": "default", "name": "Default", "context": {"compressThreshold": 400}})
        session_id, history = await _long_session(proc)
        await server.script({"status": 400, "text": "summary refused"}, {"text": "fine"})
        sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": "next question"}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        bodies = await server.requests()
        assert [b.get("stream") for b in bodies[:2]] == [False, True]
        summary_call, chat = bodies[0], bodies[1]
        assert "msg0 lorem" in content_text(summary_call["messages"][-1])
        sent_texts = [content_text(m) for m in chat["messages"]]
        branch = [m["textContent"] for m in history] + ["next question"]
        # exactly a suffix of the branch: the recent window, starting at a user message
        assert chat["messages"][0]["role"] == "user"
        assert 4 <= len(sent_texts) < len(branch) and sent_texts == branch[-len(sent_texts):]
        assert not any("conversation_summary" in t for t in sent_texts)
        info = await proc.call("chat:context:get", {"sessionId": session_id})
        assert info["summary"] is None and info["threshold"] == 400
        await proc.close()


async def test_manual_compaction_then_reuse_and_context_methods(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        session_id, history = await _long_session(proc, n=10)
        await server.script({"text": "SUMMARY OF THE START"})
        result = await proc.call("chat:context:compact", {
            "sessionId": session_id, "targetTokens": 400, "instructions": "Keep every msg number."})
        assert result["compacted"] and result["tokensAfter"] < result["tokensBefore"]
        summary = result["summary"]
        assert summary["text"] == "SUMMARY OF THE START" and summary["valid"]
        assert summary["lastCoveredId"] == history[summary["coveredCount"] - 1]["id"]
        compact_call = (await server.requests())[-1]
        assert "Keep every msg number." in content_text(compact_call["messages"][0])
        info = await proc.call("chat:context:get", {"sessionId": session_id})
        assert info["summary"]["valid"] and info["assistantId"] == "default"
        assert info["truncationStrategy"] == "summarize-old"

        # the next request carries the summary and the window, with no new summary call
        sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": "go on"}})
        await wait_final(proc, sent["messageId"])
        bodies = await server.requests()
        chat = streamed(bodies)[-1]
        assert "SUMMARY OF THE START" in content_text(chat["messages"][0])
        assert len(chat["messages"]) == 1 + result["windowCount"] + 1
        assert sum(1 for b in bodies if not b.get("stream")) == 1

        # editing a covered message invalidates it (the edited branch has its own prefix)
        await server.script({"text": "edited reply"})
        edit = await proc.call("chat:editResend", {"sessionId": session_id, "messageId": history[2]["id"], "newContent": "changed"})
        await wait_final(proc, edit["messageId"])
        assert (await proc.call("chat:context:get", {"sessionId": session_id}))["summary"]["valid"] is False
        edited_chat = streamed(await server.requests())[-1]
        assert not any("SUMMARY OF THE START" in content_text(m) for m in edited_chat["messages"])
        # branch switch back: valid again
        await proc.call("chat:messages:select", {"sessionId": session_id, "leafId": sent["messageId"]})
        assert (await proc.call("chat:context:get", {"sessionId": session_id}))["summary"]["valid"] is True

        # per-session strategy and profile, with bad input refused
        other = await proc.call("assistant:upsert", {"name": "Short", "systemPrompt": "Be brief."})
        updated = await proc.call("chat:context:update", {
            "sessionId": session_id, "assistantId": other["id"], "truncationStrategy": "smart-select"})
        assert updated["assistantId"] == other["id"] and updated["truncationStrategy"] == "smart-select"
        with pytest.raises(CallError) as bad:
            await proc.call("chat:context:update", {"sessionId": session_id, "assistantId": "nope"})
        assert bad.value.code == -32602 and "assistantId" in bad.value.message
        with pytest.raises(CallError) as bad:
            await proc.call("chat:context:update", {"sessionId": session_id, "truncationStrategy": "random"})
        assert bad.value.code == -32602
        with pytest.raises(CallError) as bad:
            await proc.call("assistant:upsert", {"name": "x", "regexRules": [{"pattern": "("}]})
        assert bad.value.code == -32602 and "regexRules[0]" in bad.value.message
        with pytest.raises(CallError) as bad:
            await proc.call("assistant:upsert", {"name": "x", "transformers": {"template": {"enabled": True, "template": "{% if %}"}}})
        assert bad.value.code == -32602 and "template" in bad.value.message
        with pytest.raises(CallError) as bad:
            await proc.call("assistant:delete", {"id": "default"})
        assert bad.value.code == -32003
        await proc.call("assistant:setDefault", {"id": other["id"]})
        listed = await proc.call("assistant:list", {})
        assert [a["isDefault"] for a in listed] == [False, True]
        await proc.call("assistant:setDefault", {"id": "default"})
        await proc.call("assistant:delete", {"id": other["id"]})
        info = await proc.call("chat:context:get", {"sessionId": session_id})
        assert info["assistantId"] == "default" and info["sessionAssistantId"] == other["id"]  # falls back
        with pytest.raises(CallError) as bad:
            await proc.call("chat:context:compact", {"sessionId": session_id, "targetTokens": 5})
        assert bad.value.code == -32602
        with anyio.fail_after(5):
            await proc.close()
