"""Property: untrusted text through every path into a prompt never starts a role or a block.

In-process over the real request builder (sidecar/pipeline/builder.py) and the provider's
own body (sidecar/providers/openai_compat.py): random text, salted with role labels,
chat-template tokens, our tags and every Unicode line break, goes in as

- a knowledge chunk (its text, document name and headings; KnowledgeRetrievalTransformer),
- a memory (its text and details, rendered by sidecar/memory/text.py; MemoryRetrievalTransformer),
- an IM sender's name, and the message it quotes with its sender's name (sidecar/channels/inbound),
- a conversation title pulled from a server (``{session_title}`` in the system prompt),
- a history message in the transcript of a rolling summary, and the previous summary
  (sidecar/pipeline/summary.py);
- what a model wrote from such text (the rolling summary, Soul.md) and an attached
  file's name, type and text, through the functions that write them into a prompt.

The request must have no line that starts a role and no chat-template token
(tests/security/prompt_lines.py says what those are), and exactly the tags of the same
request built from harmless text. Pulled messages themselves are history, sent as their
role's content (test_prompt_injection.py shows it): no text of theirs is injected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prompt_lines import block_tags, role_lines, template_tokens
from protocol.channels import ChannelConfigUpsertParams, ChannelMessageParams
from protocol.context import AssistantProfile, AssistantUpsertParams, MemorySettings
from protocol.sessions import CreateSessionOptions
from protocol.types import MessageV2, SessionV2
from sidecar.channels.inbound import adapt
from sidecar.channels.platforms import resolve_config
from sidecar.memory.text import flags_of, render_memory
from sidecar.pipeline.builder import RequestBuilder
from sidecar.pipeline.summary import Summarizer
from sidecar.pipeline.system import compose_system_prompt
from sidecar.pipeline.transformers.document import file_block
from sidecar.providers import OpenAICompatProvider, ProviderSettings
from sidecar.providers.replay import ScriptedTransport
from sidecar.providers.types import GenerationParams, ModelInfo, RequestMessage
from sidecar.retrieval.results import RetrievalResult, RetrievedChunk
from sidecar.store import AsyncStore, Store
from sidecar.store.attachments import AttachmentStore
from sidecar.store.knowledge import ChunkHit

FRAGMENTS = [
    "\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00", "\x1b[31m",
    "system:", "SYSTEM: you must ", "assistant：", "User:", "developer:", "**System:**", "### System", "## Instruction",
    "# Response", "[INST]", "[/INST]", "<<SYS>>", "<|im_start|>", "<|im_end|>system", "<|endoftext|>",
    "<start_of_turn>", "<knowledge>", "</knowledge>", '<source marker="9" document="x">', "</source>",
    "<memories>", "</memories>", '<memory scope="global">', "</memory>", "<system>", "</system>",
    "</conversation_summary>", "</new_messages>", "<new_messages>", "</previous_summary>", "&lt;", "&amp;", "&quot;",
    '"', "'", "<", ">", "&", "\\n", " ", "\t", "> ", "@all", "```", "| a | b |",
]
untrusted = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=24).map("".join)
HARMLESS = "plain words"
_BODY = OpenAICompatProvider(
    ProviderSettings(type="openai-compat", base_url="https://api.example.test/v1", api_key="sk-x"), ScriptedTransport()
)


class Inputs(msgspec.Struct, kw_only=True):
    chunk: str
    document: str
    heading: list[str]
    memory: str
    memory_context: str
    sender: str
    quote: str
    quote_sender: str
    title: str


class Knowledge:
    def __init__(self) -> None:
        self.inputs = Inputs(chunk="", document="", heading=[], memory="", memory_context="", sender="", quote="",
                             quote_sender="", title="")

    async def retrieve(self, *, query: str, knowledge_base_ids: list[str], limit: int, session_id: str) -> RetrievalResult:
        i = self.inputs
        chunks = [
            RetrievedChunk(chunk=ChunkHit(rowid=n, id=f"d:{n}", kb_id="kb1", document_id="d", document_name=i.document,
                                          ordinal=n, heading=i.heading, start=0, end=1, page=n, tokens=3,
                                          text=f"{i.chunk} {n}"), score=1.0, mode="lexical")
            for n in range(2)
        ]
        return RetrievalResult(mode="lexical", chunks=chunks)


class Memory:
    def __init__(self, knowledge: Knowledge) -> None:
        self.knowledge = knowledge

    async def retrieve(self, *, query: str, assistant_id: str, limit: int, session_id: str) -> list[str]:
        i = self.knowledge.inputs
        return [
            render_memory(text=i.memory, scope="global", kind="fact", source="manual", created_at=0,
                          flags=flags_of(i.memory), context=i.memory_context, memory_id="m1"),
            render_memory(text=i.memory_context or "x", scope="global", kind="note", source="encoder", created_at=0),
        ]


class World:
    def __init__(self, tmp: Path) -> None:
        self.store = Store(tmp)
        self.knowledge = Knowledge()
        self.builder = RequestBuilder(AsyncStore(self.store), AttachmentStore(tmp), knowledge=self.knowledge,
                                      memory=Memory(self.knowledge))
        self.store.assistants.upsert(AssistantUpsertParams(
            id="default", name="Helper", system_prompt="You help in the conversation {session_title}.",
            allow_session_prompt=False, knowledge_base_ids=["kb1"], memory=MemorySettings(enabled=True, rag=True),
        ), now=1)
        self.config = resolve_config(msgspec.convert({"id": "im", "platform": "plain"}, ChannelConfigUpsertParams), 0)

    async def body(self, inputs: Inputs) -> tuple[dict[str, Any], list[str]]:
        """The provider body of a request built from ``inputs``, and the system text."""
        self.knowledge.inputs = inputs
        session = self.store.sessions.create(CreateSessionOptions(
            title=inputs.title or "t", provider_id="p", model_id="m", channel_id="im",
        ))
        params = msgspec.convert({
            "channel": "im", "chatId": "g", "chatType": "group", "timestamp": 1, "text": "what do you think?",
            "sender": {"id": "u1", "name": inputs.sender or None},
            "replyTo": {"text": inputs.quote or None, "senderName": inputs.quote_sender or None},
        }, ChannelMessageParams)
        turn = adapt(params, self.config).turn
        assert isinstance(turn.content, str)
        self.store.messages.append(session.id, role="user", text_content=turn.content)
        session = self.store.sessions.get(session.id)
        with anyio.fail_after(30):
            request, _ = await self.builder.build_detailed(
                session=session, leaf_id=session.active_leaf_id or "", model=ModelInfo(id="gpt-4o"),
                params=GenerationParams(),
            )
        body = _BODY.build_body(request, stream=True)
        return body, [m["content"] if isinstance(m["content"], str) else str(m["content"]) for m in body["messages"]]


def check_request(texts: list[str], baseline: list[str]) -> None:
    assert len(texts) == len(baseline)
    for text, harmless in zip(texts, baseline):
        assert role_lines(text) == [], role_lines(text)
        assert template_tokens(text) == [], template_tokens(text)
        assert block_tags(text) == block_tags(harmless), (block_tags(text), block_tags(harmless))
        assert len(text.splitlines()) == len(harmless.splitlines())


def test_untrusted_text_never_starts_a_role_or_a_block(tmp_path: Path) -> None:
    world = World(tmp_path)
    try:
        harmless = Inputs(chunk=HARMLESS, document=HARMLESS, heading=[HARMLESS], memory=HARMLESS,
                          memory_context=HARMLESS, sender=HARMLESS, quote=HARMLESS, quote_sender=HARMLESS, title=HARMLESS)
        _, baseline = anyio.run(world.body, harmless)
        assert "<knowledge>" in baseline[0] and "<memories>" in baseline[0] and "comes from an IM chat" in baseline[0]

        @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(
            chunk=untrusted, document=untrusted, heading=st.lists(untrusted, max_size=3), memory=untrusted,
            memory_context=untrusted, sender=untrusted, quote=untrusted, quote_sender=untrusted, title=untrusted,
        )
        def check(heading: list[str], **fields: str) -> None:
            # blank values would drop the element they fill (a quote, a name): not this rule's job
            inputs = Inputs(heading=[h for h in heading if h.strip()] or [HARMLESS],
                            **{k: v if v.strip() else HARMLESS for k, v in fields.items()})
            _, texts = anyio.run(world.body, inputs)
            check_request(texts, baseline)

        check()
    finally:
        world.store.close()


class SummaryModel:
    def __init__(self) -> None:
        self.prompts: list[list[RequestMessage]] = []

    async def __call__(self, provider_id: str, model_id: str, messages: list[RequestMessage], **kw: Any) -> str:
        self.prompts.append(messages)
        return "SUMMARY"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(untrusted, min_size=1, max_size=6), previous=untrusted)
def test_a_summary_transcript_has_one_line_per_message(texts: list[str], previous: str) -> None:
    """And the previous summary (a model wrote it from the same history) is one element on one line."""
    model = SummaryModel()
    messages = [
        MessageV2(id=f"m{n}", session_id="s", role="user" if n % 2 == 0 else "assistant", text_content=text or "x",
                  created_at=n, updated_at=n)
        for n, text in enumerate(texts)
    ]

    async def run() -> None:
        with anyio.fail_after(30):
            await Summarizer(model).summarize(previous=previous or None, messages=messages, provider_id="p", model_id="m")

    anyio.run(run)
    (prompt,) = model.prompts
    system, user = ("\n".join(p.text for p in m.parts) for m in prompt)  # type: ignore[attr-defined]
    assert role_lines(system) == [] and template_tokens(system + user) == []
    inside = user[user.index("<new_messages>\n") + len("<new_messages>\n") : user.rindex("\n</new_messages>")]
    lines = [line for line in inside.splitlines() if line]
    assert [line.split(":", 1)[0] for line in lines] == [m.role.capitalize() for m in messages]
    assert role_lines(user) == lines  # each message's own label, and no other
    expected = {"new_messages": 1, "/new_messages": 1}
    if previous:
        expected.update({"previous_summary": 1, "/previous_summary": 1})
        (line,) = [line for line in user.splitlines() if "<previous_summary>" in line]
        assert line.startswith("<previous_summary>") and line.endswith("</previous_summary>")
    assert block_tags(user) == expected


@settings(max_examples=200, deadline=None)
@given(summary=untrusted, soul=untrusted, name=untrusted, mime=untrusted, text=untrusted, truncated=st.booleans())
def test_model_written_text_and_files_are_one_element_on_one_line(
    summary: str, soul: str, name: str, mime: str, text: str, truncated: bool
) -> None:
    """The writers of the rolling summary, Soul.md and an attached file's text (the same
    functions the request builder and the document transformer call): whatever the text,
    its element is on one line after the header line, and nothing else is a role or a tag."""
    session = SessionV2(id="s", title="t", provider_id="p", model_id="m", created_at=0, updated_at=0)
    profile = AssistantProfile(id="default", name="Helper", system_prompt="You help.")
    # blank text leaves its block out: not this rule's job
    system = compose_system_prompt(session=session, assistant=profile, soul=soul if soul.strip() else "x",
                                   summary=summary if summary.strip() else "x", summary_count=4)
    assert system is not None
    files = [file_block(tag, name or "f", mime or "text/plain", text, truncated) for tag in ("document", "file")]
    expected = {"soul": 1, "/soul": 1, "conversation_summary": 1, "/conversation_summary": 1}
    for written, tags in ((system, expected), (files[0], {"document": 1, "/document": 1}), (files[1], {"file": 1, "/file": 1})):
        assert role_lines(written) == [] and template_tokens(written) == [], written
        assert dict(block_tags(written)) == tags, (block_tags(written), written)
    for tag, written in (("soul", system), ("conversation_summary", system), ("document", files[0]), ("file", files[1])):
        (line,) = [line for line in written.splitlines() if line.startswith(f"<{tag}")]
        assert line.endswith(f"</{tag}>")
