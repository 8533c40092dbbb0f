"""Whatever values the Qiming server puts in its conversations and messages, a pull answers
with a SyncResult, and once the server is right again the next pull brings everything.

The fake server (a real subprocess on loopback) sends its seeded conversations with some
fields replaced by any JSON value (numbers of any size, wrong types, dates from year 0 to
9999 and beyond, empty and long strings) through its ``wire`` overrides, in rounds drawn
before the sidecar starts. After each round:
- ``sync:pull`` answers a SyncResult: never -32603, never -32602 (those are the caller's);
- every session and every message is readable;
then the overrides are cleared (the server touches each conversation as it does) and a pull
must be complete without errors or skips, with every conversation's topic and every
message's text in the sidecar: no value the server once sent stops a later sync. Nothing
is logged as a traceback. The draws are fixed (``derandomize``): a failure replays.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutation import fixed_draws, json_values
from qiming_helpers import all_messages, all_sessions, configure, qiming_server, sync
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

CONVERSATIONS = 4
ROUNDS = 8
CONVERSATION_FIELDS = ["id", "topic", "topicUpdated", "modified", "created", "agentId", "userId", "type", "taskStatus",
                       "summary", "agent", "messageList", "sandboxSessionId", "variables", "devMode", "tenantId", "uid"]
MESSAGE_FIELDS = ["index", "id", "role", "type", "text", "think", "time", "finished", "finishReason", "attachments",
                  "senderType", "messageType", "metadata", "quotedText", "componentExecutedList", "userId", "agentId"]
DATES = ["2026-03-09T02:24:38.000+00:00", "9999-12-31T23:59:59.999+00:00", "0001-01-01T00:00:00Z",
         "0000-01-01T00:00:00Z", "2026-13-45T99:99:99Z", "not a date", "2026-03-09", "+275760-09-13T00:00:00Z"]
SERVER_VALUES = [2**53 + 1, 1e308, -1e308, 4102444800000, 253402300800000, "USER", "ASSISTANT", "SYSTEM", "CHAT",
                 "x" * 70_000, *DATES]
"""Values a server's fields meet: dates of every sort, epoch ms far ahead, roles, a long text."""
values = st.one_of(json_values, st.sampled_from(SERVER_VALUES))
overrides = st.dictionaries(st.sampled_from(CONVERSATION_FIELDS), values, min_size=1, max_size=3)
message_overrides = st.dictionaries(st.sampled_from(MESSAGE_FIELDS), values, min_size=1, max_size=3)
round_of = st.tuples(
    st.lists(st.tuples(st.integers(0, CONVERSATIONS - 1), overrides), max_size=2),
    st.lists(st.tuples(st.integers(0, CONVERSATIONS - 1), st.integers(0, 3), message_overrides), max_size=3),
)


async def readable(proc: Any) -> None:
    for session in await all_sessions(proc):
        await all_messages(proc, session["id"])


@fixed_draws(2)
@given(rounds=st.lists(round_of, min_size=ROUNDS, max_size=ROUNDS))
async def test_no_value_the_server_sends_fails_a_pull_or_stops_a_later_one(
    tmp_path_factory: pytest.TempPathFactory, rounds: list[Any]
) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await proc.call("sidecar:initialize", {})
        ids = (await server.control("seed", {"count": CONVERSATIONS, "messages": 4}))["ids"]
        await configure(proc, server)
        for conversation_changes, message_changes in rounds:
            by_id = {c["id"]: c for c in await server.conversations()}
            for which, wire in conversation_changes:
                await server.control("conversation", {"id": ids[which], "wire": wire})
            for which, position, wire in message_changes:
                message = by_id[ids[which]]["messages"][position]
                await server.control("update_message", {"conversationId": ids[which], "index": message["index"], "wire": wire})
            result = await sync(proc)  # a CallError here (any code) fails the test
            assert isinstance(result["skipped"], list) and isinstance(result["errors"], list), result
            await readable(proc)
            for conversation in by_id.values():  # the server is right again
                await server.control("conversation", {"id": conversation["id"], "wire": {}})
                for message in conversation["messages"]:
                    await server.control("update_message", {"conversationId": conversation["id"],
                                                            "index": message["index"], "wire": {}})
            result = await sync(proc)
            assert result["errors"] == [] and result["skipped"] == [] and result["complete"] is True, (result, rounds)
            sessions = await all_sessions(proc)
            for conversation in await server.conversations():
                texts = [m["text"] for m in conversation["messages"]]
                held = [s for s in sessions if s["title"] == conversation["topic"]]
                assert held, (conversation["topic"], [s["title"] for s in sessions], rounds)
                stored = {m["textContent"] for s in held for m in await all_messages(proc, s["id"])}
                assert set(texts) <= stored, (texts, stored, rounds)
        await proc.close(timeout=60)
    proc.assert_no_traceback()
