"""What a task must never do, over the real server (test clock, scripted provider):
start a second run of itself while one is being started (``task:run`` requests that arrive
in one read, or one and its scheduled time: exactly one run, the others -32002 or a
``skipped`` time), end the user's own reply in the session it continues (a reply paused
for a tool approval or still streaming survives, the run is ``skipped`` saying the session
was busy), or keep ``newSession`` options that ``chat:session:create`` refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider, wait_final
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar
from test_tasks_e2e import move, ms, next_task_note, runs

pytestmark = pytest.mark.anyio

HOURLY = {"kind": "cron", "expression": "0 * * * *", "timezone": "UTC"}
OPEN = ("queued", "running", "paused")


async def together(proc: SidecarProcess, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Send the requests in one write (they reach the server in one read) and return their answers."""
    ids = [proc.new_id() for _ in calls]
    await proc.send_line("\n".join(json.dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": p})
                                   for i, (m, p) in zip(ids, calls)))
    return [await proc.response(i) for i in ids]


async def until_ended(proc: SidecarProcess, task_id: str) -> list[dict[str, Any]]:
    """The task's runs once none is open (polled: a run's end is not timed)."""
    with anyio.fail_after(30):
        while True:
            listed = await runs(proc, task_id)
            if not any(r["status"] in OPEN for r in listed):
                return listed
            await anyio.sleep(0.05)


