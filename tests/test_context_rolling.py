"""RollingContext through the RequestBuilder on a real store: planning rules, summary reuse and
invalidation (edit, delete, branch switch), failure fallback, manual compaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from protocol.context import AssistantUpsertParams, ContextOptions
from protocol.sessions import CreateSessionOptions
from protocol.types import MessageV2, TextPart
from sidecar.errors import ProviderError
from sidecar.pipeline import planner
from sidecar.pipeline.builder import RequestBuilder
from sidecar.providers.types import GenerationParams, ModelInfo, RequestMessage
from sidecar.store import AsyncStore, Store
from sidecar.store.attachments import AttachmentStore

pytestmark = pytest.mark.anyio
MODEL = ModelInfo(id="gpt-4o")


class FakeModel:
    """The summary model: records every call, answers SUMMARY-<n> or fails on demand."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[RequestMessage]]] = []
        self.fail = False

    async def __call__(self, provider_id: str, model_id: str, messages: list[RequestMessage], **kw: Any) -> str:
        self.calls.append((provider_id, model_id, messages))
        if self.fail:
            raise ProviderError("scripted failure")
        return f"SUMMARY-{len(self.calls)}"

    def prompt(self, index: int = -1) -> str:
        return "\n".join(p.text for m in self.calls[index][2] for p in m.parts if isinstance(p, TextPart))


class World:
    def __init__(self, tmp: Path, threshold: int = 1000) -> None:
        self.store = Store(tmp)
        self.model = FakeModel()
        self.builder = RequestBuilder(AsyncStore(self.store), AttachmentStore(tmp), call_model=self.model)
        self.store.assistants.upsert(
            AssistantUpsertParams(id="default", name="Default", context=ContextOptions(compress_threshold=threshold)),
            now=1,
        )
        self.session = self.store.sessions.create(CreateSessionOptions(provider_id="p", model_id="m"))

    def add(self, role: str, words: int, parent: Any = None, label: str = "") -> MessageV2:
        text = (label + " " if label else "") + "word " * words
        kw = {} if parent is None else {"parent_id": parent}
        return self.store.messages.append(self.session.id, role=role, text_content=text.strip(), **kw)

    def chain(self, n: int, words: int = 100) -> list[MessageV2]:
        return [self.add("user" if i % 2 == 0 else "assistant", words, label=f"m{i}") for i in range(n)]

    async def build(self, leaf: str) -> Any:
        session = self.store.sessions.get(self.session.id)
        with anyio.fail_after(10):
            return await self.builder.build_detailed(
                session=session, leaf_id=leaf, model=MODEL, params=GenerationParams()
            )

    def stored(self) -> list[bytes]:
        import msgspec

        return [msgspec.json.encode(m) for m in self.store.messages.query(self.session.id, None)]


def texts(request: Any) -> list[str]:
    return ["".join(p.text for p in m.parts if isinstance(p, TextPart)) for m in request.messages]


# ---- the planner rules, one by one ----------------------------------------------------


def test_disabled_threshold_means_32000() -> None:
    assert planner.effective_threshold(0) == planner.DEFAULT_THRESHOLD == 32_000
    assert planner.effective_threshold(-1) == 32_000
    assert planner.effective_threshold(None) == 32_000
    roles = ["user", "assistant"] * 3
    assert not planner.plan_summarize([5000] * 6, roles, threshold=0).refresh  # 30k <= 32k
    assert planner.plan_summarize([6000] * 6, roles, threshold=0).refresh  # 36k > 32k


def test_no_plan_under_four_messages() -> None:
    plan = planner.plan_summarize([100_000] * 3, ["user", "assistant", "user"], threshold=1000)
    assert not plan.refresh and plan.window_start == 0
    # the four-message rule counts the summarized messages too
    assert planner.plan_summarize([900, 900, 900], ["user", "assistant", "user"], summary_tokens=10,
                                  covered_count=1, threshold=1000).refresh is False  # window keeps all 3


