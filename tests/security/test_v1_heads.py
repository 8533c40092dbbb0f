"""Request heads on the V1 endpoint as anyone who can connect sends them, over the subprocess
on loopback, with raw sockets (framing is the point).

- A head (request line, headers, blank line) past 16 KiB or 100 header lines is answered
  431 and its connection closes, before it is parsed: sent in one write (100 KiB of
  25,600 ``a:`` lines, which h11 parsed whole since its own limit applies only to an
  incomplete head) or cut in pieces; as the first request of a connection or the next
  one on a kept-alive connection, sent after the previous answer or pipelined behind a
  request with no body, a sized body, a chunked body or a body the endpoint did not read.
  The count restarts at each head: heads at the limits are served, one after another on
  one connection too.
- 200 connections that each send such a head cost the process next to no memory.
- Malformed requests (uvicorn answers 400) and refused heads are logged at the 1st and
  every 1,000th, not once each.
In every test the process keeps serving the caller with the key and the host's stdio,
and logs no traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest
from compat_helpers import V1, read_response, v1_sidecar

pytestmark = pytest.mark.anyio

HEALTH = b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
BIG_HEAD = HEALTH + b"a:\r\n" * 25600 + b"\r\n"
"""The reviewer's ~100 KiB head of tiny header lines."""
MALFORMED = b"\x00\r\n\r\n"


def health(extra_lines: int = 0, *, close: bool = False) -> bytes:
    """A GET /health head with ``extra_lines`` more header lines (Host is one already)."""
    return HEALTH + b"a:\r\n" * extra_lines + (b"Connection: close\r\n" if close else b"") + b"\r\n"


def statuses(data: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


async def read_until_closed(stream: anyio.abc.ByteStream, into: bytearray | None = None, timeout: float = 15) -> bytes:
    """What the server sends until it closes the connection (EOF or a reset)."""
    data = bytearray() if into is None else into
    with anyio.fail_after(timeout):
        while True:
            try:
                data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                return bytes(data)


async def exchange(port: int, *pieces: bytes, pause: float = 0.0) -> list[int]:
    """The statuses answered on one connection to ``pieces``."""
    return statuses(await answers(port, *pieces, pause=pause))


async def answers(port: int, *pieces: bytes, pause: float = 0.0) -> bytes:
    """What the server answers on one connection to ``pieces`` (sent in turn, ``pause`` s
    apart, while its answers are read: a client still sending to a closed connection would
    lose what it had not read yet), until the server closes it."""
    received = bytearray()
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_until_closed, stream, received)
            for piece in pieces:
                if b"HTTP/1.1 431 " in received:
                    break  # refused: what is left would only be reset
                try:
                    await stream.send(piece)
                except (anyio.BrokenResourceError, ConnectionError):
                    break  # closed by the server after its answer
                if pause:
                    await anyio.sleep(pause)
    return bytes(received)


def refused_body(data: bytes) -> dict[str, object]:
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), data[:200]
    assert b"connection: close" in head.lower()
    envelope: dict[str, object] = json.loads(body)
    return envelope


async def still_serving(v1: V1, project_id: str) -> None:
    """The caller with the key gets a whole turn and the host's stdio answers."""
    turn = await v1.client.run_turn(v1.direct("still here?", project_id=project_id))
    assert turn.completed and turn.text
    status = await v1.status()
    assert status["running"] and status["connections"] <= status["maxConnections"]
    v1.proc.assert_no_traceback()


async def test_a_head_past_its_limits_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        envelope = refused_body(await answers(v1.port, BIG_HEAD))  # in one write, as the reviewer sent it
        assert envelope["code"] == "HEADERS_TOO_LARGE" and envelope["success"] is False, envelope
        # the same head in 1 KiB pieces: counted across reads
        pieces = [BIG_HEAD[i:i + 1024] for i in range(0, 24 * 1024, 1024)]
        assert await exchange(v1.port, *pieces, pause=0.005) == [431]
        # past the lines alone (a 500-byte head), past the bytes alone (one long header)
        assert await exchange(v1.port, health(100)) == [431]
        pad = 16 * 1024 - len(health(close=True)) - len(b"x: \r\n")
        assert await exchange(v1.port, HEALTH + b"x: " + b"y" * (pad + 1) + b"\r\nConnection: close\r\n\r\n") == [431]
        # a head without its blank line that reaches the limit
        assert await exchange(v1.port, HEALTH + b"x: " + b"y" * 20000) == [431]
        # at the limits: served (100 header lines; exactly 16 KiB, cut at every 4 KiB)
        assert await exchange(v1.port, health(98, close=True)) == [200]
        exact = HEALTH + b"x: " + b"y" * pad + b"\r\nConnection: close\r\n\r\n"
        assert len(exact) == 16 * 1024
        assert await exchange(v1.port, *[exact[i:i + 4096] for i in range(0, len(exact), 4096)], pause=0.005) == [200]
        # bare LF line ends (h11 takes them) are counted the same way
        assert await exchange(v1.port, HEALTH.replace(b"\r\n", b"\n") + b"a:\n" * 100 + b"\n") == [431]
        assert await exchange(v1.port, HEALTH.replace(b"\r\n", b"\n") + b"Connection: close\n\n") == [200]
        assert v1.proc.stderr_text().count("request heads refused so far") == 1  # the 1st, not each
        await still_serving(v1, "heads")
        await v1.proc.close()


