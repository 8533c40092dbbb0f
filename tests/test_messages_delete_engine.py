"""chat:messages:delete against the real chat engine, in process: turns are refused with
BUSY while a message delete runs (and taken again after it, also after a failed one), a
reply running on another branch is not stopped by a delete elsewhere, and a reply that
does not stop in time makes the delete BUSY with nothing deleted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from protocol.chat import EditResendParams
from protocol.errors import ErrorCode
from protocol.messages import MessagesDeleteParams
from sidecar.engine import chat as chat_module
from sidecar.engine.sessions import SessionService
from sidecar.errors import SidecarError
from sidecar.providers.types import ChatRequest, Finish, TextDelta
from test_engine_robustness import Rig, rig, send

pytestmark = pytest.mark.anyio


class Gated:
    """Answers at once until ``hold`` is set; then each reply waits for ``release``."""

    def __init__(self) -> None:
        self.hold = False
        self.release = anyio.Event()

    async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
        yield TextDelta(text="part ")
        if self.hold:
            await self.release.wait()
        yield TextDelta(text="done")
        yield Finish(reason="stop")


def service(r: Rig) -> SessionService:
    sessions = SessionService(r.store, r.events.notify)
    sessions.on_delete.append(r.engine.stop_session)
    return sessions


async def branch(r: Rig) -> list[str]:
    return [m.id for m in await r.store.run(lambda s: s.messages.query(r.session_id, None))]


async def test_turns_are_busy_while_messages_are_deleted_and_taken_again_after(tmp_path: Path, monkeypatch: Any) -> None:
    async with rig(tmp_path, Gated()) as r:
        first = await send(r, "one")
        assert await r.events.final(first) == "StreamEndEvent"
        user, reply = await branch(r)
        sessions = SessionService(r.store, r.events.notify)
        raced: list[SidecarError] = []

        async def hook(session_id: str, reason: str, below: str | None = None) -> Any:
            release = await r.engine.stop_session(session_id, reason, below)
            try:  # a send between the hook and the delete
                await send(r, "late")
            except SidecarError as exc:
                raced.append(exc)
            return release

        sessions.on_delete.append(hook)
        original = r.store.blocking.messages.delete

        def failing_delete(*args: Any) -> Any:
            raise SidecarError("disk full")

        monkeypatch.setattr(r.store.blocking.messages, "delete", failing_delete)
        params = MessagesDeleteParams(session_id=r.session_id, message_id=reply, mode="message")
        with pytest.raises(SidecarError, match="disk full"):
            await sessions.delete_messages(params)
        assert [e.code for e in raced] == [ErrorCode.BUSY] and r.engine._pruning == {}
        assert await branch(r) == [user, reply]
        monkeypatch.setattr(r.store.blocking.messages, "delete", original)
        raced.clear()
        result = await sessions.delete_messages(params)
        assert (result.deleted, result.active_leaf_id) == (1, user)
        assert [e.code for e in raced] == [ErrorCode.BUSY] and r.engine._pruning == {}
        assert await branch(r) == [user]
        again = await send(r, "after")  # the session takes sends again
        assert await r.events.final(again) == "StreamEndEvent"


async def test_a_reply_on_another_branch_keeps_running(tmp_path: Path) -> None:
    provider = Gated()
    async with rig(tmp_path, provider) as r:
        first = await send(r, "one")
        assert await r.events.final(first) == "StreamEndEvent"
        user, reply = await branch(r)
        provider.hold = True
        edited = await r.engine.edit_resend(
            EditResendParams(session_id=r.session_id, message_id=user, new_content="one, again")
        )
        await r.events.wait(edited.message_id, "TextDeltaEvent")
        result = await service(r).delete_messages(
            MessagesDeleteParams(session_id=r.session_id, message_id=user, mode="branch")
        )
        assert (result.deleted, result.active_leaf_id) == (2, edited.message_id)
        assert r.engine.is_generating(r.session_id)  # not stopped: it is not in the subtree
        provider.release.set()
        assert await r.events.final(edited.message_id) == "StreamEndEvent"
        assert await branch(r) == [edited.user_message_id, edited.message_id]
        # and a delete that reaches it does stop it
        provider.release = anyio.Event()
        running = await send(r, "two")
        await r.events.wait(running, "TextDeltaEvent")
        result = await service(r).delete_messages(
            MessagesDeleteParams(session_id=r.session_id, message_id=edited.user_message_id, mode="message")
        )
        # the edited question is a root: its reply goes with it (the next question becomes the root)
        assert result.deleted == 2 and await r.events.final(running) == "AbortedEvent"
        assert not r.engine.is_generating(r.session_id)
        stored = await r.store.run(lambda s: s.messages.get(running))
        assert stored.status == "aborted"


async def test_a_reply_that_does_not_stop_makes_the_delete_busy_and_nothing_goes(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(chat_module, "STOP_TIMEOUT_S", 0.2)
    release = anyio.Event()
    streaming = anyio.Event()

    class Stubborn:
        async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
            yield TextDelta(text="a")
            streaming.set()
            with anyio.CancelScope(shield=True):  # ignores the stop until released
                await release.wait()
            yield Finish(reason="stop")

    async with rig(tmp_path, Stubborn()) as r:
        try:
            first = await send(r)
            with anyio.fail_after(10):
                await streaming.wait()
            before = await branch(r)
            with pytest.raises(SidecarError) as caught:
                await service(r).delete_messages(
                    MessagesDeleteParams(session_id=r.session_id, message_id=before[0], mode="branch")
                )
            assert caught.value.code == ErrorCode.BUSY
            assert await branch(r) == before and r.engine._pruning == {}
            assert r.engine._jobs[r.session_id].job.message_id == first
        finally:
            release.set()
        assert await r.events.final(first) in ("StreamEndEvent", "AbortedEvent")
        assert len(await branch(r)) == 2
