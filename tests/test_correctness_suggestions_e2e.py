"""Follow-up suggestions a model answers as a JSON array, over the real server: a
bare array, one in a ```json fence and one cut off by the token limit give their strings
(non-strings and overlong items left out, at most three); a plain list of lines still works."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat_helpers import wait_final
from generation_helpers import setup
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

CASES = [
    ('["What is RAG?", "How does it cite sources?"]', ["What is RAG?", "How does it cite sources?"]),
    ('```json\n["第一个问题？", 42, {"q": "x"}, "' + "x" * 300 + '", "Second?", "Third?", "Fourth?"]\n```',
     ["第一个问题？", "Second?", "Third?"]),
    ('Here are some questions:\n["Is it fast?", "Is it cheap?", "Is it sa', ["Is it fast?", "Is it cheap?"]),
    ("- Why is the sky blue?\n- Why is grass green?", ["Why is the sky blue?", "Why is grass green?"]),
]


async def test_a_json_array_answer_gives_its_strings_as_suggestions(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url, settings={"generateSuggestions": True})
        session = await proc.call("chat:session:create", {})
        for answer, expected in CASES:
            await server.script({"text": "A reply."}, {"text": answer})
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "Tell me."}})
            assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
            announced = await proc.next_notification("chat:suggestions", timeout=20)
            assert announced["messageId"] == sent["messageId"]
            assert announced["suggestions"] == expected, answer
            messages = await proc.call("chat:messages:get", {"sessionId": session["id"]})
            assert messages[-1]["id"] == sent["messageId"] and messages[-1]["suggestions"] == expected
        await proc.close()
