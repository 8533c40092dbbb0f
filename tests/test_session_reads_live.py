"""SessionService's reads of in-flight replies (``_live``), on a real store: a row read
while its reply streams gets the live content the chat engine overlays; a row read in
flight whose reply ended between the read and the overlay (no live job any more) is read
again, so a reader never sees a reply older than its last event; a row deleted meanwhile
keeps the first read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import pytest

from protocol.messages import MessagesGetParams
from protocol.sessions import CreateSessionOptions
from protocol.types import MessageV2
from sidecar.engine.sessions import SessionService
from sidecar.errors import NotFound
from sidecar.notify import Notifier
from sidecar.store import AsyncStore, Store

pytestmark = pytest.mark.anyio


async def _notify(method: str, params: Any) -> None:
    return None


class Rig(NamedTuple):
    store: AsyncStore
    service: SessionService
    session_id: str
    reply_id: str

    async def read_reply(self) -> MessageV2:
        found = await self.service.get_messages(MessagesGetParams(session_id=self.session_id))
        return next(m for m in found if m.id == self.reply_id)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """A real store holding a session whose reply is still pending, and its SessionService."""
    store = await AsyncStore.open(tmp_path)

    def write(s: Store) -> tuple[str, str]:
        with s.transaction():
            session = s.sessions.create(CreateSessionOptions(title="live"))
            user = s.messages.append(session.id, role="user", text_content="hi")
            reply = s.messages.append(session.id, role="assistant", parent_id=user.id, status="pending")
            return session.id, reply.id

    try:
        session_id, reply_id = await store.run(write)
        yield Rig(store, SessionService(store, Notifier(_notify)), session_id, reply_id)
    finally:
        await store.close()


async def test_a_streaming_row_gets_the_live_content(rig: Rig) -> None:
    rig.service.overlay_live = lambda m: msgspec.structs.replace(m, text_content="live text", status="streaming")
    assert (await rig.read_reply()).text_content == "live text"


async def test_a_reply_that_ended_between_the_read_and_the_overlay_is_read_again(rig: Rig) -> None:
    seen: list[str] = []

    def ended_meanwhile(m: MessageV2) -> MessageV2:
        # the first call sees the row read in flight; its reply has just ended (stored
        # final, no live job), so the overlay hands back the row as read
        if not seen:
            rig.store.blocking.messages.finish(m.id, status="completed", text_content="the whole reply", parts=None)
        seen.append(m.status)
        return m

    rig.service.overlay_live = ended_meanwhile
    got = await rig.read_reply()
    assert (got.status, got.text_content) == ("completed", "the whole reply")
    assert seen == ["pending"]  # the row read again is final: not overlaid again


async def test_a_row_deleted_meanwhile_keeps_the_first_read(rig: Rig) -> None:
    calls: list[str] = []

    def deleted_meanwhile(m: MessageV2) -> MessageV2:
        calls.append(m.id)
        rig.store.blocking.messages.delete_message(rig.session_id, m.id)
        return m

    rig.service.overlay_live = deleted_meanwhile
    got = await rig.read_reply()
    assert got.status == "pending" and calls == [rig.reply_id]  # not found again: not overlaid again
    with pytest.raises(NotFound):
        rig.store.blocking.messages.get(rig.reply_id)
