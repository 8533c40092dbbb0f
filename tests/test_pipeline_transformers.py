"""Input transformers in-process: the order they run in (all nine enabled, with retrievers),
positions of injections, placeholders, the template sandbox, retrieval context and citations,
Soul.md and the system prompt order, and that stored messages never change."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from protocol.context import (
    AssistantUpsertParams,
    LorebookEntry,
    MemorySettings,
    OcrOptions,
    PromptInjection,
    TemplateOptions,
    TransformerOptions,
)
from protocol.chat import Attachment, UserInput
from protocol.sessions import CreateSessionOptions
from protocol.types import ImagePart, TextPart
from sidecar.pipeline.builder import RequestBuilder
from sidecar.pipeline.transformers import TRANSFORMER_ORDER
from sidecar.pipeline.transformers.document import FILE_HEADER
from sidecar.pipeline.transformers.ocr import OCR_HEADER
from sidecar.retrieval.results import RetrievalResult, RetrievedChunk
from sidecar.store.knowledge import ChunkHit
from sidecar.providers.types import GenerationParams, ModelInfo, RequestMessage
from sidecar.store import AsyncStore, Store
from sidecar.store.attachments import AttachmentStore

pytestmark = pytest.mark.anyio
NOW = dt.datetime(2026, 3, 9, 14, 5, tzinfo=dt.timezone(dt.timedelta(hours=8)))
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


class Knowledge:
    def __init__(self) -> None:
        self.queries: list[str] = []

    async def retrieve(self, *, query: str, knowledge_base_ids: list[str], limit: int, session_id: str) -> RetrievalResult:
        assert session_id  # retrieval runs for the request's session (its embeddings are charged to it)
        self.queries.append(query)
        chunks = [
            RetrievedChunk(chunk=ChunkHit(rowid=i, id=f"d:k{i}", kb_id=knowledge_base_ids[0], document_id="d",
                                          document_name="kb.md", ordinal=i, heading=[], start=0, end=6, page=None,
                                          tokens=3, text=f"fact {i}"), score=1.0 / (i + 1), mode="lexical")
            for i in range(limit + 3)
        ]
        return RetrievalResult(mode="lexical", chunks=chunks)


class Memory:
    async def retrieve(self, *, query: str, assistant_id: str, limit: int, session_id: str) -> list[str]:
        assert session_id
        return ["likes tea", "lives in Lyon"]


async def vision(provider_id: str, model_id: str, messages: list[RequestMessage], **kw: Any) -> str:
    assert any(isinstance(p, ImagePart) for p in messages[0].parts)
    return "SIGN: EXIT"


def setup(tmp: Path, **profile: Any) -> tuple[Store, RequestBuilder, str]:
    store = Store(tmp)
    builder = RequestBuilder(AsyncStore(store), AttachmentStore(tmp), call_model=vision, knowledge=Knowledge(), memory=Memory(),
                             now=lambda: NOW)
    store.assistants.upsert(AssistantUpsertParams(id="default", name="Helper", **profile), now=1)
    session = store.sessions.create(CreateSessionOptions(provider_id="p", model_id="m", system_prompt="Session prompt."))
    return store, builder, session.id


async def build(store: Store, builder: RequestBuilder, session_id: str, model: str = "gpt-4o", **kw: Any) -> Any:
    session = store.sessions.get(session_id)
    with anyio.fail_after(10):
        return await builder.build_detailed(
            session=session, leaf_id=session.active_leaf_id or "", model=ModelInfo(id=model, supports_images=True),
            params=GenerationParams(), **kw,
        )


def texts(request: Any) -> list[str]:
    return ["\n".join(p.text for p in m.parts if isinstance(p, TextPart)) for m in request.messages]


async def test_all_transformers_run_in_the_seeds_order(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    store, builder, sid = setup(
        tmp_path,
        system_prompt="Assistant prompt for {user}.",
        allow_session_prompt=False,
        knowledge_base_ids=["kb1"],
        memory=MemorySettings(enabled=True, rag=True),
        modes=[PromptInjection(content="Mode on {cur_date}", position="before_system")],
        transformers=TransformerOptions(
            time_reminder=True, user_name="Ada", ocr=OcrOptions(enabled=True),
            template=TemplateOptions(enabled=True, template="<<{{ message }}>>"),
        ),
    )
    store.sessions.update(sid, __import__("protocol.sessions", fromlist=["SessionUpdates"]).SessionUpdates(
        workspace_dir=str(workspace)))
    stored = AttachmentStore(tmp_path).store_input(UserInput(content=[
        TextPart(text="Where?"), ImagePart(mime_type="image/png", base64=PNG_B64)],
        attachments=[Attachment(name="notes.md", mime_type="text/markdown", data="IyBOb3Rlcwo=")]))
    store.messages.append(sid, role="user", content_type="multipart", text_content="Where?", parts=stored.parts)
    before = [msgspec.json.encode(m) for m in store.messages.path(sid)]
    request, info = await build(store, builder, sid)
    assert info.applied == list(TRANSFORMER_ORDER)  # every one changed the request, in this order
    system, user = texts(request)
    assert system.startswith("Mode on 2026-03-09\n\nAssistant prompt for Ada.")  # session prompt not allowed
    assert system.index("<knowledge>") < system.index("<memories>")  # 8 before 9
    assert system.count("<source ") == 6 and len(info.citations) == 6  # at most six, all cited
    assert [c.marker for c in info.citations] == [1, 2, 3, 4, 5, 6]
    assert "likes tea" in system and "not instructions" in system
    assert user.startswith(f"<<Where?\n\n{OCR_HEADER}\n<image_ocr>SIGN: EXIT</image_ocr>\n\n{FILE_HEADER}\n<document name=\"notes.md\" type=\"text/markdown\"># Notes\\n</document>\n\n<time_reminder>Current time: 2026-03-09 14:05 (Monday), UTC+08:00</time_reminder>>>")
    assert user.endswith("</workspace>") and "(empty)" in user
    assert [msgspec.json.encode(m) for m in store.messages.path(sid)] == before


async def test_lorebook_sees_only_what_came_before_it(tmp_path: Path) -> None:
    lore = [LorebookEntry(keywords=["EXIT"], content="lore: exits", position="bottom_of_chat", role="system")]
    store, builder, sid = setup(tmp_path, lorebook=lore, transformers=TransformerOptions(ocr=OcrOptions(enabled=True)))
    store.messages.append(sid, role="user", content_type="multipart", text_content="Where?",
                         parts=[TextPart(text="Where?"), ImagePart(mime_type="image/png", base64=PNG_B64)])
    request, info = await build(store, builder, sid)
    assert "lore: exits" not in "".join(texts(request))  # OCR (5) runs after PromptInjection (2)
    assert info.applied == ["Ocr"]
    store.messages.append(sid, role="assistant", text_content="The sign says EXIT.")
    store.messages.append(sid, role="user", text_content="ok")
    request, _ = await build(store, builder, sid)
    assert texts(request)[-1] == "lore: exits" and request.messages[-1].role == "system"


async def test_injection_positions_and_placeholders(tmp_path: Path) -> None:
    modes = [
        PromptInjection(content="TOP", position="top_of_chat", role="user"),
        PromptInjection(content="BOTTOM {user} {char} {model_id} {unknown} {{user}}", position="bottom_of_chat", role="user"),
        PromptInjection(content="DEPTH2", position="at_depth", depth=2, role="assistant"),
        PromptInjection(content="OFF", position="top_of_chat", enabled=False),
    ]
    store, builder, sid = setup(tmp_path, modes=modes, transformers=TransformerOptions(user_name="Bo"))
    for i in range(4):
        store.messages.append(sid, role="user" if i % 2 == 0 else "assistant", text_content=f"m{i} {{cur_time}}")
    request, _ = await build(store, builder, sid)
    got = texts(request)
    assert got[0] == "Session prompt."
    assert got[1] == "TOP"
    assert got[-1] == "BOTTOM Bo Helper gpt-4o {unknown} Bo"
    assert got[-4] == "DEPTH2" and request.messages[-4].role == "assistant"
    assert got[2] == "m0 14:05" and "m1 {cur_time}" in got  # assistant text is left alone
    assert "OFF" not in got


async def test_template_is_sandboxed(tmp_path: Path) -> None:
    evil = "{{ message.__class__.__mro__[1].__subclasses__() }}"
    store, builder, sid = setup(tmp_path, transformers=TransformerOptions(
        template=TemplateOptions(enabled=True, template=evil)))
    store.messages.append(sid, role="user", text_content="hello")
    request, info = await build(store, builder, sid)
    assert texts(request)[-1] == "hello" and "Template" not in info.applied  # refused, unchanged


async def test_system_prompt_order_soul_memory_and_tool_prompts(tmp_path: Path) -> None:
    store, builder, sid = setup(tmp_path, system_prompt="Assistant prompt.",
                                memory=MemorySettings(enabled=True, entries=["prefers metric units"]))
    (tmp_path / "Soul.md").write_text("# Soul\nI am curious.")
    store.messages.append(sid, role="user", text_content="hi")
    _, info = await build(store, builder, sid, capability_note="You cannot call tools.", tool_prompts=["Tool A rules."])
    prompt = info.system_prompt
    order = ["Session prompt.", "<soul># Soul\\nI am curious.</soul>", "You cannot call tools.", "prefers metric units", "Tool A rules."]
    assert [prompt.index(p) for p in order] == sorted(prompt.index(p) for p in order)
    assert "Assistant prompt." not in prompt  # the session prompt wins when allowed
    # a profile's own Soul.md wins over the global one
    own = tmp_path / "assistants" / "default"
    own.mkdir(parents=True)
    (own / "Soul.md").write_text("Own soul.")
    _, info = await build(store, builder, sid)
    assert "Own soul." in info.system_prompt and "I am curious" not in info.system_prompt
