"""Scheduled tasks over the real server with the test clock (``--test-clock``,
moved by ``sidecar:test:clock``, which answers once the scheduler handled every time up to
the new one) and the scripted loopback provider: a cron task fires at its minute exactly
once, a time missed across a restart runs once or is skipped as the task says, a task never
overlaps itself (a run paused for a tool approval holds it and is reported paused), and
deleting a task stops its next run."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import pytest

from chat_helpers import configure_provider
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

PARIS = ZoneInfo("Europe/Paris")


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=PARIS).timestamp() * 1000)  # type: ignore[misc]


async def move(proc: SidecarProcess, when: int) -> None:
    assert (await proc.call("sidecar:test:clock", {"now": when}))["now"] == when


async def runs(proc: SidecarProcess, task_id: str) -> list[dict[str, Any]]:
    return (await proc.call("task:runs", {"taskId": task_id}))["runs"]


async def next_task_note(proc: SidecarProcess, method: str, task_id: str, timeout: float = 20) -> dict[str, Any]:
    return (await proc.next_matching(
        f"{method}:{task_id}",
        lambda m: isinstance(m, dict) and m.get("method") == method and m["params"]["taskId"] == task_id,
        timeout=timeout,
    ))["params"]


async def start(proc: SidecarProcess, base_url: str) -> None:
    await configure_provider(proc, base_url)
    settings = await proc.call("task:settings:update", {"timezone": "Europe/Paris"})
    assert settings == {"maxConcurrentRuns": 2, "timezone": "Europe/Paris"}


async def test_a_cron_task_fires_at_its_minute_exactly_once_and_not_after_its_delete(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data", "--test-clock", str(ms(2026, 3, 10, 8, 58, 30))) as proc:
        await start(proc, chat.base_url)
        task = await proc.call("task:create", {
            "name": "Morning report", "schedule": {"kind": "cron", "expression": "0 9 * * *"},
            "prompt": "Write the morning report.",
        })
        assert task["nextRunAt"] == ms(2026, 3, 10, 9, 0) and task["timezone"] == "Europe/Paris"
        assert task["scheduleText"] == "At 09:00 every day" and task["lastRun"] is None
        await move(proc, ms(2026, 3, 10, 8, 59, 59))
        assert await runs(proc, task["id"]) == []
        await chat.script({"text": "All systems nominal."})
        await move(proc, ms(2026, 3, 10, 9, 0))
        fired = await next_task_note(proc, "task_fired", task["id"])
        assert fired["trigger"] == "schedule" and fired["scheduledFor"] == ms(2026, 3, 10, 9, 0)
        assert fired["status"] == "running" and fired["sessionId"] and fired["messageId"]
        finished = await next_task_note(proc, "task_finished", task["id"])
        assert finished["id"] == fired["id"] and finished["status"] == "completed"
        messages = await proc.call("chat:messages:get", {"sessionId": fired["sessionId"]})
        assert [(m["role"], m["textContent"]) for m in messages] == [
            ("user", "Write the morning report."), ("assistant", "All systems nominal.")]
        session = await proc.call("chat:session:get", {"id": fired["sessionId"]})
        assert session["title"] == "Morning report"
        # the rest of that minute and the next ones: nothing more
        for when in (ms(2026, 3, 10, 9, 0, 30), ms(2026, 3, 10, 9, 1), ms(2026, 3, 10, 20, 0)):
            await move(proc, when)
        assert [r["id"] for r in await runs(proc, task["id"])] == [fired["id"]]
        got = await proc.call("task:get", {"id": task["id"]})
        assert got["nextRunAt"] == ms(2026, 3, 11, 9, 0) and got["lastRun"]["status"] == "completed"
        # deleted: its next time comes and nothing runs
        assert await proc.call("task:delete", {"id": task["id"]}) == {"success": True}
        await move(proc, ms(2026, 3, 11, 9, 0))
        await move(proc, ms(2026, 3, 12, 9, 0))
        with pytest.raises(CallError) as err:
            await proc.call("task:get", {"id": task["id"]})
        assert err.value.code == -32001
        assert len(proc.notifications("task_fired")) == 1
        assert len([b for b in await chat.requests() if b.get("stream")]) == 1
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_a_time_missed_across_a_restart_runs_once_or_is_skipped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    every = {"kind": "cron", "expression": "*/10 * * * *"}
    async with scripted_provider() as chat:
        async with spawn_sidecar(data, "--test-clock", str(ms(2026, 3, 10, 9, 5))) as proc:
            await start(proc, chat.base_url)
            once = await proc.call("task:create", {"name": "catch up", "schedule": every, "prompt": "Catch up."})
            skip = await proc.call("task:create", {"name": "skip", "schedule": every, "prompt": "Skip.",
                                                   "missed": "skip"})
            assert once["missed"] == "run_once" and skip["missed"] == "skip"
            await proc.close()
        # closed from 09:05 to 11:37: fifteen times missed
        async with spawn_sidecar(data, "--test-clock", str(ms(2026, 3, 10, 11, 37))) as proc:
            await proc.call("sidecar:initialize", {"protocolVersion": 1})
            fired = await next_task_note(proc, "task_fired", once["id"])
            assert fired["trigger"] == "missed" and fired["scheduledFor"] == ms(2026, 3, 10, 9, 10)
            assert (await next_task_note(proc, "task_finished", once["id"]))["status"] == "completed"
            skipped = await next_task_note(proc, "task_finished", skip["id"])
            assert (skipped["trigger"], skipped["status"]) == ("missed", "skipped")
            assert "missed" in skipped["error"]
            await move(proc, ms(2026, 3, 10, 11, 39))  # nothing is due before 11:40
            assert [r["trigger"] for r in await runs(proc, once["id"])] == ["missed"]
            assert [r["status"] for r in await runs(proc, skip["id"])] == ["skipped"]
            for task in (once, skip):
                assert (await proc.call("task:get", {"id": task["id"]}))["nextRunAt"] == ms(2026, 3, 10, 11, 40)
            # on time again: both run
            await move(proc, ms(2026, 3, 10, 11, 40))
            for task in (once, skip):
                assert (await next_task_note(proc, "task_finished", task["id"]))["status"] == "completed"
            assert [r["trigger"] for r in await runs(proc, skip["id"])] == ["schedule", "missed"]
            assert len([b for b in await chat.requests() if b.get("stream")]) == 3
            await proc.close()


async def test_a_task_never_overlaps_itself_and_a_paused_run_waits_and_is_reported(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    write = {"id": "w1", "name": "workspace_write_file",
             "arguments": {"path": "report.txt", "content": "done"}}
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data", "--test-clock", str(ms(2026, 3, 10, 9, 0, 30))) as proc:
        await start(proc, chat.base_url)
        task = await proc.call("task:create", {
            "name": "Every minute", "schedule": {"kind": "cron", "expression": "* * * * *"},
            "prompt": "Write the report file.", "newSession": {"workspaceDir": str(workspace)},
        })
        await chat.script({"tool_calls": [write]}, {"text": "Written."})
        await move(proc, ms(2026, 3, 10, 9, 1))
        fired = await next_task_note(proc, "task_fired", task["id"])
        with anyio.fail_after(20):  # the reply waits for the approval of its write: the run is paused
            while (await runs(proc, task["id"]))[0]["status"] != "paused":
                await anyio.sleep(0.05)
        assert not (workspace / "report.txt").exists()
        # its next minutes come while it waits: skipped, never a second run at once
        await move(proc, ms(2026, 3, 10, 9, 2))
        await move(proc, ms(2026, 3, 10, 9, 3))
        listed = await runs(proc, task["id"])
        assert [(r["trigger"], r["status"]) for r in listed] == [
            ("schedule", "skipped"), ("schedule", "skipped"), ("schedule", "paused")]
        assert all("still going" in r["error"] for r in listed[:2])
        with pytest.raises(CallError) as err:
            await proc.call("task:run", {"id": task["id"]})
        assert err.value.code == -32002
        # the user approves: the same reply goes on and the run completes
        approved = await proc.call("chat:tool:approve", {"sessionId": fired["sessionId"], "toolCallId": "w1",
                                                         "decision": "approved"})
        assert approved["resumed"] is True
        finished = await next_task_note(proc, "task_finished", task["id"])
        while finished["id"] != fired["id"]:  # the skipped ones were announced first
            assert finished["status"] == "skipped"
            finished = await next_task_note(proc, "task_finished", task["id"])
        assert finished["status"] == "completed" and finished["messageId"] == fired["messageId"]
        assert (workspace / "report.txt").read_text() == "done"
        # free again: a manual run goes
        await chat.script({"text": "Manual."})
        manual = await proc.call("task:run", {"id": task["id"]})
        assert manual["trigger"] == "manual"
        done = await next_task_note(proc, "task_finished", task["id"])
        assert (done["id"], done["status"]) == (manual["id"], "completed")
        fired_ids = [n["id"] for n in proc.notifications("task_fired")]
        assert fired_ids == [fired["id"], manual["id"]]
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_bad_tasks_are_refused_naming_the_field(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data", "--test-clock", str(ms(2026, 3, 10, 9, 0))) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        cron = {"kind": "cron", "expression": "0 9 * * *"}
        cases: list[tuple[dict[str, Any], str]] = [
            ({"name": "x", "schedule": {"kind": "cron", "expression": "0 9 * *"}, "prompt": "p"}, "schedule.expression"),
            ({"name": "x", "schedule": {"kind": "cron", "expression": "0 0 9 * * *"}, "prompt": "p"},
             "schedule.expression"),
            ({"name": "x", "schedule": {"kind": "cron", "expression": "61 * * * *"}, "prompt": "p"},
             "schedule.expression"),
            ({"name": "x", "schedule": {"kind": "cron", "expression": "0 9 * * *", "timezone": "Mars/Olympus"},
              "prompt": "p"}, "schedule.timezone"),
            ({"name": "x", "schedule": {"kind": "once", "at": ms(2026, 3, 10, 8, 0)}, "prompt": "p"}, "schedule.at"),
            # past the lookahead, and past the calendar (a stored one broke every task:list)
            ({"name": "x", "schedule": {"kind": "once", "at": ms(2031, 6, 1, 0, 0)}, "prompt": "p"}, "schedule.at"),
            ({"name": "x", "schedule": {"kind": "once", "at": 2**63 - 1}, "prompt": "p"}, "schedule.at"),
            ({"name": "x", "schedule": cron}, "prompt"),
            ({"name": " ", "schedule": cron, "prompt": "p"}, "name"),
            ({"name": "x", "schedule": cron, "prompt": "p", "sessionId": "s", "newSession": {}}, "newSession"),
            ({"name": "x", "schedule": cron, "kind": "memory-consolidate", "prompt": "p"}, "prompt"),
            ({"name": "x", "schedule": cron, "prompt": "p", "scope": "global"}, "scope"),
            ({"name": "x", "schedule": cron, "prompt": "p", "bogus": 1}, "bogus"),
        ]
        for params, field in cases:
            with pytest.raises(CallError) as err:
                await proc.call("task:create", params)
            assert err.value.code == -32602 and field in err.value.message, (params, err.value.message)
        for params, code in (
            ({"name": "x", "schedule": cron, "prompt": "p", "sessionId": "nope"}, -32001),
            ({"name": "x", "schedule": cron, "prompt": "p", "assistantId": "nope"}, -32001),
            ({"name": "x", "schedule": cron, "prompt": "p", "deliver": {"channel": "nope", "chatId": "c"}}, -32001),
        ):
            with pytest.raises(CallError) as err:
                await proc.call("task:create", params)
            assert err.value.code == code, err.value.message
        with pytest.raises(CallError) as err:
            await proc.call("task:settings:update", {"timezone": "Nowhere/Else"})
        assert err.value.code == -32602 and "timezone" in err.value.message
        with pytest.raises(CallError) as err:
            await proc.call("sidecar:test:clock", {"now": ms(2026, 3, 10, 8, 0)})
        assert err.value.code == -32602 and "now" in err.value.message
        assert (await proc.call("task:list", {}))["total"] == 0
        await proc.call("task:settings:update", {"timezone": "Europe/Paris"})
        # a one-shot task runs once, then has no next time
        once = await proc.call("task:create", {"name": "once", "schedule": {"kind": "once", "at": ms(2026, 3, 10, 9, 30)},
                                               "prompt": "p", "enabled": False})
        assert once["nextRunAt"] is None and once["scheduleText"] == "Once at 2026-03-10T09:30+01:00"
        enabled = await proc.call("task:update", {"id": once["id"], "enabled": True})
        assert enabled["nextRunAt"] == ms(2026, 3, 10, 9, 30)
        await move(proc, ms(2026, 3, 10, 9, 30))
        ran = await next_task_note(proc, "task_finished", once["id"])
        assert ran["status"] == "error" and "provider" in ran["error"]  # none is configured here
        # it ran: no next time, and it can still be renamed or run by hand
        renamed = await proc.call("task:update", {"id": once["id"], "name": "once again"})
        assert (renamed["name"], renamed["nextRunAt"], renamed["lastRun"]["id"]) == ("once again", None, ran["id"])
        manual = await proc.call("task:run", {"id": once["id"]})
        assert (await next_task_note(proc, "task_finished", once["id"]))["id"] == manual["id"]
        with pytest.raises(CallError) as err:  # its moment is past: it cannot be scheduled again
            await proc.call("task:update", {"id": once["id"], "enabled": False})
            await proc.call("task:update", {"id": once["id"], "enabled": True})
        assert err.value.code == -32602 and "schedule.at" in err.value.message
        await proc.close()
    proc.assert_all_jsonrpc()
    assert [n["id"] for n in proc.notifications("task_fired")] == [ran["id"], manual["id"]]


async def test_a_reply_is_delivered_to_the_tasks_channel_chat_in_a_continued_session(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data", "--test-clock", str(ms(2026, 3, 10, 17, 59))) as proc:
        await start(proc, chat.base_url)
        await proc.call("channel:config:upsert", {"id": "im", "platform": "feishu", "botUserIds": ["ou_bot"]})
        session = await proc.call("chat:session:create", {"title": "standup"})
        task = await proc.call("task:create", {
            "name": "Evening summary", "schedule": {"kind": "cron", "expression": "0 18 * * MON-FRI"},
            "prompt": "Summarize the day.", "sessionId": session["id"],
            "deliver": {"channel": "im", "chatId": "oc_team", "threadId": "t1"},
        })
        await chat.script({"text": "A **good** day."})
        await move(proc, ms(2026, 3, 10, 18, 0))
        finished = await next_task_note(proc, "task_finished", task["id"])
        assert finished["status"] == "completed" and finished["sessionId"] == session["id"]
        assert finished["deliveryError"] is None
        reply = await proc.next_notification("channel:reply")
        assert (reply["channel"], reply["chatId"], reply["threadId"], reply["messageId"]) == (
            "im", "oc_team", "t1", finished["messageId"])
        assert "good" in json.dumps(reply["chunks"])
        await proc.call("channel:ack", {"deliveryId": reply["deliveryId"], "ok": True})
        # the session goes on: the next run continues it
        await chat.script({"text": "Another day."})
        await move(proc, ms(2026, 3, 11, 18, 0))
        assert (await next_task_note(proc, "task_finished", task["id"]))["status"] == "completed"
        texts = [m["textContent"] for m in await proc.call("chat:messages:get", {"sessionId": session["id"]})]
        assert texts == ["Summarize the day.", "A **good** day.", "Summarize the day.", "Another day."]
        # a deleted channel: the reply stays in its session, the run says why it was not delivered
        await proc.call("channel:config:delete", {"id": "im"})
        await chat.script({"text": "Third day."})
        await move(proc, ms(2026, 3, 12, 18, 0))
        third = await next_task_note(proc, "task_finished", task["id"])
        assert third["status"] == "completed" and "im" in third["deliveryError"]
        await proc.close()


async def test_at_most_n_runs_at_once_and_a_run_going_at_shutdown_is_settled_at_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as chat:
        async with spawn_sidecar(data, "--test-clock", str(ms(2026, 3, 10, 9, 59))) as proc:
            await start(proc, chat.base_url)
            assert (await proc.call("task:settings:update", {"maxConcurrentRuns": 1}))["maxConcurrentRuns"] == 1
            hourly = {"kind": "cron", "expression": "0 * * * *"}
            first = await proc.call("task:create", {"name": "one", "schedule": hourly, "prompt": "First."})
            second = await proc.call("task:create", {"name": "two", "schedule": hourly, "prompt": "Second."})
            await chat.script({"text": "slow " * 40, "delay_ms": 150})
            await move(proc, ms(2026, 3, 10, 10, 0))
            await next_task_note(proc, "task_fired", first["id"])
            # one slot: the second waits queued while the first streams
            assert [r["status"] for r in await runs(proc, second["id"])] == ["queued"]
            await proc.close()  # the first run is going: the sidecar still stops at once
        async with spawn_sidecar(data, "--test-clock", str(ms(2026, 3, 10, 10, 0, 20))) as proc:
            await proc.call("sidecar:initialize", {"protocolVersion": 1})
            one = await next_task_note(proc, "task_finished", first["id"])
            two = await next_task_note(proc, "task_finished", second["id"])
            # the reply aborted by the shutdown ends its run as aborted; the one that never started is interrupted
            assert (one["status"], two["status"]) == ("aborted", "interrupted")
            assert one["messageId"] and two["messageId"] is None
            await proc.close()


def test_a_stored_one_shot_time_outside_the_calendar_is_described_not_raised() -> None:
    """A task stored by a version that did not bound ``at`` still lists."""
    from protocol.tasks import OnceSchedule
    from sidecar.tasks.schedule import describe

    assert describe(OnceSchedule(at=2**63 - 1), "Europe/Paris") == "Once at 9223372036854775807 ms since 1970 (outside the calendar)"
    assert describe(OnceSchedule(at=ms(2026, 3, 10, 9, 30)), "UTC") == "Once at 2026-03-10T08:30+00:00"
