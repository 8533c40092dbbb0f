"""Read pacing of the providers' connections (sidecar/providers/pacing.py): which reads wait
and for how long (a fake clock and sleep record it), that bytes and errors pass through as
the inner stream gives them, and that a provider's own client is paced."""

from __future__ import annotations

from typing import Any

import anyio
import httpcore2
import httpx2
import pytest

from sidecar.providers import pacing
from sidecar.providers.pacing import MAX_PACE_S, UNPACED_READS, PacedBackend, pace_client, pace_for
from sidecar.providers.transport import make_client
from sidecar.providers.types import ProviderSettings

pytestmark = pytest.mark.anyio


class _Script(httpcore2.AsyncNetworkStream):
    """Returns its chunks in order (an exception is raised in its turn), then b""."""

    def __init__(self, *chunks: bytes | Exception) -> None:
        self.chunks = list(chunks)
        self.written: list[bytes] = []

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if isinstance(chunk, Exception):
            raise chunk
        return chunk

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.written.append(buffer)

    async def aclose(self) -> None:
        pass

    def get_extra_info(self, info: str) -> Any:
        return f"info:{info}"


class _Backend(httpcore2.AsyncNetworkBackend):
    def __init__(self, *streams: _Script) -> None:
        self.streams = list(streams)

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore2.AsyncNetworkStream:
        return self.streams.pop(0)


class _Time:
    """A clock that only moves when told to (or when the paced stream sleeps)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> _Time:
    t = _Time()
    monkeypatch.setattr(pacing, "_clock", t.clock)
    monkeypatch.setattr(pacing, "_sleep", t.sleep)
    return t


def test_the_pace_grows_with_the_readers_up_to_the_cap() -> None:
    assert pace_for(0) == 0.0 and pace_for(1) == 0.0
    assert 0 < pace_for(2) < pace_for(10) < MAX_PACE_S
    assert pace_for(50) == pace_for(500) == MAX_PACE_S


async def _connect(backend: PacedBackend) -> httpcore2.AsyncNetworkStream:
    return await backend.connect_tcp("example.test", 443)


async def test_a_lone_connection_is_never_delayed(fake_time: _Time) -> None:
    backend = PacedBackend(_Backend(_Script(*[b"x"] * 6)))
    stream = await _connect(backend)
    await stream.write(b"request")
    assert [await stream.read(100) for _ in range(6)] == [b"x"] * 6
    assert fake_time.sleeps == []


async def test_with_many_readers_a_read_waits_until_the_previous_one_is_a_pace_old(fake_time: _Time) -> None:
    readers = pacing._Readers()
    readers.count = 49  # forty-nine other connections are reading: with this one, fifty
    backend = PacedBackend(_Backend(_Script(*[b"chunk"] * 6)), readers)
    stream = await _connect(backend)
    await stream.write(b"request")
    for _ in range(UNPACED_READS):  # the answer's head and first bytes go at once
        assert await stream.read(100) == b"chunk"
    assert fake_time.sleeps == []
    fake_time.now += 0.010  # the consumer worked 10 ms before asking again
    assert await stream.read(100) == b"chunk"
    assert fake_time.sleeps == [round(MAX_PACE_S - 0.010, 6)]
    fake_time.now += MAX_PACE_S + 0.001  # asked again after more than a pace: no wait
    assert await stream.read(100) == b"chunk"
    assert len(fake_time.sleeps) == 1
    assert readers.count == 49  # every read left the count as it found it


async def test_a_new_request_and_a_full_buffer_are_not_delayed(fake_time: _Time) -> None:
    readers = pacing._Readers()
    readers.count = 49
    backend = PacedBackend(_Backend(_Script(b"a", b"b", b"c" * 100, b"d", b"e", b"f", b"g")), readers)
    stream = await _connect(backend)
    await stream.write(b"first request")
    assert await stream.read(100) == b"a"
    assert await stream.read(100) == b"b"
    assert await stream.read(100) == b"c" * 100  # paced, and it filled the buffer
    assert len(fake_time.sleeps) == 1
    assert await stream.read(100) == b"d"  # so the next read goes at once
    assert len(fake_time.sleeps) == 1
    await stream.write(b"second request")  # a keep-alive connection asked again
    assert await stream.read(100) == b"e"
    assert await stream.read(100) == b"f"
    assert len(fake_time.sleeps) == 1
    assert await stream.read(100) == b"g"
    assert len(fake_time.sleeps) == 2


async def test_bytes_errors_and_extra_info_pass_through(fake_time: _Time) -> None:
    readers = pacing._Readers()
    readers.count = 10
    inner = _Script(b"one", b"two", httpcore2.ReadTimeout("no data"), b"three")
    backend = PacedBackend(_Backend(inner), readers)
    stream = await _connect(backend)
    await stream.write(b"request")
    assert inner.written == [b"request"]
    assert await stream.read(100) == b"one"
    assert await stream.read(100) == b"two"
    with pytest.raises(httpcore2.ReadTimeout):
        await stream.read(100)
    assert await stream.read(100) == b"three"
    assert await stream.read(100) == b""
    assert stream.get_extra_info("is_readable") == "info:is_readable"
    assert readers.count == 10


async def test_a_read_cancelled_in_its_pause_leaves_the_count_right() -> None:
    readers = pacing._Readers()
    readers.count = 49
    backend = PacedBackend(_Backend(_Script(*[b"x"] * 4)), readers)
    stream = await _connect(backend)
    await stream.write(b"request")
    for _ in range(UNPACED_READS):
        await stream.read(100)
    with anyio.move_on_after(0) as scope:
        await stream.read(100)  # paced (the previous read just returned): cancelled in its pause
    assert scope.cancelled_caught
    assert readers.count == 49
    assert await stream.read(100) == b"x"  # nothing was consumed by the cancelled read


def test_a_providers_own_client_is_paced_and_a_given_transport_is_not() -> None:
    settings = ProviderSettings(type="openai-compat", base_url="https://api.example.test/v1")
    client = make_client(settings, None)
    assert isinstance(client._transport._pool._network_backend, PacedBackend)  # type: ignore[attr-defined]
    assert pace_client(client)  # twice: still one wrapper
    assert not isinstance(client._transport._pool._network_backend._inner, PacedBackend)  # type: ignore[attr-defined]
    mocked = make_client(settings, httpx2.MockTransport(lambda request: httpx2.Response(200)))
    assert not pace_client(mocked)