def test_recent_window_is_55_percent_and_at_least_four() -> None:
    roles = ["user", "assistant"] * 10
    plan = planner.plan_summarize([100] * 20, roles, threshold=1000)
    assert plan.refresh and len(roles) - plan.window_start == 6  # 550 tokens fit 5; moved back to a user
    assert planner.window_start([100] * 20, roles, 550) == 14
    big = planner.plan_summarize([1000] * 10, roles[:10], threshold=1000)
    assert 10 - big.window_start == 4  # none fits, four are kept anyway


def test_window_start_moves_back_to_a_user_message() -> None:
    roles = ["user", "assistant", "user", "assistant", "assistant", "assistant", "assistant", "assistant"]
    # four newest fit: start at index 4 (an assistant tool step) -> moved back to the user at 2
    assert planner.window_start([10] * 8, roles, 40) == 2


def test_sliding_window_and_smart_select() -> None:
    roles = ["user", "assistant"] * 10
    texts = [f"turn {i} about " + ("kubernetes ingress" if i in (4, 5) else "cooking pasta") for i in range(20)]
    texts[-2] = "question about kubernetes ingress again"
    sliding = planner.plan_sliding([100] * 20, roles, threshold=1000)
    assert 20 - sliding.window_start == 10  # the whole threshold, not 55%
    smart = planner.plan_smart([100] * 20, roles, texts, threshold=1000)
    assert 20 - smart.window_start == 6
    assert smart.kept_older[:2] == [0, 1]  # the first turn
    assert {4, 5} <= set(smart.kept_older)  # the relevant turn
    assert sum(100 for _ in smart.kept_older) + 600 <= 1000


# ---- through the builder on a real store ----------------------------------------------


async def test_under_threshold_sends_everything_and_never_calls_the_model(tmp_path: Path) -> None:
    w = World(tmp_path, threshold=10_000)
    msgs = w.chain(6, words=50)
    request, info = await w.build(msgs[-1].id)
    assert len(request.messages) == 6 and w.model.calls == []
    assert info.window.summary is None and info.window.estimated > 300


async def test_summary_reuse_refresh_merge_and_exact_prefix(tmp_path: Path) -> None:
    w = World(tmp_path, threshold=1000)
    msgs = w.chain(20)  # ~106 tokens each
    before = w.stored()
    request, info = await w.build(msgs[-1].id)
    assert len(w.model.calls) == 1 and info.window.refreshed
    window = info.window.messages
    assert window[0].role == "user" and len(window) >= 4
    covered = len(msgs) - len(window)
    assert [m.id for m in window] == [m.id for m in msgs[covered:]]
    # the summary model saw exactly the covered messages, the request carries summary + window
    prompt = w.model.prompt()
    assert "m0 word" in prompt and f"m{covered - 1} word" in prompt and f"m{covered} word" not in prompt
    assert "SUMMARY-1" in texts(request)[0] and len(request.messages) == len(window) + 1
    assert w.builder.context._repo.summary_ids(w.session.id) == [m.id for m in msgs[:covered]]

    # reuse: a second build of the same branch makes no call
    again, info2 = await w.build(msgs[-1].id)
    assert len(w.model.calls) == 1 and not info2.window.refreshed and info2.window.summary is not None
    assert texts(again) == texts(request)

    # growth: more messages push past the threshold again -> merge previous + newly covered
    more = [w.add("user" if i % 2 == 0 else "assistant", 100, label=f"n{i}") for i in range(10)]
    _, info3 = await w.build(more[-1].id)
    assert len(w.model.calls) == 2 and info3.window.refreshed
    merged = w.model.prompt()
    assert "<previous_summary>SUMMARY-1" in merged
    assert "m0 word" not in merged and f"m{covered} word" in merged  # only the newly covered ones
    branch = msgs + more
    new_covered = len(branch) - len(info3.window.messages)
    assert w.builder.context._repo.summary_ids(w.session.id) == [m.id for m in branch[:new_covered]]
    assert w.stored() == before + w.stored()[len(before):]  # nothing stored was rewritten
    assert w.stored()[: len(before)] == before


