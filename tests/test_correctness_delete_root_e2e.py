"""No request starts with a reply, over the real server: deleting the root question
alone (``chat:messages:delete {mode: "message"}``) takes the replies below it with it, down
to the next user messages, which become roots; a branch that starts with a reply anyway (an
imported conversation that opens with the assistant's greeting) is sent with a short user
message before it, the greeting kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat_helpers import wait_final
from generation_helpers import setup
from scripted_server import ScriptedServer, scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


async def exchange(proc: SidecarProcess, sid: str, text: str) -> tuple[str, str]:
    sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": text}})
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    return sent["userMessageId"], sent["messageId"]


async def last_conversation(server: ScriptedServer) -> list[tuple[str, str]]:
    """(role, text) of the last streamed request's messages after the system prompt."""
    body = [b for b in await server.requests() if b.get("stream")][-1]
    out = []
    for m in body["messages"]:
        if m["role"] != "system":
            content: Any = m["content"]
            out.append((m["role"], content if isinstance(content, str) else content[0]["text"]))
    return out


async def test_deleting_the_root_question_takes_its_replies_and_no_request_starts_with_one(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url)
        sid = (await proc.call("chat:session:create", {}))["id"]
        await server.script({"text": "First answer."}, {"text": "First again."}, {"text": "Second answer."})
        u1, a1 = await exchange(proc, sid, "first question")
        regen = await proc.call("chat:regenerate", {"sessionId": sid, "messageId": a1})
        assert (await wait_final(proc, regen["messageId"]))["type"] == "stream_end"
        u2, a2 = await exchange(proc, sid, "second question")

        deleted = await proc.call("chat:messages:delete", {"sessionId": sid, "messageId": u1, "mode": "message"})
        assert deleted == {"success": True, "deleted": 3, "activeLeafId": a2}
        branch = await proc.call("chat:messages:get", {"sessionId": sid})
        assert [(m["id"], m["parentId"]) for m in branch] == [(u2, None), (a2, u2)]
        tree = await proc.call("chat:messages:tree", {"sessionId": sid})
        assert [root["message"]["role"] for root in tree] == ["user"]

        await server.script({"text": "Third answer."})
        await exchange(proc, sid, "third question")
        assert await last_conversation(server) == [
            ("user", "second question"), ("assistant", "Second answer."), ("user", "third question"),
        ]

        # a conversation that opens with the assistant (imported): a user line goes first
        await proc.call("chat:session:import", {
            "session": {"id": "greeted", "title": "Greeted", "providerId": "", "modelId": "", "createdAt": 1, "updatedAt": 1},
            "messages": [
                {"id": "g-1", "sessionId": "greeted", "parentId": None, "role": "assistant",
                 "textContent": "Hello! How can I help?", "status": "completed", "createdAt": 10, "updatedAt": 10},
            ],
        })
        await server.script({"text": "Sure."})
        await exchange(proc, "greeted", "plan my trip")
        (first_role, opening), *rest = await last_conversation(server)
        assert first_role == "user" and "assistant" in opening
        assert rest == [("assistant", "Hello! How can I help?"), ("user", "plan my trip")]
        await proc.close()
