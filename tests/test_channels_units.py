"""Channels in-process: the store's dedup window and delivery summaries, the stream-mode
plan, rate limits and the loop guard, per-platform defaults, and the service when the
engine refuses a turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import apsw
import msgspec
import pytest

from protocol.channels import (
    ChannelConfig,
    ChannelConfigUpsertParams,
    ChannelMessageParams,
    ChannelReplyParams,
    ReplyImageChunk,
    ReplyTextChunk,
)
from protocol.chat import SendParams, SendResult
from protocol.sessions import CreateSessionOptions
from protocol.types import MessageV2
from sidecar.channels.platforms import resolve_config
from sidecar.channels.ratelimit import LoopGuard, TokenBucket
from sidecar.channels.service import ChannelService
from sidecar.channels.stream import ReplyAddress, acked_messages, plan
from sidecar.engine.events import EventHub
from sidecar.errors import EngineError, InvalidParams
from sidecar.store import AsyncStore, Store, migrations
from sidecar.store.attachments import AttachmentStore
from sidecar.store.channels import DeliveryRow, InboxRow
from sidecar.notify import Notifier

pytestmark = pytest.mark.anyio

HOUR = 3600 * 1000


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def cfg(platform: str = "plain", **fields: Any) -> ChannelConfig:
    return resolve_config(msgspec.convert({"id": "c", "platform": platform, **fields}, ChannelConfigUpsertParams), 0)


def inbox(key: str, now: int, state: str = "done", session_id: str | None = None) -> InboxRow:
    return InboxRow(id=f"i-{key}-{now}", channel_id="c", dedup_key=key, chat_id="chat", session_id=session_id,
                    action="reply", state=state, received_at=now, updated_at=now)


def payload(seq: int, message_id: str | None, kind: str = "send", chunks: list[Any] | None = None) -> ChannelReplyParams:
    return ChannelReplyParams(
        delivery_id=f"d{seq}", channel="c", chat_id="chat", session_id="s", message_id=message_id, seq=seq,
        final=False, kind=kind,  # type: ignore[arg-type]
        chunks=chunks if chunks is not None else [ReplyTextChunk(text=f"t{seq}", format="plain")],
    )


def test_dedup_window_and_pruning(tmp_path: Path) -> None:
    clock = Clock()
    store = Store(tmp_path, clock=clock)
    try:
        repo = store.channels
        repo.upsert_config(cfg())
        window = 24 * HOUR
        first, fresh = repo.receive(inbox("id:m1", clock.now), window)
        assert fresh
        again, fresh = repo.receive(inbox("id:m1", clock.now + 6 * HOUR), window)  # Feishu's 6 h redelivery
        assert not fresh and again.id == first.id
        assert repo.find_received("c", "chat", "id:m1", window) is not None
        clock.now += 25 * HOUR
        assert repo.find_received("c", "chat", "id:m1", window) is None
        later, fresh = repo.receive(inbox("id:m1", clock.now), window)
        assert fresh and later.id != first.id
        # an open row is never replaced nor pruned, however old
        repo.receive(inbox("id:open", clock.now, state="queued"), window)
        clock.now += 100 * HOUR
        assert not repo.receive(inbox("id:open", clock.now), window)[1]
        assert repo.prune_inbox("c", window) == 1  # the finished "id:m1" only
        assert repo.find_received("c", "chat", "id:open", window) is not None
    finally:
        store.close()


def test_dedup_is_per_chat_also_for_the_inbox_of_an_older_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = migrations.MIGRATIONS.index(migrations.m_channel_dedup_per_chat)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:index])
    Store(tmp_path).close()  # the schema of the build before it: UNIQUE(channel_id, dedup_key)
    monkeypatch.undo()
    conn = apsw.Connection(str(tmp_path / "chat.db"))
    conn.execute("INSERT INTO channel_configs VALUES ('c', 'plain', ?, 1, 1)", (msgspec.json.encode(cfg()).decode(),))
    conn.execute(
        "INSERT INTO channel_inbox (id, channel_id, dedup_key, chat_id, action, state, input, received_at, updated_at)"
        " VALUES ('old', 'c', 'id:m1', 'chat', 'reply', 'queued', '{}', 5, 5)"
    )
    conn.close()
    clock = Clock(10)
    store = Store(tmp_path, clock=clock)
    try:
        repo = store.channels
        kept = repo.find_received("c", "chat", "id:m1", HOUR)
        assert kept is not None and kept.id == "old" and kept.state == "queued" and kept.input == "{}"
        assert not repo.receive(inbox("id:m1", clock.now), HOUR)[1]  # a redelivery in its chat
        other = msgspec.structs.replace(inbox("id:m1", clock.now), id="other", chat_id="another chat")
        row, fresh = repo.receive(other, HOUR)  # the same platform id in another chat is another message
        assert fresh and row.id == "other"
        assert repo.find_received("c", "another chat", "id:m1", HOUR) is not None
        reader = apsw.Connection(str(tmp_path / "chat.db"))
        names = {r[0] for r in reader.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'channel_inbox'")}
        reader.close()
        assert {"idx_channel_inbox_received", "idx_channel_inbox_open", "idx_channel_inbox_platform"} <= names
    finally:
        store.close()


def test_delivery_summary_follows_every_state(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.channels
        repo.upsert_config(cfg())
        session = store.sessions.create(CreateSessionOptions())
        reply = store.messages.append(session.id, role="assistant", text_content="hi")
        repo.mark_pending(reply.id, "c", "chat")
        assert store.messages.get(reply.id).delivery.status == "pending"  # type: ignore[union-attr]
        rows = repo.add_deliveries([(payload(1, reply.id), 0), (payload(2, reply.id), 1)])
        assert store.messages.get(reply.id).delivery.status == "pending"  # type: ignore[union-attr]
        repo.mark_sent(rows[0].id, 1)
        assert store.messages.get(reply.id).delivery.status == "sending"  # type: ignore[union-attr]
        repo.mark_acked(rows[0].id, "pm1")
        repo.mark_failed(rows[1].id, "no acknowledgement")
        summary = store.messages.get(reply.id).delivery
        assert summary is not None and (summary.status, summary.delivered, summary.failed, summary.error) == (
            "failed", 1, 1, "no acknowledgement"
        )
        assert repo.mark_acked(rows[1].id, None)  # late
        summary = store.messages.get(reply.id).delivery
        assert summary is not None and (summary.status, summary.error, summary.deliveries) == ("delivered", None, 2)
        assert not repo.mark_acked("unknown", None)
        # the summary travels with export/import
        exported = store.sessions.export(session.id)
        assert exported.messages[0].delivery == summary
    finally:
        store.close()


def test_deleting_a_channel_fails_its_open_deliveries_and_keeps_sessions(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.channels
        repo.upsert_config(cfg())
        session = store.sessions.create(CreateSessionOptions(channel_id="c"))
        reply = store.messages.append(session.id, role="assistant", text_content="hi")
        repo.link("c", '["chat","chat"]', session.id, "chat")
        repo.add_deliveries([(payload(1, reply.id), 0)])
        assert repo.delete_config("c") and not repo.delete_config("c")
        assert store.messages.get(reply.id).delivery.status == "failed"  # type: ignore[union-attr]
        assert store.sessions.get(session.id).channel_id == "c"
        assert repo.open_chats() == [] and repo.linked_session("c", '["chat","chat"]') is None
    finally:
        store.close()


def test_open_rows_of_a_deleted_session_fail_at_start(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.channels
        repo.upsert_config(cfg())
        gone = store.sessions.create(CreateSessionOptions())
        kept = store.sessions.create(CreateSessionOptions())
        repo.receive(inbox("a", 1, state="queued", session_id=gone.id), HOUR)
        repo.receive(inbox("b", 1, state="running", session_id=kept.id), HOUR)
        store.sessions.delete(gone.id)
        assert repo.open_sessions() == [kept.id]
        assert repo.next_open(kept.id) is not None
    finally:
        store.close()


ADDRESS = ReplyAddress(channel="c", chat_id="chat", thread_id=None, reply_to="pm", session_id="s", message_id="m", inbox_id="i")


def text(t: str) -> ReplyTextChunk:
    return ReplyTextChunk(text=t, format="plain")


def row(seq: int, kind: str, target: int, state: str, chunk: Any = None) -> DeliveryRow:
    p = payload(seq, "m", kind, [] if kind == "delete" else [chunk or text(f"v{seq}")])
    return DeliveryRow(id=p.delivery_id, channel_id="c", chat_id="chat", message_id="m", inbox_id=None, seq=seq,
                       kind=kind, target=target, payload=p, state=state, created_at=0, updated_at=0)


def test_stream_plan_sends_edits_and_recalls() -> None:
    assert [(p.kind, t) for p, t in plan(ADDRESS, [text("a")], [], {}, 1, final=False)] == [("send", 0)]
    rows = [row(1, "send", 0, "acked", text("a")), row(2, "send", 1, "failed", text("b")),
            row(3, "edit", 0, "acked", text("ab")), row(4, "send", 2, "acked", text("c"))]
    state = acked_messages(rows)
    assert {k: v[1].text for k, v in state.items()} == {0: "ab", 2: "c"}  # type: ignore[union-attr]
    steps = plan(ADDRESS, [text("abc"), text("b")], [ReplyImageChunk(url="https://i/p.png")], state, 5, final=True)
    assert [(p.kind, t, p.edit_of, p.seq, p.final) for p, t in steps] == [
        ("edit", 0, "d1", 5, False),   # content changed
        ("send", 1, None, 6, False),   # its send had failed
        ("delete", 2, "d4", 7, False),  # the final text needs two messages, not three
        ("send", 3, None, 8, True),    # the image after every streamed message
    ]
    # nothing changed at the end: the last message is edited once more as the final delivery
    done = acked_messages([row(1, "send", 0, "acked", text("x"))])
    (only,) = plan(ADDRESS, [text("x")], [], done, 2, final=True)
    assert (only[0].kind, only[0].final, only[0].edit_of) == ("edit", True, "d1")


def test_token_bucket_and_loop_guard() -> None:
    now = [0.0]
    bucket = TokenBucket(60, 3, clock=lambda: now[0])
    assert bucket.wait_time(3) == 0
    bucket._tokens = 0.0  # three sent
    assert bucket.wait_time(1) == pytest.approx(1.0)
    now[0] = 2.0
    assert bucket.wait_time(3) == pytest.approx(1.0)
    assert bucket.wait_time(10) == pytest.approx(1.0)  # never more than the burst is asked for
    assert TokenBucket(0, 1).wait_time(100) == 0

    guard = LoopGuard(clock=lambda: now[0])
    key = ("c", "chat")
    assert [guard.record(key, 3, 60_000, 30_000) for _ in range(4)] == [False, False, False, True]
    assert guard.cooling(key)
    now[0] += 31
    assert not guard.cooling(key)
    now[0] += 120  # the window slid past
    assert not guard.record(key, 3, 60_000, 30_000)


def test_platform_defaults() -> None:
    table = {
        "feishu": ("feishu_card", 28_000, "json_bytes", 300, True),
        "lark": ("feishu_card", 28_000, "json_bytes", 300, True),
        "dingtalk": ("dingtalk_md", 20_000, "utf8_bytes", 20, True),
        "wecom": ("wecom_md", 4_096, "utf8_bytes", 20, False),
        "wechat": ("plain", 2_048, "utf8_bytes", 60, False),
        "slack": ("slack_blocks", 40_000, "chars", 60, True),
        "plain": ("plain", 4_000, "chars", 0, True),
    }
    for platform, (dialect, size, unit, per_minute, can_edit) in table.items():
        c = cfg(platform)
        assert (c.dialect, c.limits.max_message_size, c.limits.size_unit, c.rate.messages_per_minute, c.can_edit) == (
            dialect, size, unit, per_minute, can_edit
        ), platform
        assert c.limits.dedup_window_ms is not None and c.limits.dedup_window_ms >= 24 * HOUR
    with pytest.raises(InvalidParams, match="replyMode"):
        cfg("wechat", replyMode="stream")
    with pytest.raises(InvalidParams, match="maxSectionChars"):
        cfg("slack", limits={"maxSectionChars": 100})


class RefusingEngine:
    async def send(self, params: SendParams) -> SendResult:
        raise EngineError("the engine refuses this turn")

    def is_generating(self, session_id: str) -> bool:
        return False

    def overlay_live(self, message: MessageV2) -> MessageV2:
        return message


async def test_a_refused_turn_is_stored_and_the_chat_told(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path)
    sent: list[tuple[str, Any]] = []
    got = anyio.Event()

    async def notify(method: str, params: Any) -> None:
        sent.append((method, params))
        if method == "channel:reply":
            got.set()

    hub = EventHub(notify)
    try:
        async with anyio.create_task_group() as tg:
            service = ChannelService(
                store=store, chat=RefusingEngine(), events=hub,
                notify=Notifier(hub.publish), attachments=AttachmentStore(tmp_path), task_group=tg,
            )
            await service.load()
            await service.upsert_config(
                msgspec.convert({"id": "c", "platform": "plain", "allowEveryone": True}, ChannelConfigUpsertParams)
            )
            params = msgspec.convert(
                {"channel": "c", "chatId": "chat", "chatType": "private", "sender": {"id": "u"}, "messageId": "m",
                 "text": "hello", "timestamp": 1},
                ChannelMessageParams,
            )
            result = await service.message(params)
            with anyio.fail_after(10):
                await got.wait()
            (reply,) = [p for m, p in sent if m == "channel:reply"]
            assert reply.message_id is None and reply.chunks[0].text.startswith("(Could not answer: the engine refuses")
            messages = await store.run(lambda s: s.messages.query(result.session_id))  # type: ignore[arg-type]
            assert [(m.role, m.text_content) for m in messages] == [("user", "hello")]
            tg.cancel_scope.cancel()
    finally:
        await store.close()


def test_scope_keys_titles_and_meta() -> None:
    from sidecar.channels.routing import _meta, _title, scope_key

    def params(**fields: Any) -> ChannelMessageParams:
        return msgspec.convert(
            {"channel": "c", "chatId": "oc_1", "chatType": "group", "chatName": "Ops", "sender": {"id": "u1", "name": "Ann"},
             "timestamp": 1, **fields},
            ChannelMessageParams,
        )

    threaded = params(threadId="t9")
    assert scope_key(cfg(), threaded) == '["chat","oc_1"]'
    assert scope_key(cfg(scope="chat_sender"), threaded) == '["chat_sender","oc_1","u1"]'
    assert scope_key(cfg(scope="thread"), threaded) == '["thread","oc_1","t9"]'
    assert scope_key(cfg(scope="thread"), params()) == '["chat","oc_1"]'  # no thread: the chat
    assert _title(cfg(scope="thread"), threaded) == "plain - group - Ops (thread)"
    assert _title(cfg(scope="chat_sender"), params()) == "plain - group - Ops / Ann"
    assert _title(cfg(), params(chatType="private", chatName=None)) == "plain - private - Ann"
    assert _meta(cfg(scope="thread"), threaded, "k") == {
        "platform": "plain", "chatId": "oc_1", "chatType": "group", "scope": "thread", "scopeKey": "k",
        "route": "local", "chatName": "Ops", "threadId": "t9",
    }