async def test_edit_delete_and_branch_switch_invalidate(tmp_path: Path) -> None:
    w = World(tmp_path, threshold=1000)
    msgs = w.chain(20)
    await w.build(msgs[-1].id)
    summary = w.builder.context._repo.get_summary(w.session.id)
    assert summary is not None
    covered = summary.covered_count
    assert (await w.build(msgs[-1].id))[1].window.summary is not None  # valid

    # edit: a sibling of a covered user message, with its own continuation
    edited = w.add("user", 100, parent=msgs[2].parent_id, label="edited")
    tail = [edited]
    for i in range(3):
        tail.append(w.add("assistant" if i % 2 == 0 else "user", 20, parent=tail[-1].id))
    w.model.fail = True  # the new branch needs no summary anyway (short): the old one is not used
    _, info = await w.build(tail[-1].id)
    assert info.window.summary is None and [m.id for m in info.window.messages][:2] == [msgs[0].id, msgs[1].id]

    # branch switch back to the original branch: valid again (same ids)
    w.store.messages.select_branch(w.session.id, msgs[-1].id)
    assert (await w.build(msgs[-1].id))[1].window.summary is not None

    # a branch that diverges after the summary's end keeps it
    fork = w.add("user", 10, parent=msgs[-2].id, label="late-fork")
    assert (await w.build(fork.id))[1].window.summary is not None

    # delete a covered message: its whole subtree goes, the summary no longer matches
    w.store.messages.delete_branch(msgs[covered - 1].id)
    _, info = await w.build(msgs[covered - 2].id)
    assert info.window.summary is None  # the old one is not used (and the new attempt fails)
    remaining = [m.id for m in msgs[: covered - 1]]
    window = [m.id for m in info.window.messages]
    assert window and window == remaining[-len(window):]


async def test_failed_summary_sends_only_the_recent_window(tmp_path: Path) -> None:
    w = World(tmp_path, threshold=1000)
    msgs = w.chain(20)
    w.model.fail = True
    request, info = await w.build(msgs[-1].id)
    assert len(w.model.calls) == 1 and info.window.failure == "scripted failure"
    assert info.window.summary is None
    window_ids = [m.id for m in info.window.messages]
    assert len(window_ids) < len(msgs) and window_ids == [m.id for m in msgs[-len(window_ids):]]
    assert len(request.messages) == len(window_ids)  # no system prompt, no older message
    assert "m0 word" not in "".join(texts(request))
    assert w.builder.context._repo.get_summary(w.session.id) is None


async def test_manual_compaction_with_instructions(tmp_path: Path) -> None:
    w = World(tmp_path, threshold=100_000)
    msgs = w.chain(12, words=50)
    session = w.store.sessions.get(w.session.id)
    profile = w.builder.profiles.for_session(session.id)
    outcome = await w.builder.context.compact(
        session=session, leaf_id=msgs[-1].id, assistant=profile.assistant, encoding="o200k_base",
        target_tokens=400, instructions="Keep every number.",
    )
    assert outcome.compacted and outcome.summary is not None
    assert "Keep every number." in w.model.prompt()
    assert outcome.window_count < 12 and outcome.tokens_after < outcome.tokens_before
    # the next request uses it (the threshold is far away: no new call)
    _, info = await w.build(msgs[-1].id)
    assert info.window.summary is not None and len(w.model.calls) == 1
    # too few messages: nothing to compact
    other = World(tmp_path / "other")
    few = other.chain(3)
    sess = other.store.sessions.get(other.session.id)
    none = await other.builder.context.compact(
        session=sess, leaf_id=few[-1].id, assistant=profile.assistant, encoding="o200k_base",
        target_tokens=10, instructions=None,
    )
    assert not none.compacted and other.model.calls == []


