"""Every server fault is reported, loses nothing locally, and the next run continues."""

from __future__ import annotations

import pytest

from qiming_helpers import all_messages, all_sessions, configure, qiming_server, sync
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio

LIST = "/api/agent/conversation/list"
MESSAGES = "/api/agent/conversation/message/list"


async def state(proc) -> dict[str, tuple[dict, list]]:
    return {s["id"]: (s, await all_messages(proc, s["id"])) for s in await all_sessions(proc)}


async def setup(proc, server, count: int = 6, **config) -> list[int]:
    await proc.call("sidecar:initialize", {})
    ids = (await server.control("seed", {"count": count, "messages": 4}))["ids"]
    await configure(proc, server, **config)
    return ids


async def settle(proc, server, expected: int) -> None:
    """After the fault is gone: the next run finishes the job without duplicates."""
    await server.control("clear_faults")
    result = await sync(proc, "sync:pull")
    assert result["errors"] == [] and result["complete"] is True, result
    sessions = await all_sessions(proc)
    assert len(sessions) == expected == len({s["title"] for s in sessions})
    for s in sessions:
        assert s["messageCount"] == len(await all_messages(proc, s["id"])) == 4


async def test_5xx_is_retried_then_reported_per_conversation(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        ids = await setup(proc, server)
        # once: retried transparently; always for one conversation: reported, the others imported
        await server.fault({"path": LIST, "fault": "status", "status": 503, "times": 1},
                           {"path": MESSAGES, "fault": "status", "status": 500, "times": -1, "conversationId": ids[2]})
        result = await sync(proc, "sync:pull")
        assert result["pulled"] == 5
        (issue,) = result["errors"]
        assert issue["phase"] == "pull" and issue["kind"] == "http" and issue["status"] == 500
        assert issue["conversationId"] == ids[2] and issue["retryable"] is True
        tries = [r for r in await server.requests() if r["path"] == MESSAGES and r["body"]["conversationId"] == ids[2]]
        assert len(tries) == 3, "two retries with backoff, then reported"
        before = await state(proc)
        await settle(proc, server, 6)
        after = await state(proc)
        assert all(after[k] == v for k, v in before.items()), "what was imported is untouched"
        await proc.close()


async def test_timeouts_are_reported_and_the_next_run_continues(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        # generous on a loaded machine: an ordinary answer takes milliseconds, a stalled one 8 s
        ids = await setup(proc, server, requestTimeoutMs=3000)
        await server.fault({"path": MESSAGES, "fault": "timeout", "delayMs": 8000, "times": 3,
                            "conversationId": ids[0]})
        result = await sync(proc, "sync:pull")
        assert result["pulled"] == 5
        assert [(e["kind"], e["conversationId"]) for e in result["errors"]] == [("timeout", ids[0])]
        # the list itself times out: the run says it did not complete and changes nothing
        before = await state(proc)
        await server.fault({"path": LIST, "fault": "timeout", "delayMs": 8000, "times": 3})
        stalled = await sync(proc, "sync:pull")
        assert stalled["complete"] is False and [e["phase"] for e in stalled["errors"]] == ["list"]
        assert await state(proc) == before
        await settle(proc, server, 6)
        await proc.close()


async def test_token_expiry_mid_run_stops_at_once_and_asks_for_a_login(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await setup(proc, server, count=12)
        await proc.call("sync:settings:update", {"messagePageSize": 2})
        await server.fault({"path": MESSAGES, "fault": "expire", "after": 27, "times": 1})
        result = await sync(proc, "sync:pull")
        assert result["complete"] is False
        assert [e["kind"] for e in result["errors"]] == ["auth_required"]
        assert result["errors"][0]["code"] == "4010"
        updates = proc.notifications("server:status:updated")
        assert updates[-1]["state"] == "auth_required" or any(u["state"] == "auth_required" for u in updates)
        imported = await state(proc)
        assert 0 < len(imported) < 12
        assert all(s["messageCount"] == 4 for s, _ in imported.values()), "whole conversations only"
        # no retry loop: once 4010 came, nothing more was asked, and a new run asks nothing
        requests = len(await server.requests())
        with pytest.raises(CallError) as err:
            await sync(proc, "sync:run")
        assert err.value.code == -32004 and err.value.data["kind"] == "auth_required"
        assert len(await server.requests()) == requests
        status = await proc.call("server:status", {})
        assert status["state"] == "auth_required" and status["reachable"] is True
        # a new login: the next run continues where it stopped
        await configure(proc, server)
        await settle(proc, server, 12)
        assert await state(proc) != imported
        await proc.close()


async def test_a_4011_redirect_is_auth_required_too(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await setup(proc, server)
        await server.fault({"path": LIST, "fault": "auth4011", "times": 1})
        result = await sync(proc, "sync:pull")
        assert [(e["kind"], e["code"]) for e in result["errors"]] == [("auth_required", "4011")]
        assert (await proc.call("server:status", {}))["state"] == "ok", "the token still works: status says so"
        await settle(proc, server, 6)
        await proc.close()


async def test_malformed_envelopes_and_html_pages_are_reported(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        ids = await setup(proc, server)
        await server.fault(
            {"path": MESSAGES, "fault": "malformed", "times": 1, "conversationId": ids[0]},
            {"path": MESSAGES, "fault": "wrong_shape", "times": 1, "conversationId": ids[1]},
            {"path": MESSAGES, "fault": "html", "status": 502, "times": 3, "conversationId": ids[2]},
            {"path": MESSAGES, "fault": "html200", "times": 1, "conversationId": ids[3]},
        )
        result = await sync(proc, "sync:pull")
        assert result["pulled"] == 2
        issues = {e["conversationId"]: e for e in result["errors"]}
        assert issues[ids[0]]["kind"] == "malformed" and "envelope" in issues[ids[0]]["message"]
        assert issues[ids[1]]["kind"] == "malformed" and "unexpected data" in issues[ids[1]]["message"]
        assert issues[ids[2]]["kind"] == "http" and issues[ids[2]]["status"] == 502
        assert "HTML error page" in issues[ids[2]]["message"]
        assert issues[ids[3]]["kind"] == "malformed" and "HTML page" in issues[ids[3]]["message"]
        # a broken list page: nothing is imported from a page that cannot be read
        before = await state(proc)
        await server.fault({"path": LIST, "fault": "malformed", "times": 1})
        broken = await sync(proc, "sync:pull")
        assert broken["complete"] is False and broken["errors"][0]["phase"] == "list"
        assert await state(proc) == before
        await settle(proc, server, 6)
        await proc.close()


async def test_a_conversation_that_vanishes_between_list_and_messages(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        ids = await setup(proc, server)
        await server.fault({"path": MESSAGES, "fault": "vanish", "times": 1, "conversationId": ids[4]})
        result = await sync(proc, "sync:pull")
        assert result["pulled"] == 5
        (issue,) = result["errors"]
        assert issue["kind"] == "not_found" and issue["conversationId"] == ids[4] and "vanished" in issue["message"]
        assert len(await all_sessions(proc)) == 5
        await settle(proc, server, 5)
        await proc.close()


async def test_network_down_then_back(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        ids = await setup(proc, server)
        await server.fault({"path": MESSAGES, "fault": "disconnect", "times": 3, "conversationId": ids[5]})
        result = await sync(proc, "sync:pull")
        assert [(e["kind"], e["conversationId"]) for e in result["errors"]] == [("network", ids[5])]
        await settle(proc, server, 6)
        await proc.close()


async def test_a_cancelled_sync_stops_cleanly_and_the_next_one_finishes(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await setup(proc, server, count=40)
        await server.fault({"path": MESSAGES, "fault": "delay", "delayMs": 50, "times": -1})
        request_id = await proc.request("sync:pull", {"progressToken": "c"})
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "sidecar:progress"
                            and m["params"]["done"] >= 3, timeout=60)
        await proc.notify("$/cancelRequest", {"id": request_id})
        reply = await proc.response(request_id, timeout=30)
        assert reply["error"]["code"] == -32800
        ends = [p for p in proc.notifications("sidecar:progress") if p["kind"] == "end"]
        assert len(ends) == 1
        imported = await state(proc)
        assert all(s["messageCount"] == 4 for s, _ in imported.values())
        await settle(proc, server, 40)
        await proc.close()
