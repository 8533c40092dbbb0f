"""Recorded provider streams served through an httpx2 transport, for tests, the demo
and benchmarks (no network, no server).

Owns: ``ScriptedTransport`` (answers requests from a queue of ``Reply`` and keeps
every request for assertions), ``Reply`` (status, headers, body chunks and an
optional fault: ``disconnect`` raises httpx2.RemoteProtocolError, ``stall`` blocks
forever, both after ``fault_after`` chunks), and readers that split the recorded
files in ``fixtures/providers/`` into per-event chunks or fixed-size pieces.

Must stay true: a reply is consumed by exactly one request; running out of replies
is an error (a test that sends more requests than it scripted fails loudly).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import msgspec

from sidecar.providers.errors import ProviderCallError
from sidecar.providers.types import StreamPart

__all__ = [
    "FIXTURES",
    "Reply",
    "ScriptedTransport",
    "fixture_text",
    "event_chunks",
    "line_chunks",
    "pieces",
    "sse_reply",
    "ndjson_reply",
    "json_reply",
    "drain",
]

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "providers"

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}
NDJSON_HEADERS = {"content-type": "application/x-ndjson"}


def fixture_text(name: str) -> str:
    """A recorded stream, e.g. ``fixture_text("openai/text.sse")``."""
    return (FIXTURES / name).read_text(encoding="utf-8")


def event_chunks(text: str) -> list[bytes]:
    """One chunk per SSE event (as servers flush them), blank-line terminated."""
    events = [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]
    return [(e.strip("\n") + "\n\n").encode() for e in events]


def line_chunks(text: str) -> list[bytes]:
    return [(line + "\n").encode() for line in text.splitlines() if line]


def pieces(data: bytes | str, size: int) -> list[bytes]:
    """``data`` cut every ``size`` bytes, to exercise reassembly across reads."""
    raw = data.encode() if isinstance(data, str) else data
    return [raw[i : i + size] for i in range(0, len(raw), size)]


class Reply(msgspec.Struct, kw_only=True):
    status: int = 200
    headers: dict[str, str] = {}
    chunks: list[bytes] = []
    fault: Literal["disconnect", "stall"] | None = None
    fault_after: int = 0
    """Chunks sent before the fault."""
    pause: float = 0.0
    """Seconds to wait before each chunk after the first (a slow but live stream)."""


def sse_reply(name_or_text: str, **kw: Any) -> Reply:
    text = fixture_text(name_or_text) if name_or_text.endswith(".sse") else name_or_text
    return Reply(headers=SSE_HEADERS, chunks=event_chunks(text), **kw)


def ndjson_reply(name_or_text: str, **kw: Any) -> Reply:
    text = fixture_text(name_or_text) if name_or_text.endswith(".ndjson") else name_or_text
    return Reply(headers=NDJSON_HEADERS, chunks=line_chunks(text), **kw)


def json_reply(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return Reply(
        status=status,
        headers={"content-type": "application/json", **(headers or {})},
        chunks=[msgspec.json.encode(value)],
    )


async def drain(parts: AsyncGenerator[StreamPart, None]) -> tuple[list[StreamPart], ProviderCallError | None]:
    """Every part a stream yields, and the ProviderCallError that ended it (if one did)."""
    out: list[StreamPart] = []
    async with aclosing(parts) as stream:
        try:
            async for part in stream:
                out.append(part)
        except ProviderCallError as exc:
            return out, exc
    return out, None


class _Body(httpx2.AsyncByteStream):
    def __init__(self, reply: Reply, request: httpx2.Request) -> None:
        self._reply = reply
        self._request = request
        self.closed = anyio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reply = self._reply
        for sent, chunk in enumerate(reply.chunks):
            if reply.fault is not None and sent == reply.fault_after:
                await self._fault()
            if reply.pause and sent:
                await anyio.sleep(reply.pause)
            yield chunk
        if reply.fault is not None and reply.fault_after >= len(reply.chunks):
            await self._fault()

    async def _fault(self) -> None:
        if self._reply.fault == "disconnect":
            raise httpx2.RemoteProtocolError(
                "peer closed connection without sending complete message body (incomplete chunked read)",
                request=self._request,
            )
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        self.closed.set()


class ScriptedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, *replies: Reply) -> None:
        self.replies: deque[Reply] = deque(replies)
        self.requests: list[httpx2.Request] = []
        self.bodies: list[_Body] = []

    def add(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def json(self, index: int = -1) -> Any:
        """The JSON body of a request that was sent."""
        return msgspec.json.decode(self.requests[index].content)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await request.aread()
        self.requests.append(request)
        if not self.replies:
            raise AssertionError(f"no scripted reply left for request #{len(self.requests)}")
        reply = self.replies.popleft()
        body = _Body(reply, request)
        self.bodies.append(body)
        return httpx2.Response(reply.status, headers=reply.headers, stream=body)
