"""Qiming sync in-process: mapping rules, the client's envelope and retry rules, the chat SSE reader
(against the fake server), token helpers, and the periodic sync."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx2
import msgspec
import pytest

from protocol.types import FilePart, TextPart, ThinkingPart
from qiming_helpers import PASSWORD, USER, qiming_server
from sidecar.errors import InvalidParams, StoreError
from sidecar.store import AsyncStore
from sidecar.store.sync_records import ConversationUpdate, NewConversation
from sidecar.sync import service as service_module
from sidecar.sync.account import jwt_expiry, normalize_service_url
from sidecar.sync.client import ClientSettings, QimingClient
from sidecar.sync.errors import (
    AuthRequired,
    ConversationGone,
    ServerHttpError,
    ServerMalformed,
    ServerRejected,
    ServerUnreachable,
)
from sidecar.sync.mapping import normalize_messages
from sidecar.sync.wire import ChatMessageDto, to_ms
from sidecar.notify import Notifier

pytestmark = pytest.mark.anyio

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI1In0.secret-signature-value-0123456789"


def envelope(data, code="0000", message="success") -> bytes:
    return json.dumps({"code": code, "displayCode": code, "message": message, "data": data, "tid": "1",
                       "success": code == "0000"}).encode()


def client_with(handler, **settings) -> QimingClient:
    config = ClientSettings(service_url="http://qiming.test", retry_backoff_s=0.001, **settings)
    return QimingClient(config, token=TOKEN, transport=httpx2.MockTransport(handler))


# ---- mapping -----------------------------------------------------------------------------


def dto(**fields) -> ChatMessageDto:
    return msgspec.convert(fields, ChatMessageDto)


def test_mapping_roles_parts_statuses_and_dates():
    messages = normalize_messages([
        dto(index=3, id="a", role="ASSISTANT", text="<think>why</think>because", time="2026-03-09T02:25:09.000+00:00",
            finished=True, finishReason="EndTurn"),
        dto(index=1, id="u", role="USER", time="2026-03-09T02:25:01.000+00:00", finished=True,
            text='look <attachment>[{"fileUrl":"https://f.example/a.png","fileName":"a.png","mimeType":"image/png"},'
                 '{"fileUrl":"file:///etc/passwd","fileName":"passwd"}]</attachment>'),
        dto(index=2, role="SYSTEM", text="hidden"),
        dto(index=4, role="ASSISTANT", text="boom", finishReason="ERROR", finished=True),
        dto(index=5, role="ASSISTANT", text="part", finished=False),
        dto(index=6, role="ASSISTANT", text="stopped", finishReason="CANCELLED"),
        dto(index=1, role="USER", text="duplicate index"),
    ], fallback_time=1000)
    assert [m.index for m in messages] == [1, 3, 4, 5, 6]
    user, reply, error, partial, stopped = messages
    assert user.role == "user" and user.text == "look" and user.created_at == to_ms("2026-03-09T02:25:01Z")
    assert user.parts() == [
        TextPart(text="look"),
        TextPart(text='[attachment "passwd" (unknown type): no web address to fetch it from]'),
        FilePart(uri="https://f.example/a.png", mime_type="image/png", name="a.png"),
    ], "a server never makes the pipeline read a local file"
    assert reply.parts() == [ThinkingPart(text="why"), TextPart(text="because")] and reply.status == "completed"
    assert (error.status, error.error) == ("error", "boom")
    assert partial.status == "aborted" and partial.finished is False
    assert stopped.status == "aborted"
    assert error.created_at == reply.created_at, "a message without a time takes its predecessor's"
    assert user.digest != normalize_messages([dto(index=1, role="USER", text="look!")], 0)[0].digest


def test_dates_and_urls_and_tokens():
    assert to_ms("2026-03-09T02:24:38.000+00:00") == 1773023078000
    assert to_ms("2026-03-09T10:24:38.000+08:00") == 1773023078000
    assert to_ms("2026-03-09 02:24:38") == 1773023078000
    assert to_ms(1773023078000) == 1773023078000 and to_ms("nonsense") is None and to_ms(None) is None
    assert normalize_service_url(" HTTPS://Agent.Example.com:8443/base/ ") == "https://agent.example.com:8443/base"
    for bad in ("agent.example.com", "https://u:p@h", "https://h/?q=1", "http://h:99999"):
        with pytest.raises(InvalidParams):
            normalize_service_url(bad)
    assert jwt_expiry("a.eyJleHAiOjE4MDAwMDAwMDB9.c") == 1_800_000_000_000
    assert jwt_expiry("not-a-jwt") is None and jwt_expiry("a.!!!.c") is None


# ---- the client ----------------------------------------------------------------------------


async def test_envelope_errors_come_as_http_200_and_auth_is_never_retried():
    calls: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(request)
        return httpx2.Response(200, content=envelope(None, "4010", f"token {TOKEN} expired"))

    async with client_with(handler) as client:
        with pytest.raises(AuthRequired) as err:
            await client.list_conversations()
    assert len(calls) == 1
    assert TOKEN not in err.value.message and "***" in err.value.message
    assert calls[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert calls[0].headers["x-client-type"] == "desktop"


async def test_5xx_and_network_errors_are_retried_for_reads_but_create_is_not_repeated():
    calls: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(request.url.path)
        return httpx2.Response(500, content=b'{"status":500}')

    async with client_with(handler, max_retries=2) as client:
        with pytest.raises(ServerHttpError) as err:
            await client.list_messages(1)
        assert err.value.status == 500 and err.value.retryable and len(calls) == 3
        calls.clear()
        with pytest.raises(ServerHttpError):
            await client.create_conversation(1128)
        assert len(calls) == 1, "a /create that may have happened is never sent twice"

    attempts = 0

    def refuse_then_answer(request: httpx2.Request) -> httpx2.Response:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise httpx2.ConnectError("refused", request=request)
        return httpx2.Response(200, content=envelope({"id": 7, "topic": "t"}))

    async with client_with(refuse_then_answer) as client:
        created = await client.create_conversation(1128)
    assert created.id == 7 and attempts == 3, "never sent: safe to retry even /create"


async def test_not_the_envelope():
    answers = iter([
        httpx2.Response(200, content=b"<html><body>login</body></html>", headers={"content-type": "text/html"}),
        httpx2.Response(200, content=b'{"code":"0000","data":[{"id":'),
        httpx2.Response(200, content=envelope("a string, not a list")),
        httpx2.Response(200, content=b'{"data": []}'),
        httpx2.Response(200, content=envelope(None, "0001", "Conversation not found")),
        httpx2.Response(200, content=envelope(None, "4000", "conversationId must be non-null")),
        httpx2.Response(404, content=b"<html>nginx</html>", headers={"content-type": "text/html"}),
    ])
    async with client_with(lambda request: next(answers)) as client:
        for expected, words in (
            (ServerMalformed, "HTML page"), (ServerMalformed, "not the JSON envelope"),
            (ServerMalformed, "unexpected data"), (ServerMalformed, "no code"),
            (ConversationGone, "Conversation not found"), (ServerRejected, "code 4000"),
            (ServerHttpError, "HTML error page"),
        ):
            with pytest.raises(expected) as err:
                await client.list_messages(1)
            assert words in err.value.message and type(err.value) is expected


async def test_a_read_timeout_is_a_timeout():
    async def slow(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep(5)
        return httpx2.Response(200, content=envelope([]))

    async with client_with(slow, timeout_s=0.2, max_retries=1) as client:
        with anyio.fail_after(10):
            with pytest.raises(ServerUnreachable) as err:
                await client.list_conversations()
    assert err.value.kind == "timeout"


# ---- chat streams against the fake server (the client side of server-forwarded chat) --------


async def collect(events) -> list:
    return [e async for e in events]


class _Try(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    conversation_id: int
    message: str


async def test_chat_stream_sub_stop_permission_and_suggest_against_the_fake_server():
    async with qiming_server() as server:
        client = QimingClient(ClientSettings(service_url=server.url))
        async with client:
            await client.login(USER, PASSWORD)
            conv = await client.create_conversation(1128)
            cid = int(conv.id)
            await server.control("chat", {"events": [
                {"eventType": "MESSAGE", "data": {"type": "THINK", "text": "pondering"}},
                {"eventType": "PROCESSING", "data": {"type": "ToolCall", "name": "Bash", "status": "EXECUTING"}},
                {"eventType": "MESSAGE", "data": {"type": "CHAT", "text": "Hello "}},
                {"waitPermission": True, "toolId": "tool-9"},
                {"eventType": "MESSAGE", "data": {"type": "CHAT", "text": "world"}},
            ]})
            seen: list = []
            answered = False
            async with client.chat(_Try(conversation_id=cid, message="hi")) as events:
                async for event in events:
                    seen.append(event)
                    component = event.component()
                    if event.event_type == "PROCESSING" and component and component.sub_event_type == "REQUEST_PERMISSION":
                        # re-attach from a second connection: the turn so far is replayed
                        replayed: list[str] = []
                        async with client.chat_sub(cid) as replay:
                            async for again in replay:
                                replayed.append(again.event_type or "")
                                if len(replayed) == 4:
                                    break
                        assert replayed == ["MESSAGE", "PROCESSING", "MESSAGE", "PROCESSING"]
                    if event.event_type == "HEART_BEAT" and not answered:
                        answered = True  # the turn waits, alive, until the permission is answered
                        await client.permission_response(cid, "tool-9", "allow_once")
            kinds = [e.event_type for e in seen]
            assert kinds[0] == "MESSAGE" and "HEART_BEAT" in kinds and kinds[-1] == "FINAL_RESULT"
            assert seen[-1].completed and seen[-1].result().success is True
            text = "".join(e.message().text for e in seen if e.event_type == "MESSAGE" and e.message().type == "CHAT")
            assert text == "Hello world"
            answers = (await server.get("requests"))
            assert any(r["path"].endswith("/permission-request/response") and r["body"]["option"]["optionId"]
                       == "allow_once" for r in answers)
            messages = await client.list_messages(cid)
            assert [(m.role, m.text) for m in messages] == [("USER", "hi"), ("ASSISTANT", "Hello world")]
            assert messages[1].think == "pondering"

            # a turn that fails: an ERROR message then FINAL_RESULT success false
            await server.control("chat", {"events": [{"eventType": "MESSAGE", "data": {"type": "CHAT", "text": "par"}}],
                                          "fail": "model overloaded"})
            async with client.chat(_Try(conversation_id=cid, message="again")) as events:
                failed = await collect(events)
            assert failed[-1].completed and failed[-1].result().success is False
            assert failed[-2].message().finish_reason == "ERROR"

            # a stream that drops mid-turn ends without completed; sub of an idle turn says so
            await server.control("chat", {"events": [{"eventType": "MESSAGE", "data": {"type": "CHAT", "text": w}}
                                                     for w in "abcdef"], "dropAfter": 2, "delayMs": 20})
            async with client.chat(_Try(conversation_id=cid, message="drop")) as events:
                dropped: list = []
                with pytest.raises(ServerUnreachable):
                    async for event in events:
                        dropped.append(event)
            assert len(dropped) <= 2 and not any(e.completed for e in dropped)
            with anyio.fail_after(10):
                while True:
                    async with client.chat_sub(cid) as idle:
                        last = await collect(idle)
                    if last[-1].event_type == "ERROR":
                        break
                    await anyio.sleep(0.05)
            assert last[-1].error == "Conversation not executing"

            # stop ends a running turn early
            await server.control("chat", {"events": [{"eventType": "MESSAGE", "data": {"type": "CHAT", "text": "x"}}]
                                          * 200, "delayMs": 20})
            async with client.chat(_Try(conversation_id=cid, message="long")) as events:
                got = []
                async for event in events:
                    got.append(event)
                    if len(got) == 3:
                        await client.chat_stop(cid)
            assert got[-1].completed and got[-1].result().success is False and len(got) < 100
            assert await client.suggest(cid)


# ---- the periodic sync, in-process ------------------------------------------------------


async def test_periodic_sync_runs_when_enabled(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(service_module, "MINUTE_S", 0.05)
    async with qiming_server() as server:
        await server.control("seed", {"count": 2, "messages": 2})
        store = await AsyncStore.open(tmp_path)
        notes: list[tuple[str, object]] = []

        async def notify(method: str, params: object) -> None:
            notes.append((method, params))

        async def delete_path(session_id: str, reason: str, write):
            return await store.run(write)

        svc = service_module.SyncService(store, Notifier(notify), delete_path=delete_path)
        try:
            await svc.load()
            async with anyio.create_task_group() as tg:
                svc.start(tg)
                from protocol.sync import ServerConfigureParams, SyncSettingsUpdate

                await svc.configure(ServerConfigureParams(service_url=server.url, username=USER, password=PASSWORD))
                await svc.update_settings(SyncSettingsUpdate(auto_sync=True, interval_minutes=1))
                with anyio.fail_after(30):
                    while (await store.run(lambda s: s.sessions.query(_all()))).total < 2:
                        await anyio.sleep(0.05)
                await server.control("seed", {"count": 1, "messages": 2, "topicPrefix": "Later"})
                with anyio.fail_after(30):
                    while (await store.run(lambda s: s.sessions.query(_all()))).total < 3:
                        await anyio.sleep(0.05)
                await svc.update_settings(SyncSettingsUpdate(auto_sync=False))
                tg.cancel_scope.cancel()
            assert any(m == "server:status:updated" and p.last_sync_at for m, p in notes)
        finally:
            await svc.aclose()
            await store.close()


def _all():
    from protocol.sessions import SessionFilter

    return SessionFilter(limit=500)


# ---- the repository ------------------------------------------------------------------------


def test_a_server_index_of_another_conversation_never_touches_its_message(tmp_path: Path):
    from protocol.types import SessionV2
    from sidecar.store import Store
    from sidecar.sync.adapter import _pulled

    store = Store(tmp_path)
    try:
        repo = store.sync

        def pulled(cid: int, *texts: tuple[int, str]):
            return [_pulled(m) for m in normalize_messages(
                [dto(index=i, role="USER", text=t, time=1000 + i) for i, t in texts], 0)]

        def session(sid: str) -> SessionV2:
            return SessionV2(id=sid, title=sid, provider_id="", model_id="", created_at=1, updated_at=1)

        repo.import_new(NewConversation(
            account_key="k", conversation_id=1, agent_id=None, session=session("one"),
            messages=pulled(1, (1, "a"), (2, "b")), server_modified=1, server_topic="one",
            sandbox_session_id=None, now=5,
        ))
        other = repo.import_new(NewConversation(
            account_key="k", conversation_id=2, agent_id=None, session=session("two"),
            messages=pulled(2, (2, "stolen"), (3, "c")), server_modified=1, server_topic="two",
            sandbox_session_id=None, now=5,
        ))
        assert other.message_count == 1
        outcome = repo.import_update(ConversationUpdate(
            account_key="k", conversation_id=2, messages=pulled(2, (1, "rewritten"), (4, "d")), server_modified=2,
            server_topic="two", apply_title=None, expected_title="two", sandbox_session_id=None, now=6,
        ))
        assert outcome.added == 1 and outcome.changed == 0
        # a batch: one conversation the store refuses (its session id is taken) does not take
        # the others with it, and leaves nothing of itself behind
        results = repo.import_batch([
            NewConversation(account_key="k", conversation_id=3, agent_id=None, session=session("one"),
                            messages=pulled(3, (10, "x")), server_modified=1, server_topic="dup",
                            sandbox_session_id=None, now=7),
            NewConversation(account_key="k", conversation_id=4, agent_id=None, session=session("four"),
                            messages=pulled(4, (11, "y")), server_modified=1, server_topic="four",
                            sandbox_session_id=None, now=7),
        ])
        assert isinstance(results[0], StoreError) and isinstance(results[1], SessionV2)
        assert [m.text_content for m in store.messages.query("four")] == ["y"]
        assert 3 not in repo.links("k") and 4 in repo.links("k")
        assert [m.text_content for m in store.messages.query("one")] == ["a", "b"]
        assert [m.text_content for m in store.messages.query("two")] == ["c", "d"]
    finally:
        store.close()


async def test_a_stored_token_no_http_header_can_carry_asks_for_a_new_one_and_sends_nothing():
    """A token stored by a version that did not check it (non-ASCII was let through)."""
    from sidecar.sync.errors import AuthRequired

    sent = []
    config = ClientSettings(service_url="http://qiming.test", retry_backoff_s=0.001)
    client = QimingClient(config, token="tök-" + TOKEN, transport=httpx2.MockTransport(lambda r: sent.append(r)))
    try:
        with pytest.raises(AuthRequired) as err:
            await client.login_info()
        assert "server:configure" in str(err.value) and "tök" not in str(err.value)
        assert sent == []
    finally:
        await client.aclose()
