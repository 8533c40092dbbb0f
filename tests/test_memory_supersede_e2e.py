"""The MemoryEncoder supersedes what it was shown, whatever its scope, over a real sidecar
subprocess and the scripted provider: with the default ``saveScope: "assistant"``, a new
fact that replaces a global one becomes the global memory's next version (its scope, its
history), so only the new fact reaches the next request; in propose mode the proposal
names that scope and accepting it supersedes; an id the encoder was not shown (another
assistant's memory) is never touched; the prompt offers a scope."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider, wait_final
from memory_helpers import active, assistant, session_of, system_text
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

BEIJING = "The user lives in Beijing."
SHANGHAI = "The user lives in Shanghai."


def encoded(*memories: dict[str, Any]) -> dict[str, Any]:
    return {"text": json.dumps({"remember": True, "reason": "the user moved", "memories": list(memories)})}


async def exchange(proc: SidecarProcess, sid: str, text: str) -> str:
    sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": text}})
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    return str(sent["messageId"])


async def wait_log(proc: SidecarProcess, needle: str, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while needle not in proc.stderr_text():
            await anyio.sleep(0.05)


async def side_calls(chat: Any) -> list[dict[str, Any]]:
    return [b for b in await chat.requests() if not b.get("stream")]


async def test_a_contradiction_of_a_global_memory_supersedes_it(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook", encoder="auto")  # saveScope: the default, "assistant"
        old = await proc.call("memory:create", {"scope": "global", "text": BEIJING, "key": "user.city"})
        sid = await session_of(proc, "cook")
        await chat.script({"text": "Welcome to Shanghai."},
                          encoded({"kind": "fact", "text": SHANGHAI, "subject": "user", "supersedes": old["id"]}))
        await exchange(proc, sid, "I do not live in Beijing any more, I moved to Shanghai.")
        await wait_log(proc, "superseded memory")
        # the encoder was shown the global memory with its id, and offered a scope
        [side] = await side_calls(chat)
        assert f'id="{old["id"]}"' in side["messages"][1]["content"] and 'scope="global"' in side["messages"][1]["content"]
        assert '"scope"' in side["messages"][0]["content"]
        # one active fact: the global memory's next version, history kept
        [now] = await active(proc, "global")
        assert now["text"] == SHANGHAI and now["supersedes"] == old["id"] and now["scope"] == "global"
        assert await active(proc, "cook") == []
        versions = (await proc.call("memory:get", {"id": now["id"]}))["versions"]
        assert [v["text"] for v in versions] == [BEIJING, SHANGHAI]
        assert versions[0]["supersededBy"] == now["id"]
        # only the new fact reaches the next request (basic memory text: RAG off)
        await chat.script({"text": "Noted."})
        await exchange(proc, sid, "What should I cook tonight?")
        body = [b for b in await chat.requests() if b.get("stream")][-1]
        system = system_text(body)
        assert SHANGHAI in system and BEIJING not in system
        await proc.close()


async def test_propose_mode_proposes_the_supersede_in_its_scope(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "coach", encoder="propose")
        old = await proc.call("memory:create", {"scope": "global", "text": BEIJING})
        sid = await session_of(proc, "coach")
        await chat.script({"text": "Shanghai, then."},
                          encoded({"kind": "fact", "text": SHANGHAI, "subject": "user", "supersedes": old["id"]}))
        await exchange(proc, sid, "I left Beijing, I live in Shanghai now.")
        _, note = await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "memory_proposed", timeout=20)
        proposal = note["params"]
        assert proposal["action"] == "supersede" and proposal["supersedes"] == old["id"], proposal
        assert proposal["scope"] == "global" and proposal["supersedesText"] == BEIJING
        accepted = await proc.call("memory:accept", {"id": proposal["id"]})
        assert accepted["action"] == "superseded" and accepted["memory"]["scope"] == "global"
        assert [m["text"] for m in await active(proc, "global")] == [SHANGHAI]
        assert await active(proc, "coach") == []
        await proc.close()


async def test_a_memory_the_encoder_was_not_shown_is_never_superseded(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook", encoder="auto")
        await assistant(proc, "chef")
        foreign = await proc.call("memory:create", {"scope": "chef", "text": "The user owns a copper pan."})
        sid = await session_of(proc, "cook")
        await chat.script({"text": "A wok then."}, encoded(
            {"kind": "fact", "text": "The user owns a carbon steel wok.", "subject": "user", "supersedes": foreign["id"]}))
        await exchange(proc, sid, "I sold my pans and bought a carbon steel wok.")
        await wait_log(proc, "created memory")
        assert "was not shown" in proc.stderr_text()
        [side] = await side_calls(chat)
        assert foreign["id"] not in side["messages"][1]["content"]
        # the other assistant's memory is untouched; the fact is a new memory of the assistant
        [kept] = await active(proc, "chef")
        assert kept["id"] == foreign["id"] and kept["supersededBy"] is None
        assert [(m["text"], m["supersedes"]) for m in await active(proc, "cook")] == [
            ("The user owns a carbon steel wok.", None)]
        await proc.close()
