"""The V1 endpoint under bad input and hostile clients: auth, limits, traversal, lifecycle.

Real HTTP on loopback against a sidecar subprocess; raw sockets where a well-behaved HTTP
client would not send what we test (a huge body, a client that never reads).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from compat_helpers import V1, body_of, raw_http, read_response, status_of, v1_sidecar
from sidecar_proc import CallError, spawn_sidecar

from fixtures.v1_client import ChatFailed, SandboxClient, Turn

pytestmark = pytest.mark.anyio

ROUTES = [
    ("POST", "/computer/chat"),
    ("GET", "/computer/progress/abc"),
    ("POST", "/computer/agent/session/cancel?user_id=5&project_id=p"),
    ("POST", "/computer/agent/status"),
    ("POST", "/computer/agent/stop"),
]


def envelope(response: httpx2.Response) -> dict[str, Any]:
    body = response.json()
    assert list(body) == ["code", "message", "data", "tid", "success"]
    return body


async def test_off_by_default_then_started_stopped_and_checked(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        assert await proc.call("compat:status", {}) == {
            "running": False, "url": None, "host": None, "port": None, "flavor": None, "startedAt": None,
            "projects": 0, "runningTurns": 0, "sseClients": 0, "connections": 0, "maxConnections": 0,
        }
        for params, field in (
            ({"host": "0.0.0.0", "port": 0}, "host"),
            ({"host": "0.0.0.0", "port": 0, "allowRemote": True}, "token"),
            ({"host": "example.com", "port": 0}, "host"),
            ({"port": 0, "token": "short"}, "token"),
            ({"port": 70000}, "port"),
            ({"port": 0, "maxSseClients": 0}, "maxSseClients"),
            ({"port": 0, "workspaceDir": "relative/dir"}, "workspaceDir"),
            ({"port": 0, "flavor": "tauri"}, "flavor"),
        ):
            with pytest.raises(CallError) as err:
                await proc.call("compat:start", params)
            assert err.value.code == -32602 and field in err.value.message, (params, err.value.message)
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            with pytest.raises(CallError) as err:
                await proc.call("compat:start", {"port": busy.getsockname()[1]})
            assert err.value.code == -32003 and "cannot listen" in err.value.message

        token = "T" * 24
        info = await proc.call("compat:start", {"port": 0, "token": token})
        assert info["token"] == token and info["running"] and info["url"] == f"http://127.0.0.1:{info['port']}"
        with pytest.raises(CallError) as err:
            await proc.call("compat:start", {"port": 0})
        assert err.value.code == -32003
        async with httpx2.AsyncClient() as client:
            assert (await client.get(f"{info['url']}/health")).status_code == 200
        stopped = await proc.call("compat:stop", {})
        assert stopped["running"] is False
        with pytest.raises(OSError):
            await anyio.connect_tcp("127.0.0.1", info["port"])
        again = await proc.call("compat:start", {"port": 0})
        assert again["token"] != token and len(again["token"]) >= 32
        # beyond loopback only with the flag and a token
        await proc.call("compat:stop", {})
        remote = await proc.call("compat:start", {"host": "0.0.0.0", "port": 0, "allowRemote": True, "token": token})
        assert remote["host"] == "0.0.0.0"
        await proc.close()


async def test_every_route_needs_the_key_and_nothing_sends_cors(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, provider=False) as v1, httpx2.AsyncClient() as client:
        for method, path in ROUTES:
            for headers in ({}, {"x-api-key": "wrong-key-wrong-key"}, {"Authorization": "Bearer nope-nope-nope-nope"}, {"x-api-key": ""}):
                response = await client.request(method, v1.url + path, headers=headers, content=b"{}")
                assert response.status_code == 401, (method, path, headers)
                body = envelope(response)
                assert body["code"] == "4010" and body["success"] is False and body["data"] is None
                assert not any(h.lower().startswith("access-control") for h in response.headers)
        ok = await client.post(
            v1.url + "/computer/agent/status", json={"user_id": "5", "project_id": "p"},
            headers={"Authorization": f"Bearer {v1.token}"},
        )
        assert envelope(ok)["data"]["is_alive"] is False
        health = await client.get(v1.url + "/health")
        assert health.json()["status"] == "healthy"
        preflight = await client.options(v1.url + "/computer/chat", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 204 and not any(h.lower().startswith("access-control") for h in preflight.headers)
        missing = await client.get(v1.url + "/computer/nope", headers={"x-api-key": v1.token})
        assert missing.status_code == 404 and envelope(missing)["message"] == "Path not found: /computer/nope"
        assert (await client.get(v1.url + "/computer/chat", headers={"x-api-key": v1.token})).status_code == 404
        # the server's own status probe sends no key: it learns nothing and proceeds as "unknown"
        assert await v1.client.alive("p", "5") is None
        await v1.proc.close()


async def test_validation_errors_are_in_the_envelope(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1, httpx2.AsyncClient() as client:
        headers = {"x-api-key": v1.token, "Content-Type": "application/json"}

        async def post(path: str, content: bytes) -> tuple[int, dict[str, Any]]:
            response = await client.post(v1.url + path, content=content, headers=headers)
            return response.status_code, envelope(response)

        status, body = await post("/computer/chat", json.dumps({"project_id": "p", "prompt": "hi"}).encode())
        assert (status, body["code"], body["message"]) == (400, "VALIDATION_ERROR", "user_id is required")
        with pytest.raises(ChatFailed) as err:  # what the server makes of it
            await v1.client.chat({"project_id": "p", "prompt": "hi"})
        assert str(err.value) == "Failed to connect to SSE stream. Unexpected status code: 400"
        for content, text in (
            (b"{not json", "not valid JSON"),
            (b"[1, 2]", "Expected `object`"),
            (b'{"user_id": "5", "prompt": 5}', "$.prompt"),
            (b'{"user_id": "5", "prompt": "   "}', "prompt is required"),
            (b'{"user_id": "5", "prompt": "x", "attachments": [{"type": "image"}]}', "attachments[0].content"),
            (b'{"user_id": "5", "prompt": "x", "data_source_attachments": ["{}"]}', "data_source_attachments"),
            (b'{"user_id": "5", "prompt": "x", "agent_config": {"agent_server": {"command": "c", "tool_approval_rules": [{"action": "burn", "patterns": []}]}}}', "action"),
            (b'{"user_id": "5", "prompt": "x", "model_provider": {"base_url": "file:///etc/passwd", "default_model": "m"}}', "base_url"),
            (b'{"user_id": "5", "prompt": "x", "agent_config": {"agent_server": {"command": "scripted-agent", "env": {"LD_PRELOAD": "/tmp/x.so"}}}}', "LD_PRELOAD"),
            (b"", "JSON request body is required"),
        ):
            status, body = await post("/computer/chat", content)
            assert status == 400 and body["code"] == "VALIDATION_ERROR" and text in body["message"], (content, body)
        status, body = await post("/computer/agent/status", b'{"user_id": "5"}')
        assert (status, body["message"]) == (400, "project_id is required")
        status, body = await post("/computer/agent/stop", b"{bad")
        assert status == 400
        # progress of a session this endpoint does not know, the renderer's own sessions
        # included: the idle end_turn (electron, as V1 Electron; rcoder's 404 is in
        # test_correctness_compat_e2e.py), which reveals nothing about the session
        own = await v1.proc.call("chat:session:create", {})
        for session_id in ("01a230f5-0000-7000-8000-000000000000", own["id"]):
            response = await client.get(f"{v1.url}/computer/progress/{session_id}", headers={"x-api-key": v1.token})
            assert response.status_code == 200 and "end_turn" in response.text and "Agent 当前无在执行任务" in response.text
        # a session id of another project (or the renderer's) is not a way into it
        turn = await v1.client.run_turn(v1.direct("mine", project_id="mine"))
        other = await v1.client.run_turn(v1.direct("theirs", project_id="theirs", session_id=turn.session_id))
        hijack = await v1.client.run_turn(v1.direct("renderer's", project_id="r", session_id=own["id"]))
        assert len({turn.session_id, other.session_id, hijack.session_id, own["id"]}) == 4
        assert (await v1.proc.call("chat:session:get", {"id": own["id"]}))["messageCount"] == 0
        await v1.proc.close()


async def test_ids_cannot_reach_outside_the_workspace(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, workDirRoots=[str(tmp_path)]) as v1, httpx2.AsyncClient() as client:
        headers = {"x-api-key": v1.token, "Content-Type": "application/json"}
        cases = [
            ({"user_id": "../../u"}, "VALIDATION_ERROR"),
            ({"project_id": "../../etc"}, "VALIDATION_ERROR"),
            ({"project_id": "a/b"}, "VALIDATION_ERROR"),
            ({"session_id": "../../x"}, "VALIDATION_ERROR"),
            ({"agent_work_dir": "../../outside"}, "AGENT_WORK_DIR_INVALID"),
            ({"agent_work_dir": "..\\..\\outside"}, "AGENT_WORK_DIR_INVALID"),
            ({"agent_work_dir": str(tmp_path / "missing")}, "AGENT_WORK_DIR_NOT_FOUND"),
        ]
        for extra, code in cases:
            body = {"user_id": "5", "project_id": "p", "prompt": "hi", **extra}
            response = await client.post(v1.url + "/computer/chat", json=body, headers=headers)
            assert response.status_code == 400 and envelope(response)["code"] == code, extra
        for path in ("/computer/progress/..%2F..%2Fetc%2Fpasswd", "/computer/progress/a/b", "/computer/progress/%00"):
            response = await raw_http(v1.port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{v1.port}\r\nx-api-key: {v1.token}\r\n\r\n".encode())
            assert status_of(response) == 400, (path, response[:200])
        cancel = await client.post(v1.url + "/computer/agent/session/cancel?user_id=5&project_id=..%2F..", headers=headers)
        assert cancel.status_code == 400
        assert not (tmp_path / "outside").exists() and not (tmp_path / "data" / "outside").exists()
        # an existing absolute directory is accepted and used as the working directory
        work = tmp_path / "chosen"
        work.mkdir()
        turn = await v1.client.run_turn(v1.direct("here", project_id="abs", agent_work_dir=str(work)))
        session = await v1.proc.call("chat:session:get", {"id": turn.session_id})
        assert session["workspaceDir"] == str(work.resolve())
        await v1.proc.close()


async def test_bodies_past_the_limit_are_refused_and_the_endpoint_keeps_serving(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        head = (
            f"POST /computer/chat HTTP/1.1\r\nHost: 127.0.0.1:{v1.port}\r\nContent-Type: application/json\r\n"
            f"x-api-key: {v1.token}\r\n"
        )
        # declared: refused before the body is read
        response = await raw_http(v1.port, (head + f"Content-Length: {20 * 1024 * 1024}\r\n\r\n").encode() + b"{" * 65536)
        assert status_of(response) == 413 and json.loads(body_of(response))["code"] == "PAYLOAD_TOO_LARGE"
        # chunked, no length: refused once 10 MiB arrived (we read while we send: the answer
        # comes before the body is over, and the connection closes after it)
        async with await anyio.connect_tcp("127.0.0.1", v1.port) as stream:
            await stream.send((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
            answer: list[bytes] = []

            async def send_body() -> None:
                chunk = b"x" * 65536
                try:
                    for _ in range(20 * 16):
                        if answer:
                            return
                        await stream.send(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                except (anyio.BrokenResourceError, ConnectionError):
                    pass  # closed by the server after its answer

            async def read() -> None:
                answer.append(await read_response(stream, timeout=30))

            async with anyio.create_task_group() as tg:
                tg.start_soon(send_body)
                tg.start_soon(read)
        assert status_of(answer[0]) == 413
        # 20 MB through a normal client too
        async with httpx2.AsyncClient() as client:
            try:
                r = await client.post(v1.url + "/computer/chat", content=b"x" * (20 * 1024 * 1024), headers={"x-api-key": v1.token})
                assert r.status_code == 413
            except httpx2.HTTPError:
                pass  # the connection closed before the client finished sending: also a refusal
        turn = await v1.client.run_turn(v1.direct("still here?"))
        assert turn.completed and turn.text
        await v1.proc.close()


async def test_two_hundred_progress_clients_at_once(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, provider=False) as v1:
        data = await v1.client.chat(v1.agent("wait"))
        session_id = data["session_id"]
        request = f"GET /computer/progress/{session_id} HTTP/1.1\r\nHost: 127.0.0.1:{v1.port}\r\nx-api-key: {v1.token}\r\nAccept: text/event-stream\r\n\r\n".encode()
        streams: list[Any] = []
        answers: list[bytes] = [b""] * 200

        async def connect(i: int) -> None:
            stream = await anyio.connect_tcp("127.0.0.1", v1.port)
            streams.append(stream)
            await stream.send(request)
            answers[i] = await stream.receive()

        try:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for i in range(200):
                        tg.start_soon(connect, i)
            codes = [status_of(a) for a in answers]
            assert codes.count(200) == 8 and codes.count(429) == 192, sorted(set(codes))
            assert (await v1.status())["sseClients"] == 8
            refused = await raw_http(v1.port, request)
            assert status_of(refused) == 429 and json.loads(body_of(refused))["code"] == "TOO_MANY_CONNECTIONS"
            # the turn is unharmed: cancel it and the eight get its end
            await v1.client.cancel("p1", session_id, "5")
            await v1.wait_idle()
            reply = await v1.proc.call("chat:messages:get", {"sessionId": session_id})
            assert reply[-1]["status"] == "aborted"
        finally:
            for stream in streams:
                await stream.aclose()
        await v1.wait_clients(0)
        await v1.proc.close()


async def test_a_client_that_never_reads_stalls_nothing(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        first = await v1.client.run_turn(v1.direct("warm up"))
        session_id = first.session_id
        await v1.wait_clients(0)  # the server's client hung up after end_turn
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", v1.port))
        slow.sendall(f"GET /computer/progress/{session_id} HTTP/1.1\r\nHost: 127.0.0.1:{v1.port}\r\nx-api-key: {v1.token}\r\n\r\n".encode())
        try:
            await v1.wait_clients(1)
            big = "0123456789abcdef" * 4096  # 64 KiB per delta
            # 20 MiB in all: well past what the slow client's queue (4 MiB) and the loopback
            # socket buffers (up to 4 MiB more) hold, so it is cut off well before the end
            await v1.server.script({"text": big, "repeat": 320, "delay_ms": 1})  # type: ignore[union-attr]
            data = await v1.client.chat(v1.direct("a long one", session_id=session_id))
            turn = Turn(session_id=session_id, chat=data)
            with anyio.fail_after(120):
                async with v1.client.progress(session_id) as (_, events):
                    await v1.client.follow(turn, events)
                    # the slow client was cut off; the rest carry on
                    await v1.wait_clients(1)
                    status = await v1.client.status("d1", "5", with_key=True)
                    assert status.json()["data"]["status"] == "Idle"
            assert turn.completed and len(turn.text) == len(big) * 320
            reply = await v1.proc.call("chat:messages:get", {"sessionId": session_id})
            assert reply[-1]["status"] == "completed" and len(reply[-1]["textContent"]) == len(big) * 320
            # what the slow client got ends before the end of the turn
            slow.setblocking(False)
            received = b""
            with anyio.fail_after(60):
                while True:
                    try:
                        chunk = slow.recv(1 << 20)
                    except BlockingIOError:
                        await anyio.sleep(0.01)
                        continue
                    if not chunk:
                        break
                    received += chunk
            assert b"event: agent_message_chunk" in received and b"event: end_turn" not in received
        finally:
            slow.close()
        with anyio.fail_after(15):
            await v1.proc.close()
