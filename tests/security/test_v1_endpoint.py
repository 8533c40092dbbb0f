"""The V1 ``/computer/chat`` endpoint as an attacker meets it, over the subprocess on loopback.

- A caller with the key may chat, never widen what runs without the user: its
  ``tool_approval_rules`` may only narrow (deny) unless the host opted in
  (``trustApprovalRules``), ``yolo`` needs ``trustAgentMode``, and the audit names the
  rule (actor ``compat``) or the user, whoever decided; ``agent_work_dir`` stays in the
  caller's workspace or a root the host allowed (``/`` is refused).
- Slowloris: connections that send half a request line and no key are capped and given a
  deadline for their head; the caller with the key is served all along, and under a
  256-descriptor limit the rest of the process (a ``chat:send`` to a provider) keeps its
  descriptors.
- DNS rebinding: a request must name this computer by a loopback ``Host``.
- Any body gets the envelope: one nested past what msgspec can recurse into (100,000
  levels, in ``attachments`` or in a field it skips) is a 400, never a 500 or a traceback;
  free-form fields are bounded to MAX_JSON_DEPTH levels as the stdio side's are. (Request
  heads: test_v1_heads.py.)
"""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from chat_helpers import configure_provider, wait_final
from acp_helpers import AGENT
from compat_helpers import V1, body_of, raw_http, status_of, v1_sidecar
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, sidecar_command, spawn_sidecar

pytestmark = pytest.mark.anyio

HALF_A_REQUEST_LINE = b"POST /computer/ch"


def run_command(call_id: str, command: str) -> dict[str, Any]:
    return {"id": call_id, "name": "workspace_run_command", "arguments": {"command": command}}


async def approval_required(proc: SidecarProcess, start: int) -> dict[str, Any]:
    _, message = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["type"] == "tool_approval_required", timeout=30, start=start,
    )
    return message["params"]


async def audit_of(proc: SidecarProcess, tool_call_id: str) -> list[tuple[str, str]]:
    rows = await proc.call("tool:audit:list", {"toolCallId": tool_call_id, "limit": 20})
    return [(row["decision"], row["actor"]) for row in reversed(rows)]


# ---- approvals and the working directory -------------------------------------------------


