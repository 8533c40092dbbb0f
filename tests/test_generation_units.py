"""Unit tests of the generation-completeness pieces: the budget arithmetic and its cut, the
stream-unsupported detection, suggestion parsing, a correction's parts, token-accurate
truncation, window-bounded summary chunks, progress reporting, and the tool assembly with
enabled tools, server-wide deny policies and the policy cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from protocol.context import AssistantProfile
from protocol.sessions import CreateSessionOptions
from protocol.types import MessageV2, TextPart, ThinkingPart, ToolResultPart, ToolUsePart
from sidecar.engine.generation import says_streaming_unsupported
from sidecar.progress import work_progress
from sidecar.engine.side import parse_suggestions
from sidecar.errors import EngineError
from sidecar.pipeline import budget as bg
from sidecar import tokens as tk
from sidecar.pipeline.summary import Summarizer
from sidecar.providers.errors import ProviderCallError
from sidecar.providers.types import GenerationParams, ModelInfo, RequestMessage
from sidecar.store import AsyncStore
from sidecar.store.messages import edited_parts
from sidecar.tools.base import Tool, ToolContext, ToolOutput
from sidecar.tools.service import ToolService
from sidecar.notify import Notifier

pytestmark = pytest.mark.anyio


# ---- the budget -----------------------------------------------------------------------------


def test_reserved_output_and_input_limit() -> None:
    window = ModelInfo(id="m", context_window=4096)
    assert bg.reserved_output(window, GenerationParams()) == 1024
    assert bg.reserved_output(ModelInfo(id="m", context_window=400_000), GenerationParams()) == bg.DEFAULT_RESERVE
    assert bg.reserved_output(ModelInfo(id="m", context_window=4096, max_output_tokens=500), GenerationParams()) == 500
    assert bg.reserved_output(window, GenerationParams(max_tokens=77)) == 77
    assert bg.reserved_output(ModelInfo(id="m"), GenerationParams()) == 0
    assert bg.input_limit(None, 100, True) is None
    assert bg.input_limit(4096, 1024, True) == 3072 - bg.REQUEST_OVERHEAD
    assert bg.input_limit(4096, 1024, False) == 3072 - 409 - bg.REQUEST_OVERHEAD  # an estimate keeps a margin


def test_fit_drops_the_oldest_whole_turns_and_never_the_pinned_turn() -> None:
    roles = ["system", "user", "assistant", "user", "assistant", "assistant", "user", "assistant"]
    costs = [100, 50, 50, 50, 50, 50, 300, 200]
    droppable = [False, True, True, True, True, True, True, False]
    # pinned from the latest user message (index 6): the history before it goes first
    dropped = bg.fit(costs, roles, droppable=droppable, pinned_from=6, limit=750)
    assert dropped == [1, 2]  # one turn is enough, and its reply goes with it
    dropped = bg.fit(costs, roles, droppable=droppable, pinned_from=6, limit=700)
    assert dropped == [1, 2, 3, 4, 5]  # the next turn, with both its replies
    assert bg.fit(costs, roles, droppable=droppable, pinned_from=6, limit=100) == [1, 2, 3, 4, 5]
    # what the pipeline added itself (an injection) is never dropped
    keep = [False, False, True, True, True, True, True, False]
    assert bg.fit(costs, roles, droppable=keep, pinned_from=6, limit=800) == [2]
    assert bg.fit(costs, roles, droppable=keep, pinned_from=6, limit=750) == [2, 3, 4, 5]


def test_the_count_cache_is_exact_and_bounded() -> None:
    cache = bg.CountCache(max_chars=100)
    text = "hello world " * 5
    assert cache.count(text, "cl100k_base") == tk.count_text(text)
    assert cache.uncached_chars([text, "new"], "cl100k_base") == 3
    cache.count("x" * 90, "cl100k_base")
    assert cache.uncached_chars([text], "cl100k_base") == len(text)  # evicted: over 100 chars held


def test_message_tokens_count_what_is_sent() -> None:
    cache = bg.CountCache()
    message = RequestMessage(role="assistant", parts=[
        TextPart(text="let me check"),
        ToolUsePart(id="c1", name="lookup", input={"q": "weather"}),
        ToolResultPart(tool_use_id="c1", content="sunny"),
    ])
    tokens, attachments = bg.message_tokens(message, "cl100k_base", cache)
    expected = (tk.MESSAGE_OVERHEAD + tk.count_text("let me check") + tk.count_text("lookup")
                + tk.count_text('{"q":"weather"}') + 8 + tk.count_text("sunny") + 8)
    assert (tokens, attachments) == (expected, 0)


# ---- streaming refused ----------------------------------------------------------------------


@pytest.mark.parametrize(("message", "expected"), [
    ("HTTP 400 Bad Request: Unsupported value: 'stream' does not support true with this model.", True),
    ("HTTP 400 Bad Request: Streaming is not supported for this model", True),
    ("HTTP 400: stream mode is disabled for this deployment", True),
    ("HTTP 400: The model o1 does not support 'stream'", True),
    ("HTTP 400: max_tokens is too large", False),
    ("HTTP 400: the upstream stream was reset", False),
])
def test_says_streaming_unsupported(message: str, expected: bool) -> None:
    assert says_streaming_unsupported(ProviderCallError(message, kind="http", status=400)) is expected


def test_only_a_400_switches() -> None:
    message = "streaming is not supported"
    assert not says_streaming_unsupported(ProviderCallError(message, kind="http", status=500))
    assert not says_streaming_unsupported(ProviderCallError(message, kind="in_stream"))


# ---- suggestions, corrections, truncation ---------------------------------------------------


def test_parse_suggestions() -> None:
    assert parse_suggestions("Here are some:\n1. A?\n2) B?\n- C?\n• D?") == ["A?", "B?", "C?"]
    assert parse_suggestions("“引号？”\n\n「第二个」\n引号？") == ["引号？", "第二个"]
    assert parse_suggestions("x" * 300) == []
    assert parse_suggestions("") == []


def test_edited_parts_keep_everything_but_the_text() -> None:
    thinking = ThinkingPart(text="why", signature="sig")
    use = ToolUsePart(id="c", name="t", input={})
    result = ToolResultPart(tool_use_id="c", content="r")
    parts = [thinking, TextPart(text="before"), use, result, TextPart(text="after")]
    assert edited_parts(parts, "fixed") == [thinking, use, result, TextPart(text="fixed")]
    assert edited_parts([TextPart(text="only")], "fixed") is None  # plain text stays text_content
    assert edited_parts(None, "fixed") is None
    assert edited_parts([thinking], "added") == [thinking, TextPart(text="added")]


def test_truncate_text_counts_tokens_not_characters() -> None:
    chinese = "上下文窗口管理" * 500
    for keep in ("head", "tail"):
        cut = tk.truncate_text(chinese, 100, keep=keep)
        assert tk.count_text(cut) <= 100 and cut
        assert (chinese.startswith(cut) if keep == "head" else chinese.endswith(cut))
    assert tk.truncate_text("short", 100) == "short"
    assert tk.truncate_text("anything", 0) == ""


async def test_summary_calls_fit_the_summary_models_window() -> None:
    seen: list[tuple[int, int]] = []

    async def model(provider_id: str, model_id: str, messages: list[RequestMessage], *, max_tokens: int, **_: object) -> str:
        tokens = sum(tk.MESSAGE_OVERHEAD + tk.count_text(p.text) for m in messages for p in m.parts
                     if isinstance(p, TextPart))
        seen.append((tokens, max_tokens))
        return "summary so far " * 20

    async def limits(provider_id: str, model_id: str) -> ModelInfo:
        return ModelInfo(id="gpt-4o-mini", context_window=2048)

    messages = [
        MessageV2(id=f"m{i}", session_id="s", role="user" if i % 2 == 0 else "assistant",
                  text_content=("消息内容 " * 400 if i == 3 else f"message {i} " * 60), created_at=i, updated_at=i)
        for i in range(40)
    ]
    with anyio.fail_after(30):
        await Summarizer(model, limits=limits).summarize(
            previous=None, messages=messages, provider_id="p", model_id="m", max_tokens=300,
        )
    assert len(seen) == 4  # max_chunks: the oldest blocks are left out
    for prompt, answer in seen:
        assert answer == 300 and prompt + answer <= 2048, seen


# ---- progress -------------------------------------------------------------------------------


async def test_progress_ends_once_with_the_failure() -> None:
    sent: list[Any] = []

    async def notify(method: str, params: Any) -> None:
        sent.append((method, params.kind, params.done, params.total, params.message))

    with pytest.raises(EngineError):
        async with work_progress(Notifier(notify), "t", "working") as progress:
            assert progress is not None
            await progress.begin(10)
            raise EngineError("the disk is full")
    assert sent == [("sidecar:progress", "begin", 0, 10, "working"),
                    ("sidecar:progress", "end", 0, 10, "failed: the disk is full")]
    async with work_progress(Notifier(notify), None, "nothing") as none:
        assert none is None


# ---- tool assembly --------------------------------------------------------------------------


class Fake(Tool):
    def __init__(self, name: str, server: str | None = None) -> None:
        self.name = name
        self.server_key = f"mcp:{server}" if server else None
        self.source = "mcp" if server else "local"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(text="ok")


async def test_assembly_honours_enabled_tools_deny_and_the_policy_cache(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path / "data")
    reads: list[int] = []

    async def all_policies() -> Any:
        reads.append(1)
        return await store.run(lambda s: s.tools.policies())

    service = ToolService(
        data_dir=tmp_path / "data",
        get_setting=lambda key: store.run(lambda s: s.settings.get(key)),
        set_setting=lambda key, value: store.run(lambda s: s.settings.set(key, value)),
        search=lambda query, options: store.run(lambda s: s.search.messages(query, options)),
        policies=lambda keys: store.run(lambda s: s.tools.policies(keys)),
        extra_tools=lambda: [Fake("mcp__files__read", "files"), Fake("mcp__files__delete", "files"), Fake("other")],
        all_policies=all_policies,
        policy_version=lambda: store.blocking.tools.policy_version,
    )
    try:
        await service.load()
        session = await store.run(lambda s: s.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
        model = ModelInfo(id="m")

        async def names(**kw: Any) -> list[str]:
            return [t.name for t in (await service.assemble(session, model, **kw)).tools]

        everything = await names()
        assert everything[-5:] == ["mcp__files__read", "mcp__files__delete", "other", "read_tool_output",
                                   "get_session_capabilities"]
        assert len(reads) == 1  # loaded once, then cached
        await names()
        assert len(reads) == 1

        files = AssistantProfile(id="a", name="A", enabled_tools=["mcp:files"])
        assert await names(assistant=files) == ["mcp__files__read", "mcp__files__delete", "read_tool_output",
                                                "get_session_capabilities"]
        none = AssistantProfile(id="b", name="B", enabled_tools=[])
        registry = await service.assemble(session, model, assistant=none)
        assert len(registry) == 0 and registry.capability_note
        assert await names(assistant=AssistantProfile(id="c", name="C", enabled_tools=["no_such_tool"])) == []

        # a server-wide deny hides its tools; a tool's own policy wins over its server's
        await store.run(lambda s: s.tools.set_policy("mcp:files", "deny"))
        await store.run(lambda s: s.tools.set_policy("mcp__files__read", "ask"))
        assert await names(assistant=files) == ["mcp__files__read", "read_tool_output", "get_session_capabilities"]
        assert len(reads) == 2  # the counter moved: read again once
        await store.run(lambda s: s.tools.set_policy("get_session_capabilities", "deny"))
        assert await names(assistant=files) == ["mcp__files__read", "read_tool_output"]
        assert await names(enabled=False) == []
    finally:
        await service.aclose()
        await store.close()


# ---- the first delta of an idle send: one worker-thread hop ---------------------------------


async def test_an_idle_send_reaches_its_first_delta_in_one_worker_thread_hop(tmp_path: Path, monkeypatch: Any) -> None:
    import anyio.to_thread
    import msgspec

    from protocol.chat import SendParams, UserInput
    from protocol.settings import ChatSettings
    from protocol.types import Usage
    from sidecar.engine.approvals import ApprovalService
    from sidecar.engine.chat import ChatEngine
    from sidecar.pipeline.builder import RequestBuilder
    from sidecar.providers.types import Finish, TextDelta, UsageUpdate
    from sidecar.store.attachments import AttachmentStore

    class Resolved(msgspec.Struct):
        provider: Any
        model: ModelInfo

    class Hello:
        async def stream(self, request: Any) -> Any:
            yield TextDelta(text="hello")
            yield UsageUpdate(usage=Usage(input_tokens=3, output_tokens=2))
            yield Finish(reason="stop")

    class Providers:
        async def resolve(self, provider_id: str, model_id: str) -> Resolved:
            return Resolved(Hello(), ModelInfo(id="m", context_window=64_000))

        async def cost(self, provider_id: str, model_id: str, usage: Usage) -> float:
            return 0.0

        async def disable_streaming(self, provider_id: str, model_id: str) -> None:
            raise AssertionError("not refused")

    class Settings:
        def current(self) -> ChatSettings:
            return ChatSettings(generate_titles=False, delta_coalesce_ms=0)

    hops: list[str] = []
    first_delta = anyio.Event()
    original = anyio.to_thread.run_sync

    async def counting(func: Any, *args: Any, **kwargs: Any) -> Any:
        if not first_delta.is_set():
            hops.append(getattr(func, "__name__", repr(func)))
        return await original(func, *args, **kwargs)

    async def notify(method: str, params: Any) -> None:
        if method == "chat:stream" and type(params).__name__ == "TextDeltaEvent":
            first_delta.set()

    store = await AsyncStore.open(tmp_path / "data")
    approvals = ApprovalService(store)
    tools = ToolService(
        data_dir=tmp_path / "data",
        get_setting=lambda key: store.run(lambda s: s.settings.get(key)),
        set_setting=lambda key, value: store.run(lambda s: s.settings.set(key, value)),
        search=lambda query, options: store.run(lambda s: s.search.messages(query, options)),
        policies=approvals.policies_for,
        all_policies=lambda: store.run(lambda s: s.tools.policies()),
        policy_version=lambda: store.blocking.tools.policy_version,
    )
    await tools.load()
    attachments = AttachmentStore(tmp_path / "data")
    providers = Providers()
    try:
        async with anyio.create_task_group() as tg:
            engine = ChatEngine(
                store=store, notify=Notifier(notify), providers=providers, attachments=attachments,
                requests=RequestBuilder(store, attachments, providers=providers), settings=Settings(),
                task_group=tg, tools=tools, approvals=approvals, data_dir=tmp_path / "data",
            )
            rounds: list[list[str]] = []
            for _ in range(2):  # the first warms the per-process caches
                session = await store.run(lambda s: s.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
                first_delta = anyio.Event()
                hops.clear()
                monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
                with anyio.fail_after(10):
                    await engine.send(SendParams(session_id=session.id, input=UserInput(content="hi there")))
                    await first_delta.wait()
                monkeypatch.setattr(anyio.to_thread, "run_sync", original)
                rounds.append(list(hops))
                while engine.is_generating(session.id):
                    await anyio.sleep(0.01)
            assert len(rounds[0]) >= 1 and len(rounds[1]) == 1, rounds  # the send's own hop: check, store, read ahead
            await engine.aclose()
    finally:
        await store.close()