async def test_the_limits_hold_for_every_request_of_a_kept_alive_connection(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        key = v1.token.encode()
        body = b'{"user_id": "5", "project_id": "p"}'
        sized = (b"POST /computer/agent/status HTTP/1.1\r\nHost: localhost\r\nx-api-key: %s\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (key, len(body), body))
        chunked = (b"POST /computer/agent/status HTTP/1.1\r\nHost: localhost\r\nx-api-key: %s\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (key, len(body), body))
        unread = b"POST /computer/chat HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n"  # 401 before its body

        # sequential: the next head comes after the first answer
        async with await anyio.connect_tcp("127.0.0.1", v1.port) as stream:
            await stream.send(health())
            assert statuses(await read_response(stream)) == [200]
            await stream.send(health(101))
            refused_body(await read_until_closed(stream))
        # pipelined behind a request without a body, with a sized one, a chunked one, an unread one
        assert await exchange(v1.port, health() + BIG_HEAD) == [200, 431]
        assert await exchange(v1.port, sized + health(101)) == [200, 431]
        assert await exchange(v1.port, chunked + BIG_HEAD) == [200, 431]
        assert await exchange(v1.port, unread, b"x" * 5000 + health(101)) == [401, 431]
        # the second head alone is past the limit, whatever the first and its body left in the read
        assert await exchange(v1.port, health() + health(60) + health(101)) == [200, 200, 431]
        # the count restarts at each head: five heads of 60 lines (and of ~10 KiB) in one write
        assert await exchange(v1.port, health(60) * 4 + health(60, close=True)) == [200] * 5
        ten_kib = HEALTH + b"x: " + b"y" * 10000 + b"\r\n"
        assert await exchange(v1.port, (ten_kib + b"\r\n") * 2 + ten_kib + b"Connection: close\r\n\r\n") == [200] * 3
        assert await exchange(v1.port, sized + chunked + health(98, close=True)) == [200, 200, 200]  # 100 lines
        await still_serving(v1, "kept-alive")
        await v1.proc.close()


async def test_oversized_heads_cost_the_process_next_to_no_memory(tmp_path: Path) -> None:
    """Each of 200 connections sends a 100 KiB head and stays open; before the limit each
    such head was parsed and kept by its connection (~3 MiB each, 974 MiB for 300)."""
    async with v1_sidecar(tmp_path) as v1:
        await still_serving(v1, "before")
        before = v1.proc.vm_hwm_kib()
        assert before is not None
        streams: list[anyio.abc.SocketStream] = []
        answered: list[int] = []
        try:
            for _ in range(200):
                stream = await anyio.connect_tcp("127.0.0.1", v1.port)
                streams.append(stream)
                try:
                    await stream.send(BIG_HEAD)
                except (anyio.BrokenResourceError, ConnectionError):
                    pass  # refused and closed while we sent
            for stream in streams:  # each one answered 431 and closed (a reset may come first)
                answered += statuses(await read_until_closed(stream))
            after = v1.proc.vm_hwm_kib()
            assert after is not None
        finally:
            for stream in streams:
                await stream.aclose()
        assert answered and set(answered) == {431}, answered
        assert after - before < 64 * 1024, (before, after)  # KiB
        await still_serving(v1, "after")
        await v1.proc.close()


async def test_malformed_requests_and_refused_heads_are_logged_a_few_times(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:

        async def send_many(request: bytes, count: int, expected: int) -> None:
            async def one_by_one(n: int) -> None:
                for _ in range(n):
                    assert await exchange(v1.port, request) == [expected]

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(one_by_one, count // 4)

        await send_many(MALFORMED, 2000, 400)
        await send_many(health(101), 200, 431)
        await still_serving(v1, "logs")
        stderr = v1.proc.stderr_text()
        invalid = [line for line in stderr.splitlines() if "Invalid HTTP request received" in line]
        assert 1 <= len(invalid) <= 3, invalid[:5]  # the 1st, the 1,000th, the 2,000th
        assert "(400; 2000 so far" in invalid[-1], invalid
        refused = [line for line in stderr.splitlines() if "request heads refused so far" in line]
        assert len(refused) == 1, refused
        await v1.proc.close()
