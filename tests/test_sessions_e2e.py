"""End to end over the real subprocess (``python -m sidecar``), as Electron speaks to it:
chat:session:create/list/get/update/fork/delete, chat:messages:get/tree/search/select,
export/import, and bad input answered with typed errors while the process keeps serving."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from protocol.errors import ErrorCode
from protocol.sessions import SessionListResult
from protocol.types import MessageTreeNode, MessageV2, SearchResult, SessionExport, SessionV2
from sidecar.store import Store
from sidecar_proc import CallError, spawn_sidecar


def _seed_messages(data_dir: Path, session_id: str) -> dict[str, str]:
    """Messages come from chat:send in the product; here they are written by the store
    directly (same data dir, no sidecar running) so this test does not depend on a provider."""
    store = Store(data_dir)
    try:
        u1 = store.messages.append(session_id, role="user", text_content="我们今天讨论全文搜索功能")
        a1 = store.messages.append(session_id, role="assistant", text_content="Search works in English too")
        a2 = store.messages.append(session_id, role="assistant", text_content="另一个回答", parent_id=u1.id)
        return {"u1": u1.id, "a1": a1.id, "a2": a2.id}
    finally:
        store.close()


@pytest.mark.anyio
async def test_session_methods_over_the_subprocess(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            created = await proc.call(
                "chat:session:create", {"title": "E2E", "tags": ["t1", "t2"], "folder": "work"},
                result_type=SessionV2,
            )
            assert created.title == "E2E" and created.tags == ["t1", "t2"]
            other = await proc.call("chat:session:create", {}, result_type=SessionV2)
            assert other.title == "New Chat" and other.provider_id == ""

            listed = await proc.call(
                "chat:session:list", {"folder": "work", "tags": ["t1"], "limit": 10},
                result_type=SessionListResult,
            )
            assert [s.id for s in listed.sessions] == [created.id] and listed.total == 1
            everything = await proc.call("chat:session:list", {}, result_type=SessionListResult)
            assert everything.total == 2

            got = await proc.call("chat:session:get", {"id": created.id}, result_type=SessionV2)
            assert got == created
            updated = await proc.call(
                "chat:session:update",
                {"id": created.id, "updates": {"title": "Renamed", "isPinned": True, "folder": ""}},
                result_type=SessionV2,
            )
            assert (updated.title, updated.is_pinned, updated.folder) == ("Renamed", True, None)

            await proc.close()
        proc.assert_all_jsonrpc()
        # One process per data dir (the Store holds a lock): the messages are written while
        # no sidecar runs, and a new one serves them (so the data also survives a restart).
        ids = await anyio.to_thread.run_sync(_seed_messages, tmp_path, created.id)
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})

            active = await proc.call(
                "chat:messages:get", {"sessionId": created.id}, result_type=list[MessageV2]
            )
            assert [m.id for m in active] == [ids["u1"], ids["a2"]]
            page = await proc.call(
                "chat:messages:get",
                {"sessionId": created.id, "options": {"leafId": ids["a1"], "limit": 1}},
                result_type=list[MessageV2],
            )
            assert [m.id for m in page] == [ids["a1"]]

            tree = await proc.call(
                "chat:messages:tree", {"sessionId": created.id}, result_type=list[MessageTreeNode]
            )
            assert [n.message.id for n in tree] == [ids["u1"]]
            assert [(c.message.id, c.is_active) for c in tree[0].children] == [
                (ids["a1"], False), (ids["a2"], True)
            ]
            selected = await proc.call(
                "chat:messages:select", {"sessionId": created.id, "leafId": ids["a1"]},
                result_type=list[MessageV2],
            )
            assert [m.id for m in selected] == [ids["u1"], ids["a1"]]

            hits = await proc.call(
                "chat:messages:search", {"query": "搜索"}, result_type=list[SearchResult]
            )
            assert [h.message_id for h in hits] == [ids["u1"]]
            assert hits[0].snippet == "我们今天讨论全文<mark>搜索</mark>功能"
            assert hits[0].session_title == "Renamed"
            hits = await proc.call(
                "chat:messages:search",
                {"query": "ENGLISH", "options": {"sessionId": created.id, "role": "assistant"}},
                result_type=list[SearchResult],
            )
            assert [h.message_id for h in hits] == [ids["a1"]]
            for hostile in ('"', "NEAR(a b", "-x*", "((("):
                assert await proc.call("chat:messages:search", {"query": hostile}) == []

            forked = await proc.call(
                "chat:session:fork", {"id": created.id, "messageId": ids["a1"]},
                result_type=SessionV2,
            )
            assert forked.title == "Renamed (fork)" and forked.message_count == 2
            copies = await proc.call(
                "chat:messages:get", {"sessionId": forked.id}, result_type=list[MessageV2]
            )
            assert [m.text_content for m in copies] == [
                "我们今天讨论全文搜索功能", "Search works in English too"
            ]

            exported = await proc.call(
                "chat:session:export", {"id": created.id}, result_type=SessionExport
            )
            assert len(exported.messages) == 3
            assert await proc.call("chat:session:delete", {"id": created.id}) == {"success": True}
            with pytest.raises(CallError) as err:
                await proc.call("chat:session:get", {"id": created.id})
            assert err.value.code == ErrorCode.NOT_FOUND
            assert await proc.call("chat:messages:search", {"query": "搜索"}) != []  # the fork's copy
            await proc.call(
                "chat:session:import",
                {"session": _wire(exported.session), "messages": [_wire(m) for m in exported.messages]},
            )
            again = await proc.call(
                "chat:session:export", {"id": created.id}, result_type=SessionExport
            )
            assert again == exported

            assert await proc.call("chat:session:pin", {"id": other.id, "pinned": True}) == {"success": True}
            assert await proc.call("chat:session:archive", {"id": other.id}) == {"success": True}
            archived = await proc.call(
                "chat:session:list", {"isArchived": True}, result_type=SessionListResult
            )
            assert [s.id for s in archived.sessions] == [other.id]

            await proc.close()
        proc.assert_all_jsonrpc()


def _wire(value: object) -> object:
    import msgspec

    return msgspec.to_builtins(value)


@pytest.mark.anyio
async def test_bad_input_over_the_subprocess(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with spawn_sidecar(tmp_path) as proc:
            s = await proc.call("chat:session:create", {"title": "keep"}, result_type=SessionV2)
            cases = [
                ("chat:session:get", {"id": "nope"}, ErrorCode.NOT_FOUND),
                ("chat:session:delete", {"id": "nope"}, ErrorCode.NOT_FOUND),
                ("chat:session:fork", {"id": s.id, "messageId": "nope"}, ErrorCode.NOT_FOUND),
                ("chat:messages:tree", {"sessionId": "nope"}, ErrorCode.NOT_FOUND),
                ("chat:session:list", {"limit": 0}, ErrorCode.INVALID_PARAMS),
                ("chat:session:list", {"limit": 100000}, ErrorCode.INVALID_PARAMS),
                ("chat:session:list", {"offset": -5}, ErrorCode.INVALID_PARAMS),
                ("chat:session:list", {"sortBy": "title"}, ErrorCode.INVALID_PARAMS),
                ("chat:session:list", {"tags": "t1"}, ErrorCode.INVALID_PARAMS),
                ("chat:session:list", {"tags": [1, 2]}, ErrorCode.INVALID_PARAMS),
                ("chat:session:update", {"id": s.id, "updates": {"messageCount": 9}}, ErrorCode.INVALID_PARAMS),
                ("chat:session:update", {"id": s.id, "updates": {"title": ""}}, ErrorCode.INVALID_PARAMS),
                ("chat:messages:get", {"sessionId": s.id, "options": {"limit": 0}}, ErrorCode.INVALID_PARAMS),
                ("chat:messages:search", {"query": "x", "options": {"limit": 1000}}, ErrorCode.INVALID_PARAMS),
            ]
            for method, params, code in cases:
                with pytest.raises(CallError) as err:
                    await proc.call(method, params)
                assert err.value.code == code, (method, params, err.value)
                assert err.value.message and "Traceback" not in err.value.message
            # Still serving, nothing changed.
            got = await proc.call("chat:session:get", {"id": s.id}, result_type=SessionV2)
            assert got == s
            await proc.close()
        proc.assert_all_jsonrpc()