async def test_a_request_cannot_approve_its_own_tools(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        assert v1.server is not None
        allow_all = {"agent_server": {"agent_mode": "yolo", "tool_approval_rules": [{"action": "allow", "patterns": ["*"]}]}}
        await v1.server.script(
            {"text": "on it", "tool_calls": [run_command("c-allow", "echo ran > proof.txt")]}, {"text": "done"},
        )
        seen = len(v1.proc.messages)
        data = await v1.client.chat(v1.direct("run it", project_id="a1", agent_config=allow_all))
        pending = await approval_required(v1.proc, seen)
        assert pending["toolCall"]["id"] == "c-allow"
        session = await v1.proc.call("chat:session:get", {"id": data["session_id"]})
        work = Path(session["workspaceDir"])
        [listed] = await v1.proc.call("tool:pending:list", {"sessionId": data["session_id"]})
        assert listed["toolCallId"] == "c-allow"
        assert not (work / "proof.txt").exists()  # nothing ran: the user decides
        await v1.proc.call("chat:tool:approve", {"sessionId": data["session_id"], "toolCallId": "c-allow", "decision": "denied"})
        await wait_final(v1.proc, pending["messageId"], timeout=30)
        assert not (work / "proof.txt").exists()
        assert await audit_of(v1.proc, "c-allow") == [("requested", "system"), ("denied", "user")]

        # narrowing works without any trust: a deny rule decides, audited as the rule's
        deny = {"agent_server": {"tool_approval_rules": [{"action": "deny", "patterns": ["echo *"]}]}}
        await v1.server.script({"text": "again", "tool_calls": [run_command("c-deny", "echo ran > proof.txt")]}, {"text": "ok"})
        turn = await v1.client.run_turn(v1.direct("run it again", project_id="a2", agent_config=deny))
        assert turn.completed and turn.text == "againok"
        session = await v1.proc.call("chat:session:get", {"id": turn.session_id})
        assert not (Path(session["workspaceDir"]) / "proof.txt").exists()
        audit = await v1.proc.call("tool:audit:list", {"toolCallId": "c-deny", "limit": 5})
        assert [(a["decision"], a["actor"]) for a in reversed(audit)] == [("requested", "system"), ("rule:deny", "compat")]
        assert "tool_approval_rules" in audit[0]["note"]
        await v1.proc.close()


async def test_a_host_that_trusts_the_rules_sees_the_rule_as_the_decider(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, trustApprovalRules=True) as v1:
        assert v1.server is not None
        allow = {"agent_server": {"tool_approval_rules": [{"action": "allow", "patterns": ["echo *"]}]}}
        await v1.server.script({"text": "on it", "tool_calls": [run_command("c-ok", "echo ran > proof.txt")]}, {"text": "done"})
        turn = await v1.client.run_turn(v1.direct("run it", project_id="t1", agent_config=allow))
        assert turn.completed
        session = await v1.proc.call("chat:session:get", {"id": turn.session_id})
        assert (Path(session["workspaceDir"]) / "proof.txt").read_text().strip() == "ran"
        assert await audit_of(v1.proc, "c-ok") == [("requested", "system"), ("rule:allow", "compat")]
        await v1.proc.close()


async def test_agent_work_dir_stays_in_the_workspace_or_a_root_the_host_allowed(tmp_path: Path) -> None:
    allowed = tmp_path / "projects"
    (allowed / "mine").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    async with v1_sidecar(tmp_path) as v1, httpx2.AsyncClient() as client:
        workspace = tmp_path / "data" / "compat" / "computer-project-workspace"
        (workspace / "5").mkdir(parents=True)
        (workspace / "5" / "escape").symlink_to(outside)
        (workspace / "6" / "theirs").mkdir(parents=True)

        async def refused(v1: V1, work_dir: str) -> None:
            body = {"user_id": "5", "project_id": "w", "prompt": "hi", "agent_work_dir": work_dir}
            response = await client.post(v1.url + "/computer/chat", json=body, headers={"x-api-key": v1.token})
            assert response.status_code == 400, (work_dir, response.text)
            assert response.json()["code"] == "AGENT_WORK_DIR_INVALID", (work_dir, response.text)

        for work_dir in ("/", str(outside), str(tmp_path), str(workspace / "5" / "escape"), str(workspace / "6" / "theirs")):
            await refused(v1, work_dir)
        assert (await v1.proc.call("chat:session:list", {"channelId": "v1-computer"}))["total"] == 0
        # inside the caller's own directory: fine
        (workspace / "5" / "sub").mkdir()
        turn = await v1.client.run_turn(v1.direct("mine", project_id="w", agent_work_dir=str(workspace / "5" / "sub")))
        assert turn.completed

        # the host allows a root: a directory in it may be named, nothing beside it
        await v1.proc.call("compat:stop", {})
        info = await v1.proc.call("compat:start", {"port": 0, "workDirRoots": [str(allowed)]})
        again = V1(v1.proc, info, v1.server)
        try:
            for work_dir in ("/", str(allowed / ".." / "outside"), str(tmp_path)):
                await refused(again, work_dir)
            turn = await again.client.run_turn(again.direct("here", project_id="w2", agent_work_dir=str(allowed / "mine")))
            session = await again.proc.call("chat:session:get", {"id": turn.session_id})
            assert session["workspaceDir"] == str((allowed / "mine").resolve())
            await again.proc.call("compat:stop", {})
            with pytest.raises(CallError) as err:  # "/" as a root would allow everything
                await again.proc.call("compat:start", {"port": 0, "workDirRoots": ["/"]})
            assert err.value.code == -32602 and "workDirRoots" in err.value.message
        finally:
            await again.client.aclose()
        await v1.proc.close()


async def test_a_request_cannot_choose_the_arguments_or_environment_of_what_runs(tmp_path: Path) -> None:
    """An allowed command runs with the host's arguments: a request's ``args`` (``python
    -c ...`` would be a shell) and ``env`` are refused unless the host's ``agentCommands``
    entry lets them (``requestArgs``, ``requestEnv``); nothing is started for a refusal."""
    proof = tmp_path / "proof.txt"
    commands = {
        "python": {"command": sys.executable},
        "pinned": {"command": sys.executable, "args": [str(AGENT)]},
        "open": {"command": sys.executable, "requestArgs": True, "requestEnv": ["KEY_SEEN"]},
    }
    async with v1_sidecar(tmp_path, agentCommands=commands) as v1, httpx2.AsyncClient() as client:

        async def post(server: dict[str, Any], project_id: str) -> httpx2.Response:
            body = {"user_id": "5", "project_id": project_id, "prompt": "env KEY_SEEN",
                    "agent_config": {"agent_server": {"agent_id": "scripted", **server}}}
            return await client.post(v1.url + "/computer/chat", json=body, headers={"x-api-key": v1.token})

        shell = ["-c", f"open({str(proof)!r}, 'w').write('ran')"]
        for server, named in (
            ({"command": "python", "args": shell}, "agent_server.args"),
            ({"command": "python", "args": [str(AGENT)]}, "agent_server.args"),  # even the right one
            ({"command": "pinned", "env": {"KEY_SEEN": "x"}}, "KEY_SEEN"),
            ({"command": "open", "args": [str(AGENT)], "env": {"OTHER": "x"}}, "OTHER"),
            ({"command": "open", "args": [str(AGENT)], "env": {"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD"),
        ):
            response = await post(server, "refused")
            assert response.status_code == 400, (server, response.text)
            assert response.json()["code"] == "VALIDATION_ERROR" and named in response.json()["message"], response.text
        assert not proof.exists()
        providers = await v1.proc.call("provider:list", {})
        assert not [p for p in providers if p["id"].startswith("v1-acp-")]  # nothing was set up to run
        assert (await v1.proc.call("chat:session:list", {"channelId": "v1-computer"}))["total"] == 0

        # the host's own arguments run whatever the request sends; what it allows, runs
        pinned = await v1.client.run_turn(
            {**v1.agent("hi", project_id="pin"), "agent_config": {"agent_server": {"command": "pinned", "args": shell}}}
        )
        assert pinned.text.startswith("echo: hi") and not proof.exists()
        opened = await v1.client.run_turn(v1.agent("env KEY_SEEN", project_id="open", command="open", env={"KEY_SEEN": "seen-1"}))
        assert opened.text == "KEY_SEEN=seen-1"

        await v1.proc.call("compat:stop", {})
        for entry in ({"command": sys.executable, "requestEnv": ["LD_PRELOAD"]},
                      {"command": sys.executable, "requestEnv": ["PATH"]},
                      {"command": sys.executable, "requestEnv": ["A=B"]}):
            with pytest.raises(CallError) as err:  # a host cannot hand out a loader variable either
                await v1.proc.call("compat:start", {"port": 0, "agentCommands": {"x": entry}})
            assert err.value.code == -32602 and "requestEnv" in err.value.message
        await v1.proc.close()


# ---- bodies ------------------------------------------------------------------------------


def nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


async def test_a_body_nested_past_any_limit_is_a_400_not_a_500(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:

        async def post(path: str, body: bytes) -> tuple[int, dict[str, Any]]:
            response = await raw_http(v1.port, (
                f"POST {path} HTTP/1.1\r\nHost: localhost\r\nx-api-key: {v1.token}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode() + body, read_timeout=30)
            return status_of(response), json.loads(body_of(response))

        deep = nested(100_000)
        for path, body, named in (
            ("/computer/chat", b'{"user_id": "5", "prompt": "hi", "attachments": [' + deep + b"]}", "nested deeper than 64"),
            ("/computer/chat", b'{"user_id": "5", "prompt": "hi", "zzz": ' + deep + b"}", "nested deeper than 64"),
            ("/computer/chat", b'{"user_id": "5", "prompt": "hi", "data_source_attachments": ' + deep + b"}", "nested deeper"),
            ("/computer/chat", b'{"user_id": "5", "prompt": "hi", "attachments": [' + nested(100) + b"]}", "attachments is nested"),
            # 1 MiB and more: read in a worker thread, with the same answers
            ("/computer/chat", b'{"user_id": "5", "prompt": "hi", "attachments": [' + nested(600_000) + b"]}", "nested deeper than 64"),
            ("/computer/chat", b'{"user_id": "5", "prompt": "' + b"x" * (1 << 20) + b'", "attachments": [' + nested(100) + b"]}",
             "attachments is nested"),
            ("/computer/agent/status", b'{"user_id": "5", "project_id": "p", "zzz": ' + deep + b"}", "nested deeper than 64"),
            ("/computer/agent/stop", b'{"user_id": "5", "project_id": "p", "zzz": ' + deep + b"}", "nested deeper than 64"),
            ("/computer/agent/session/cancel", deep, "user_id"),  # an unreadable body is ignored there, as in V1
        ):
            status, envelope = await post(path, body)
            assert status == 400, (path, body[:60], status, envelope)
            assert envelope["code"] == "VALIDATION_ERROR" and named in envelope["message"], (path, body[:60], envelope)
        status, envelope = await post("/computer/agent/session/cancel?user_id=5&project_id=p", deep)
        assert status == 200 and envelope["data"]["success"] is True, envelope
        # within the limits a free-form field is read as before (and refused for its shape)
        status, envelope = await post("/computer/chat", b'{"user_id": "5", "prompt": "hi", "attachments": [' + nested(60) + b"]}")
        assert (status, envelope["message"]) == (400, "attachments[0] must be an object"), envelope
        turn = await v1.client.run_turn(v1.direct("still here?", project_id="deep"))
        assert turn.completed and turn.text
        assert (await v1.proc.call("chat:session:list", {"channelId": "v1-computer"}))["total"] == 1
        v1.proc.assert_no_traceback()
        assert not re.search(r"V1 \S+ \S+ failed", v1.proc.stderr_text())
        await v1.proc.close()


# ---- the Host header ---------------------------------------------------------------------


async def test_only_loopback_host_names_are_served(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1, httpx2.AsyncClient() as client:
        body = {"user_id": "5", "project_id": "h", "prompt": "hi"}
        for host in ("evil.example.com", f"evil.example.com:{v1.port}", f"127.0.0.1:{v1.port + 1}", "127.0.0.1.nip.io"):
            headers = {"x-api-key": v1.token, "Host": host}
            response = await client.post(v1.url + "/computer/chat", json=body, headers=headers)
            assert response.status_code == 403 and response.json()["code"] == "HOST_NOT_ALLOWED", (host, response.text)
            assert (await client.get(v1.url + "/health", headers={"Host": host})).status_code == 403
        assert (await v1.proc.call("chat:session:list", {"channelId": "v1-computer"}))["total"] == 0
        for host in (f"127.0.0.1:{v1.port}", f"localhost:{v1.port}", f"[::1]:{v1.port}", "localhost"):
            response = await client.post(
                v1.url + "/computer/agent/status", json={"user_id": "5", "project_id": "h"},
                headers={"x-api-key": v1.token, "Host": host},
            )
            assert response.status_code == 200, (host, response.text)
        await v1.proc.close()
    # beyond loopback (allowRemote and its explicit token) the Host is the caller's to choose
    token = "R" * 32
    async with v1_sidecar(tmp_path / "remote", host="0.0.0.0", allowRemote=True, token=token) as v1:
        async with httpx2.AsyncClient() as client:
            response = await client.post(
                f"http://127.0.0.1:{v1.port}/computer/agent/status", json={"user_id": "5", "project_id": "h"},
                headers={"x-api-key": token, "Host": "sidecar.lan"},
            )
            assert response.status_code == 200
        await v1.proc.close()


# ---- slowloris and descriptors -----------------------------------------------------------


async def half_open(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that send half a request line and then nothing."""
    out: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        out.append(sock)
    with anyio.fail_after(60):
        for sock in out:
            await anyio.wait_writable(sock)
            sock.send(HALF_A_REQUEST_LINE)
    return out


async def all_closed_by_the_server(socks: list[socket.socket], timeout: float) -> None:
    """Every socket reads EOF or a reset (the server closed it) within ``timeout``."""
    open_ones = list(socks)
    with anyio.fail_after(timeout):
        while open_ones:
            still: list[socket.socket] = []
            for sock in open_ones:
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    still.append(sock)
                    continue
                except OSError:
                    continue  # reset: closed
                if data and not data.startswith(b"HTTP/1.1 408"):
                    raise AssertionError(f"unexpected answer {data[:80]!r}")
                if data:
                    still.append(sock)  # the 408; its EOF follows
            open_ones = still
            if open_ones:
                await anyio.sleep(0.05)


async def test_slowloris_connections_never_keep_the_caller_with_the_key_out(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        socks = await half_open(v1.port, 1100)
        try:
            # the caller with the key: served at once, and again (no 503)
            with anyio.fail_after(60):
                for n in range(3):
                    turn = await v1.client.run_turn(v1.direct(f"still here {n}", project_id=f"s{n}"))
                    assert turn.completed and turn.text
            status = await v1.status()
            assert status["connections"] <= status["maxConnections"]
            # and no half-open connection outlives its head deadline (10 s by default)
            await all_closed_by_the_server(socks, timeout=60)
        finally:
            for sock in socks:
                sock.close()
        with anyio.fail_after(30):
            while (await v1.status())["connections"] > 1:
                await anyio.sleep(0.05)
        await v1.proc.close()


LIMITED = (
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256));"
    " os.execv(sys.executable, [sys.executable, '-m', 'sidecar', *sys.argv[1:]])"
)


async def test_under_a_256_descriptor_limit_half_open_connections_starve_nothing(tmp_path: Path) -> None:
    command = [sys.executable, "-c", LIMITED, *sidecar_command(tmp_path / "data")[3:]]
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data", command=command) as proc:
        await configure_provider(proc, server.base_url)
        info = await proc.call("compat:start", {"port": 0})
        socks = await half_open(info["port"], 300)
        try:
            session = await proc.call("chat:session:create", {})

            async def reply(text: str) -> None:  # an unrelated chat:send still reaches its provider
                await server.script({"text": text})
                sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hi"}})
                final = await wait_final(proc, sent["messageId"], timeout=30)
                assert final["type"] == "stream_end", final

            await reply("descriptors to spare")
            # the caller with the key (its connection comes after the 300 in the queue)
            v1 = V1(proc, info, server)
            try:
                with anyio.fail_after(60):
                    turn = await v1.client.run_turn(v1.direct("and V1", project_id="fd"))
                assert turn.completed and turn.text
            finally:
                await v1.client.aclose()
            await reply("still to spare")
            assert "Too many open files" not in proc.stderr_text()
            status = await proc.call("compat:status", {})
            assert status["maxConnections"] == 128  # 256 minus the 128 kept for the rest of the process
            assert status["connections"] <= 128
        finally:
            for sock in socks:
                sock.close()
        await proc.close()
