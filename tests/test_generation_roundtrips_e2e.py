"""Round trips an integrator asked for, over the real server: editResend's user
message id, per-send overrides, a post-stream rewrite announced with ``content_replaced``,
the user's correction of a reply (``chat:messages:update``), paged reads with hasMore and a
cursor, and ``sidecar:progress`` for import and export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat_helpers import assert_well_ordered, wait_final
from generation_helpers import events_for, setup
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


async def exchange(proc: SidecarProcess, session_id: str, text: str, **options: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": session_id, "input": {"content": text}}
    if options:
        params["options"] = options
    sent = await proc.call("chat:send", params)
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    return dict(sent)


async def test_edit_resend_ids_and_per_send_overrides(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url, models=[{"id": "scripted-1"}, {"id": "thinker", "supportsReasoning": True}])
        session = await proc.call("chat:session:create", {})
        sid = session["id"]
        first = await exchange(proc, sid, "first question")
        edited = await proc.call("chat:editResend", {"sessionId": sid, "messageId": first["userMessageId"],
                                                      "newContent": "first question, edited"})
        assert set(edited) == {"messageId", "userMessageId"}
        assert (await wait_final(proc, edited["messageId"]))["type"] == "stream_end"
        path = await proc.call("chat:messages:get", {"sessionId": sid})
        assert [m["id"] for m in path] == [edited["userMessageId"], edited["messageId"]]
        assert path[0]["textContent"] == "first question, edited" and path[0]["parentId"] is None

        await exchange(proc, sid, "think hard", modelId="thinker", temperature=0.5, reasoning="high")
        await exchange(proc, sid, "and now plainly", tools=False)
        bodies = [b for b in await server.requests() if b.get("stream")]
        override, plain = bodies[-2], bodies[-1]
        assert override["model"] == "thinker" and override["reasoning_effort"] == "high"
        assert override["temperature"] == 0.5 and override.get("tools")
        assert plain["model"] == "scripted-1" and "temperature" not in plain and "tools" not in plain
        assert (await proc.call("chat:session:get", {"id": sid}))["modelId"] == "scripted-1"
        stored = await proc.call("chat:messages:get", {"sessionId": sid})
        assert [m["modelId"] for m in stored if m["role"] == "assistant"][-2:] == ["thinker", "scripted-1"]
        with pytest.raises(CallError) as err:
            await proc.call("chat:send", {"sessionId": sid, "input": {"content": "x"}, "options": {"temperature": 3}})
        assert err.value.code == -32602 and "temperature" in err.value.message
        with pytest.raises(CallError) as err:
            await proc.call("chat:send", {"sessionId": sid, "input": {"content": "x"}, "options": {"reasoning": "huge"}})
        assert err.value.code == -32602
        await proc.close()


async def test_an_output_rewrite_is_announced_and_a_correction_is_stored_as_edited(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url)
        await proc.call("assistant:upsert", {"id": "default", "name": "Default", "regexRules": [
            {"pattern": r"\bcolour\b", "replacement": "color", "scope": "assistant"},
        ]})
        await server.script({"text": "The colour of the sky is blue.", "thinking": "Sky question."},
                            {"text": "Nothing to rewrite here."})
        session = await proc.call("chat:session:create", {})
        sid = session["id"]
        sent = await exchange(proc, sid, "What colour is the sky?")
        events = events_for(proc, sent["messageId"])
        assert_well_ordered(events)
        assert [e["type"] for e in events][-2:] == ["content_replaced", "stream_end"]
        replaced = events[-2]
        assert replaced["text"] == "The color of the sky is blue."
        assert [p["type"] for p in replaced["parts"]] == ["thinking", "text"]
        streamed = "".join(e["text"] for e in events if e["type"] == "text_delta")
        assert streamed == "The colour of the sky is blue."
        (_, reply) = await proc.call("chat:messages:get", {"sessionId": sid})
        assert reply["textContent"] == replaced["text"] and reply["editedAt"] is None
        plain = await exchange(proc, sid, "Anything else?")
        assert "content_replaced" not in [e["type"] for e in events_for(proc, plain["messageId"])]

        corrected = await proc.call("chat:messages:update", {
            "sessionId": sid, "messageId": sent["messageId"], "content": "The sky is azure (corrected).",
        })
        assert corrected["textContent"] == "The sky is azure (corrected)." and corrected["editedAt"] > 0
        assert [p["type"] for p in corrected["parts"]] == ["thinking", "text"]  # the reasoning stays
        assert corrected["parts"][0]["text"] == "Sky question."
        hits = await proc.call("chat:messages:search", {"query": "azure"})
        assert [h["messageId"] for h in hits] == [sent["messageId"]]
        assert await proc.call("chat:messages:search", {"query": "colour", "options": {"role": "assistant"}}) == []
        with pytest.raises(CallError) as err:
            await proc.call("chat:messages:update", {"sessionId": sid, "messageId": sent["userMessageId"], "content": "x"})
        assert err.value.code == -32602
        with pytest.raises(CallError) as err:
            await proc.call("chat:messages:update", {"sessionId": sid, "messageId": "nope", "content": "x"})
        assert err.value.code == -32001
        with pytest.raises(CallError) as err:
            await proc.call("chat:messages:update", {"sessionId": sid, "messageId": sent["messageId"], "content": "  "})
        assert err.value.code == -32602
        await proc.close()


async def test_pages_say_whether_there_is_more(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url)
        session = await proc.call("chat:session:create", {})
        sid = session["id"]
        for i in range(5):
            await exchange(proc, sid, f"alphaword number {i}")
        everything = await proc.call("chat:messages:get", {"sessionId": sid})
        assert len(everything) == 10
        pages: list[list[str]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"sessionId": sid, "options": {"limit": 4}}
            if cursor is not None:
                params["cursor"] = cursor
            page = await proc.call("chat:messages:page", params)
            pages.append([m["id"] for m in page["items"]])
            if not page["hasMore"]:
                assert page["nextCursor"] is None
                break
            cursor = page["nextCursor"]
            assert cursor == page["items"][0]["id"]
        assert [len(p) for p in pages] == [4, 4, 2]
        assert [i for p in reversed(pages) for i in p] == [m["id"] for m in everything]
        whole = await proc.call("chat:messages:page", {"sessionId": sid})
        assert whole["hasMore"] is False and len(whole["items"]) == 10

        found: list[str] = []
        cursor = None
        sizes = []
        while True:
            params = {"query": "alphaword", "options": {"limit": 2, "role": "user"}}
            if cursor is not None:
                params["cursor"] = cursor
            page = await proc.call("chat:messages:searchPage", params)
            sizes.append(len(page["items"]))
            found += [h["messageId"] for h in page["items"]]
            if not page["hasMore"]:
                break
            cursor = page["nextCursor"]
        assert sizes == [2, 2, 1] and len(set(found)) == 5
        with pytest.raises(CallError) as err:
            await proc.call("chat:messages:searchPage", {"query": "alphaword", "cursor": "garbage"})
        assert err.value.code == -32602
        await proc.close()


async def test_import_and_export_report_progress_before_their_answer(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        count = 2500
        session = {"id": "big-session", "title": "Big", "providerId": "", "modelId": "", "createdAt": 1, "updatedAt": 1}
        messages = []
        for i in range(count):
            messages.append({
                "id": f"big-{i:05d}", "sessionId": "big-session", "parentId": f"big-{i - 1:05d}" if i else None,
                "role": "user" if i % 2 == 0 else "assistant", "textContent": f"message {i}",
                "createdAt": 1000 + i, "updatedAt": 1000 + i,
            })
        request_id = await proc.request("chat:session:import",
                                        {"session": session, "messages": messages, "progressToken": 7})
        answer = await proc.response(request_id, timeout=60)
        assert answer["result"]["messageCount"] == count
        imported = [p for p in proc.notifications("sidecar:progress") if p["token"] == 7]
        assert imported[0]["kind"] == "begin" and imported[-1]["kind"] == "end"
        assert imported[-1]["done"] == imported[-1]["total"] == count and imported[-1]["message"] == "done"
        assert all(p["kind"] == "report" for p in imported[1:-1])
        assert [p["done"] for p in imported] == sorted(p["done"] for p in imported)
        end_index = next(i for i, m in enumerate(proc.messages)
                         if isinstance(m, dict) and m.get("method") == "sidecar:progress"
                         and m["params"]["token"] == 7 and m["params"]["kind"] == "end")
        answer_index = next(i for i, m in enumerate(proc.messages) if isinstance(m, dict) and m.get("id") == request_id)
        assert end_index < answer_index

        exported = await proc.call("chat:session:export", {"id": "big-session", "progressToken": "exp-1"}, timeout=60)
        assert len(exported["messages"]) == count
        out = [p for p in proc.notifications("sidecar:progress") if p["token"] == "exp-1"]
        assert out[0]["kind"] == "begin" and out[-1] == {
            "token": "exp-1", "kind": "end", "done": count, "total": count, "message": "done",
        }
        # a request refused before any work starts sends none
        with pytest.raises(CallError):
            await proc.call("chat:session:export", {"id": "missing", "progressToken": "exp-2"})
        assert not [p for p in proc.notifications("sidecar:progress") if p["token"] == "exp-2"]
        with pytest.raises(CallError) as err:  # the session exists: refused, no progress
            await proc.call("chat:session:import", {"session": session, "messages": messages, "progressToken": "again"})
        assert err.value.code == -32003
        assert not [p for p in proc.notifications("sidecar:progress") if p["token"] == "again"]
        await proc.close()


async def test_correcting_a_summarized_reply_drops_the_rolling_summary(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url)
        session = await proc.call("chat:session:create", {})
        sid = session["id"]
        sent = [await exchange(proc, sid, f"question {i} " + "detail " * 40) for i in range(4)]
        compacted = await proc.call("chat:context:compact", {"sessionId": sid, "targetTokens": 256}, timeout=30)
        assert compacted["compacted"] is True
        covered = compacted["summary"]["coveredCount"]
        assert covered >= 2
        info = await proc.call("chat:context:get", {"sessionId": sid})
        assert info["summary"]["valid"] is True
        # a reply the summary does not cover: the summary stays
        await proc.call("chat:messages:update", {"sessionId": sid, "messageId": sent[-1]["messageId"], "content": "late fix"})
        assert (await proc.call("chat:context:get", {"sessionId": sid}))["summary"] is not None
        # one it covers: it goes (it summarized the old text)
        await proc.call("chat:messages:update", {"sessionId": sid, "messageId": sent[0]["messageId"], "content": "early fix"})
        assert (await proc.call("chat:context:get", {"sessionId": sid}))["summary"] is None
        await proc.close()