async def test_run_requests_sent_together_start_exactly_one_run(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data", "--test-clock", str(ms(2026, 3, 10, 9, 0))) as proc:
        await configure_provider(proc, chat.base_url)
        session = await proc.call("chat:session:create", {"title": "shared"})
        task = await proc.call("task:create", {"name": "t", "schedule": HOURLY, "prompt": "Do the job.",
                                               "sessionId": session["id"]})
        await chat.script({"text": "Job done.", "delay_ms": 300}, {"text": "A second run must not happen."})
        answers = await together(proc, *[("task:run", {"id": task["id"]})] * 3)
        started = [a["result"] for a in answers if "result" in a]
        refused = [a["error"] for a in answers if "error" in a]
        assert len(started) == 1 and [e["code"] for e in refused] == [-32002, -32002], answers
        assert all(e["data"] == {"taskId": task["id"]} for e in refused)
        listed = await until_ended(proc, task["id"])
        assert [(r["id"], r["status"]) for r in listed] == [(started[0]["id"], "completed")]
        messages = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert [(m["role"], m["status"], m["textContent"]) for m in messages] == [
            ("user", "completed", "Do the job."), ("assistant", "completed", "Job done.")]
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_a_run_request_and_the_scheduled_time_together_start_one_run(tmp_path: Path) -> None:
    rounds = 4  # which of the two wins varies; each round must start exactly one run
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data", "--test-clock", str(ms(2026, 3, 10, 9, 59, 59))) as proc:
        await configure_provider(proc, chat.base_url)
        task = await proc.call("task:create", {"name": "t", "schedule": HOURLY, "prompt": "Do the job."})
        seen = 0
        for hour in range(10, 10 + rounds):
            await chat.script({"text": f"Job done at {hour}.", "delay_ms": 200})
            manual, clock = await together(proc, ("task:run", {"id": task["id"]}),
                                           ("sidecar:test:clock", {"now": ms(2026, 3, 10, hour, 0)}))
            assert clock["result"]["now"] == ms(2026, 3, 10, hour, 0)
            every = await until_ended(proc, task["id"])  # newest first: this round's come first
            listed = every[:len(every) - seen]
            seen = len(every)
            went = [r for r in listed if r["status"] != "skipped"]
            assert len(went) == 1 and went[0]["status"] == "completed", (hour, manual, listed)
            if "result" in manual:  # the manual run won: the scheduled time found it going
                assert went[0]["id"] == manual["result"]["id"]
                assert [(r["trigger"], r["error"]) for r in listed if r["status"] == "skipped"] == [
                    ("schedule", "its previous run was still going")]
            else:  # the scheduled time won: task:run was refused
                assert manual["error"]["code"] == -32002 and went[0]["trigger"] == "schedule"
                assert len(listed) == 1
        assert len([b for b in await chat.requests() if b.get("stream")]) == rounds
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_a_task_never_ends_the_users_reply_in_the_session_it_continues(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    write = {"id": "w1", "name": "workspace_write_file", "arguments": {"path": "report.txt", "content": "mine"}}
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data", "--test-clock", str(ms(2026, 3, 10, 9, 59))) as proc:
        await configure_provider(proc, chat.base_url)
        session = await proc.call("chat:session:create", {"title": "work", "workspaceDir": str(workspace)})
        task = await proc.call("task:create", {"name": "hourly", "schedule": HOURLY, "prompt": "Hourly check-in.",
                                               "sessionId": session["id"]})
        # the user's reply waits for the approval of its write when the task's time comes
        await chat.script({"tool_calls": [write]}, {"text": "Report written."})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "Write my report."}})
        with anyio.fail_after(20):
            while not await proc.call("tool:pending:list", {"sessionId": session["id"]}):
                await anyio.sleep(0.05)
        await move(proc, ms(2026, 3, 10, 10, 0))
        skipped = await next_task_note(proc, "task_finished", task["id"])
        assert (skipped["trigger"], skipped["status"], skipped["messageId"]) == ("schedule", "skipped", None)
        assert "session was busy" in skipped["error"]
        assert [p["toolCallId"] for p in await proc.call("tool:pending:list", {"sessionId": session["id"]})] == ["w1"]
        messages = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert [(m["role"], m["status"]) for m in messages] == [("user", "completed"), ("assistant", "paused")]
        # the user approves: their reply goes on to its end
        approved = await proc.call("chat:tool:approve", {"sessionId": session["id"], "toolCallId": "w1",
                                                         "decision": "approved"})
        assert approved["resumed"] is True
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        assert (workspace / "report.txt").read_text() == "mine"
        # a reply still streaming is not superseded either (task:run: the same rule)
        await chat.script({"text": "slow " * 20, "delay_ms": 100}, {"text": "Checked in."})
        second = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "Go on."}})
        manual = await proc.call("task:run", {"id": task["id"]})
        ended = await next_task_note(proc, "task_finished", task["id"])
        assert (ended["id"], ended["status"]) == (manual["id"], "skipped") and "busy" in ended["error"]
        assert (await wait_final(proc, second["messageId"]))["type"] == "stream_end"
        assert not proc.notifications("task_fired")
        # idle again: the next time of the task runs in the session
        await move(proc, ms(2026, 3, 10, 11, 0))
        assert (await next_task_note(proc, "task_finished", task["id"]))["status"] == "completed"
        messages = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert [(m["role"], m["status"], m["textContent"]) for m in messages][-2:] == [
            ("user", "completed", "Hourly check-in."), ("assistant", "completed", "Checked in.")]
        assert all(m["status"] == "completed" for m in messages)
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_new_session_options_are_checked_as_chat_session_create_checks_them(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data", "--test-clock", str(ms(2026, 3, 10, 9, 0))) as proc:
        provider = await configure_provider(proc, chat.base_url)
        base = {"name": "x", "schedule": HOURLY, "prompt": "p"}
        for options, field in (
            ({"mode": "remote"}, "newSession.mode"),
            ({"providerId": "no-such-provider"}, "newSession.providerId"),
            ({"providerId": provider["id"], "modelId": "no-such-model"}, "newSession.modelId"),
            ({"mode": "acp", "providerId": provider["id"]}, "newSession.providerId"),
            ({"workspaceDir": "relative/dir"}, "newSession.workspaceDir"),
            ({"channelId": "im"}, "newSession.channelId"),
        ):
            with pytest.raises(CallError) as err:
                await proc.call("task:create", {**base, "newSession": options})
            assert err.value.code == -32602 and field in err.value.message, (options, err.value.message)
        assert (await proc.call("task:list", {}))["total"] == 0
        good = {"providerId": provider["id"], "modelId": "scripted-1", "title": "Daily"}
        task = await proc.call("task:create", {**base, "newSession": good})
        assert task["newSession"]["providerId"] == provider["id"]
        with pytest.raises(CallError) as err:
            await proc.call("task:update", {"id": task["id"], "newSession": {"mode": "remote"}})
        assert err.value.code == -32602 and "newSession.mode" in err.value.message
        assert (await proc.call("task:get", {"id": task["id"]}))["newSession"] == task["newSession"]
        # the options stored are the ones a run uses
        await chat.script({"text": "ok"})
        await proc.call("task:run", {"id": task["id"]})
        done = await next_task_note(proc, "task_finished", task["id"])
        made = await proc.call("chat:session:get", {"id": done["sessionId"]})
        assert (done["status"], made["mode"], made["providerId"], made["title"]) == (
            "completed", "direct", provider["id"], "Daily")
        await proc.close()
