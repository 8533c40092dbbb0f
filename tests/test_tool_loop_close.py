"""A stopped reply leaves no tool call open: ``ReplyTools.close``, the tool loop's part of
every error, aborted or limited ending.

A stop can land between a call's result reaching the reply and its row being marked done
(the result is in the reply's content, the row still says ``running``). The ending must
close that row too, or it stays open for good: the restart's recovery repairs only runs
still ``running``, and the ending has marked the run done. Found by the interleaving
property (tests/test_tool_loop_property.py) on a loaded machine; here the state it found
is built directly, so the check does not depend on timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.sessions import CreateSessionOptions
from protocol.settings import ChatSettings
from protocol.types import ToolResultPart
from sidecar.engine.lifecycle.driver import ReplyJob
from sidecar.engine.reply import ReplyBuilder
from sidecar.engine.tool_loop import CANCELLED_NOTE, ReplyTools, ToolLoop
from sidecar.store import AsyncStore
from sidecar.store.tools import ToolCallRecord, ToolRun

pytestmark = pytest.mark.anyio


class Feed:
    """The part of a reply that closing its calls uses: its content, and results added to it."""

    def __init__(self) -> None:
        self.content = ReplyBuilder()

    async def tool_result(self, call_id: str, output: str, is_error: bool, *, announce: bool = True) -> int:
        self.content.add_tool_result(call_id, output, is_error)
        return len(self.content.parts) - 1


async def test_a_stop_between_a_result_and_its_row_still_closes_the_row(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path)
    try:

        def reply_with_calls(s: Any) -> tuple[Any, Any]:
            session = s.sessions.create(CreateSessionOptions(provider_id="p", model_id="m"))
            user = s.messages.append(session.id, role="user", text_content="go")
            reply = s.messages.append(session.id, role="assistant", status="streaming", parent_id=user.id)
            s.tools.begin_run(ToolRun(message_id=reply.id, session_id=session.id, provider_id="p", model_id="m"))
            s.tools.add_calls([
                ToolCallRecord(message_id=reply.id, tool_call_id=call_id, session_id=session.id, tool_name=name,
                               arguments="{}", step=1, state=state)
                for call_id, name, state in (("ran", "free", "running"), ("cut", "free", "running"),
                                             ("asked", "guarded", "denied"))
            ])
            return session, reply

        session, message = await store.run(reply_with_calls)
        feed = Feed()
        for call_id in ("ran", "cut", "asked"):
            feed.content.add_tool_call(call_id, "free", "{}")
        feed.content.add_tool_result("ran", "ran free", False)  # its row was never marked done
        feed.content.add_tool_result("asked", "denied by the user", True)
        loop = ToolLoop(store=store, approvals=None, data_dir=tmp_path, services=None,  # closing needs no services
                        settings=ChatSettings)
        job = ReplyJob(session=session, message_id=message.id, parent_id=message.parent_id, provider_id="p",
                       model_id="m", resume=message)
        await ReplyTools(loop, job).close(feed, CANCELLED_NOTE, announce=False)

        rows = {c.tool_call_id: c.state for c in await store.run(lambda s: s.tools.calls(message.id))}
        assert rows == {"ran": "done", "cut": "cancelled", "asked": "done"}
        assert await store.run(lambda s: s.tools.list_open(states=("running", "approved"))) == []
        # the call that never finished has the stop's note as its result, the others keep theirs
        results = {p.tool_use_id: p.content for p in feed.content.parts if isinstance(p, ToolResultPart)}
        assert results == {"ran": "ran free", "cut": CANCELLED_NOTE, "asked": "denied by the user"}
    finally:
        await store.close()
