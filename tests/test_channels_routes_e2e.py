"""Routes over real subprocesses: an assistant profile, an ACP engine (the scripted agent), and
a remote agent that is a second sidecar's V1 endpoint (compat:start): a streamed reply with
the remote session kept across turns, an abort, the remote agent killed mid-turn (the reply
ends error with its text kept), and a route change that starts new sessions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_helpers import add_engine
from chat_helpers import configure_provider, wait_final
from compat_helpers import v1_sidecar
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.sidecar_subprocess]  # over the subprocess, as the host runs it

REPLY = "channel:reply"


def dm(text: str, message_id: str, sender: str = "alice") -> dict[str, Any]:
    return {
        "channel": "im", "chatId": f"dm_{sender}", "chatType": "private", "sender": {"id": sender, "name": sender},
        "messageId": message_id, "text": text, "timestamp": 1_700_000_000_000,
    }


async def channel(proc: SidecarProcess, route: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return await proc.call("channel:config:upsert", {"id": "im", "platform": "plain", "allowEveryone": True,
                                                     "route": route, **fields})


async def reply_text(proc: SidecarProcess) -> str:
    texts = []
    while True:
        reply = await proc.next_notification(REPLY, timeout=30)
        assert await proc.call("channel:ack", {"deliveryId": reply["deliveryId"], "ok": True}) == {"success": True}
        texts += [c["text"] for c in reply["chunks"] if c["type"] == "text"]
        if reply["final"]:
            return "\n".join(texts)


async def test_the_assistant_route_gives_the_chat_its_profile(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        profile = await proc.call("assistant:upsert", {"name": "Pirate", "systemPrompt": "Speak like a pirate, matey."})
        await channel(proc, {"type": "assistant", "assistantId": profile["id"]})
        await server.script({"text": "arr"})
        result = await proc.call("channel:message", dm("hello", "a1"))
        assert await reply_text(proc) == "arr"
        context = await proc.call("chat:context:get", {"sessionId": result["sessionId"]})
        assert context["assistantId"] == profile["id"]
        (body,) = await server.requests()
        assert "Speak like a pirate, matey." in body["messages"][0]["content"]
        # the route changes: the chat starts a new session for it, the old one stays
        await channel(proc, {"type": "local"})
        await server.script({"text": "plain again"})
        again = await proc.call("channel:message", dm("hello", "a2"))
        assert again["sessionId"] != result["sessionId"] and await reply_text(proc) == "plain again"
        assert len((await proc.call("chat:session:list", {"channelId": "im"}))["sessions"]) == 2
        await proc.close()


async def test_the_acp_route_runs_the_agent(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc)
        workspace = tmp_path / "work"
        workspace.mkdir()
        config = await channel(proc, {"type": "acp", "providerId": engine["id"], "workspaceDir": str(workspace)})
        assert config["route"] == {"type": "acp", "providerId": engine["id"], "workspaceDir": str(workspace)}
        result = await proc.call("channel:message", dm("hello agent", "c1"))
        text = await reply_text(proc)
        assert text.startswith("echo: hello agent [turn 1 of")
        session = await proc.call("chat:session:get", {"id": result["sessionId"]})
        assert session["mode"] == "acp" and session["providerId"] == engine["id"]
        assert session["workspaceDir"] == str(workspace)
        await proc.call("channel:message", dm("again", "c2"))
        assert "[turn 2 of" in await reply_text(proc)  # one agent session for the chat
        await proc.close()


async def remote_channel(proc: SidecarProcess, v1: Any, **fields: Any) -> dict[str, Any]:
    route = {"type": "remote-agent", "serviceUrl": v1.url, "auth": {"type": "api-key", "token": v1.token},
             "idleTimeoutMs": 10_000}
    return await channel(proc, route, **fields)


async def test_the_remote_agent_route_streams_and_keeps_its_session(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path / "remote") as v1, spawn_sidecar(tmp_path / "local") as proc:
        await proc.call("sidecar:initialize", {})
        config = await remote_channel(proc, v1, replyMode="stream")
        assert config["route"]["auth"] == {"type": "api-key", "token": "***", "headerName": None}
        assert v1.server is not None
        await v1.server.script({"text": "the remote agent answers in many words", "chunks": 8, "delay_ms": 20})
        first = await proc.call("channel:message", dm("question one", "r1"))
        assert "the remote agent answers in many words" in await reply_text(proc)
        path = await proc.call("chat:messages:get", {"sessionId": first["sessionId"]})
        reply = path[-1]
        assert reply["status"] == "completed" and reply["textContent"] == "the remote agent answers in many words"
        deltas = [e for e in proc.notifications("chat:stream") if e["messageId"] == reply["id"] and e["type"] == "text_delta"]
        assert len(deltas) > 1  # streamed, not one block
        session = await proc.call("chat:session:get", {"id": first["sessionId"]})
        assert session["mode"] == "remote"
        # the second turn continues the same remote session (the scripted provider's own
        # reply quotes the message)
        await proc.call("channel:message", dm("question two", "r2"))
        assert "You wrote: “question two" in await reply_text(proc)
        remote_sessions = (await v1.proc.call("chat:session:list", {"channelId": "v1-computer"}))["sessions"]
        assert len(remote_sessions) == 1
        remote_path = await v1.proc.call("chat:messages:get", {"sessionId": remote_sessions[0]["id"]})
        assert [m["textContent"] for m in remote_path if m["role"] == "user"] == ["question one", "question two"]
        # the token is sealed at rest and never shown
        assert (await proc.call("channel:config:get", {"id": "im"}))["route"]["auth"]["token"] == "***"
        await proc.close()
        stored = b"".join(p.read_bytes() for p in (tmp_path / "local").glob("chat.db*"))
        assert v1.token.encode() not in stored


async def test_an_aborted_remote_reply_cancels_the_remote_turn(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path / "remote") as v1, spawn_sidecar(tmp_path / "local") as proc:
        await proc.call("sidecar:initialize", {})
        await remote_channel(proc, v1)
        assert v1.server is not None
        await v1.server.script({"text": " ".join(f"w{i}" for i in range(400)), "chunks": 400, "delay_ms": 50})
        result = await proc.call("channel:message", dm("long one", "x1"))
        _, event = await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream" and m["params"]["type"] == "text_delta",
            timeout=30,
        )
        message_id = event["params"]["messageId"]
        assert await proc.call("chat:abort", {"sessionId": result["sessionId"]}) == {"success": True}
        final = await wait_final(proc, message_id, timeout=30)
        assert final["type"] == "aborted"
        assert "(The reply was interrupted.)" in await reply_text(proc)
        remote = (await v1.proc.call("chat:session:list", {"channelId": "v1-computer"}))["sessions"][0]
        with anyio.fail_after(20):
            while (await v1.proc.call("chat:messages:get", {"sessionId": remote["id"]}))[-1]["status"] != "aborted":
                await anyio.sleep(0.05)
        await proc.close()


async def test_a_remote_agent_gone_mid_turn_ends_the_reply_in_error_with_its_text(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path / "remote") as v1, spawn_sidecar(tmp_path / "local") as proc:
        await proc.call("sidecar:initialize", {})
        await remote_channel(proc, v1)
        assert v1.server is not None
        await v1.server.script({"text": " ".join(f"w{i}" for i in range(400)), "chunks": 400, "delay_ms": 50})
        result = await proc.call("channel:message", dm("long one", "g1"))
        with anyio.fail_after(30):
            while not (path := await proc.call("chat:messages:get", {"sessionId": result["sessionId"]})) or \
                    "w3" not in (path[-1].get("textContent") or ""):
                await anyio.sleep(0.05)
        v1.proc.send_signal(9)  # the remote agent's process dies mid-turn
        await v1.proc.wait_exit()
        final = await wait_final(proc, path[-1]["id"], timeout=60)
        assert final["type"] == "error"
        stored = (await proc.call("chat:messages:get", {"sessionId": result["sessionId"]}))[-1]
        assert stored["status"] == "error" and stored["textContent"].startswith("w0 w1 w2 w3")
        text = await reply_text(proc)
        assert text.startswith("w0 w1 w2 w3") and "(The reply failed:" in text
        await proc.close()


async def test_remote_sessions_refuse_branching_and_direct_creation(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path / "remote") as v1, spawn_sidecar(tmp_path / "local") as proc:
        await proc.call("sidecar:initialize", {})
        await remote_channel(proc, v1)
        result = await proc.call("channel:message", dm("hi", "b1"))
        await reply_text(proc)
        reply = (await proc.call("chat:messages:get", {"sessionId": result["sessionId"]}))[-1]
        with pytest.raises(CallError) as err:
            await proc.call("chat:regenerate", {"sessionId": result["sessionId"], "messageId": reply["id"]})
        assert err.value.code == -32005
        with pytest.raises(CallError) as err:
            await proc.call("chat:session:create", {"mode": "remote"})
        assert err.value.code == -32602 and "mode" in err.value.message
        # a bad token: the turn fails with the service's refusal, and the chat is told
        await channel(proc, {"type": "remote-agent", "serviceUrl": v1.url, "auth": {"type": "bearer", "token": "wrong"}})
        await proc.call("channel:message", dm("again", "b2"))
        assert "(The reply failed:" in await reply_text(proc)
        await proc.close()