async def test_sliding_window_strategy_never_calls_a_model(tmp_path: Path) -> None:
    w = World(tmp_path, threshold=1000)
    w.builder.context._repo.set_session_settings(w.session.id, assistant_id=None, truncation_strategy="sliding-window")
    msgs = w.chain(20)
    request, info = await w.build(msgs[-1].id)
    assert w.model.calls == [] and info.window.strategy == "sliding-window"
    assert 4 <= len(request.messages) < 20 and info.window.messages[0].role == "user"


async def test_token_counts_are_cached(tmp_path: Path) -> None:
    w = World(tmp_path, threshold=100_000)
    msgs = w.chain(30, words=10)
    await w.build(msgs[-1].id)
    counted = w.builder.ledger.counted
    assert counted == 30
    await w.build(msgs[-1].id)
    assert w.builder.ledger.counted == counted  # memory cache
    fresh = RequestBuilder(AsyncStore(w.store), AttachmentStore(tmp_path), call_model=w.model)
    await fresh.build_detailed(session=w.store.sessions.get(w.session.id), leaf_id=msgs[-1].id, model=MODEL,
                               params=GenerationParams())
    assert fresh.ledger.counted == 0  # the database cache



async def test_summarizer_chunks_a_long_prefix_and_bounds_the_calls() -> None:
    from sidecar.pipeline.summary import Summarizer

    model = FakeModel()
    messages = [
        MessageV2(id=f"m{i}", session_id="s", role="user" if i % 2 == 0 else "assistant",
                  text_content=f"part{i} " + "word " * 200, created_at=i, updated_at=i)
        for i in range(40)
    ]
    summarizer = Summarizer(model, chunk_tokens=1000, max_chunks=3)
    with anyio.fail_after(5):
        text = await summarizer.summarize(previous="OLD", messages=messages, provider_id="p", model_id="m")
    assert text == "SUMMARY-3" and len(model.calls) == 3
    assert "<previous_summary>OLD" in model.prompt(0) and "earlier messages are not included" in model.prompt(0)
    assert "<previous_summary>SUMMARY-1" in model.prompt(1)  # each chunk merges into the summary so far
    assert "part39 word" in model.prompt(2) and "part0 word" not in "".join(model.prompt(i) for i in range(3))


async def test_a_compaction_between_the_read_and_the_refresh_is_seen(tmp_path: Path) -> None:
    """A request reads the branch (with summary S1), a manual compaction stores S2, then the
    request's refresh runs: it must plan on S2, never merge S1 with ids S2 already covers."""
    w = World(tmp_path, threshold=1000)
    msgs = w.chain(20)
    await w.build(msgs[-1].id)  # S1
    more = [w.add("user" if i % 2 == 0 else "assistant", 100, label=f"n{i}") for i in range(10)]
    ctx = w.builder.context
    session = w.store.sessions.get(w.session.id)
    profile = w.builder.profiles.for_session(session.id)
    stale = ctx.read_branch(session.id, more[-1].id, "o200k_base", "summarize-old")
    assert stale.summary is not None
    with anyio.fail_after(10):
        outcome = await ctx.compact(
            session=session, leaf_id=more[-1].id, assistant=profile.assistant, encoding="o200k_base",
            target_tokens=600, instructions=None,
        )
        assert outcome.compacted
        await ctx.prepare(
            session=session, leaf_id=more[-1].id, assistant=profile.assistant, strategy="summarize-old",
            encoding="o200k_base", read=stale,
        )
    ids = ctx._repo.summary_ids(w.session.id)
    assert ids is not None and len(ids) == len(set(ids))
    assert ids == [m.id for m in (msgs + more)[: len(ids)]]
    assert (await ctx.valid_summary(w.session.id, more[-1].id))[1]
    assert len(ctx._verified) == 1 and len(ctx._locks) == 0  # per-session state stays small
