"""NDJSON framing: chunking never changes the lines, oversized lines are dropped as they stream."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.rpc import LineReader, LineWriter, OversizedLine, memory_pipe

pytestmark = pytest.mark.anyio


async def read_all(chunks: list[bytes], max_line_bytes: int = 1 << 20) -> list[bytes | OversizedLine]:
    receive, send = memory_pipe(max_buffer=len(chunks) + 1)
    for chunk in chunks:
        send.send_nowait(chunk)
    send.close()
    reader = LineReader(receive, max_line_bytes)
    lines: list[bytes | OversizedLine] = []
    with receive, anyio.fail_after(5):
        while True:
            try:
                lines.append(await reader.receive())
            except anyio.EndOfStream:
                return lines


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


MESSAGES = [
    b'{"jsonrpc":"2.0","id":1,"method":"a","params":{"text":"\xe4\xbd\xa0\xe5\xa5\xbd"}}',
    b"",
    b'{"jsonrpc":"2.0","method":"b"}',
    b"   ",
    b"[1,2,3]",
]
STREAM = b"\n".join(MESSAGES) + b"\n"


async def test_one_byte_at_a_time_equals_whole() -> None:
    whole = await read_all([STREAM])
    assert whole == MESSAGES
    assert await read_all([bytes([b]) for b in STREAM]) == whole


async def test_split_mid_line_equals_whole() -> None:
    # Cut inside a multi-byte UTF-8 character and inside a key.
    assert await read_all([STREAM[:45], STREAM[45:50], STREAM[50:]]) == MESSAGES


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
    trailing_newline=st.booleans(),
)
async def test_any_chunking_decodes_the_same(lines: list[bytes], cuts: list[int], trailing_newline: bool) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    expected = await read_all([data])
    assert await read_all(split_at(data, cuts)) == expected
    assert await read_all([bytes([b]) for b in data]) == expected
    # Without a final newline the last line still counts, unless it is empty.
    model = lines[:-1] if lines and not trailing_newline and not lines[-1] else lines
    assert expected == model


async def test_last_line_without_newline_is_delivered() -> None:
    assert await read_all([b'{"a":1}\n{"b":2}']) == [b'{"a":1}', b'{"b":2}']


async def test_oversized_line_is_reported_with_its_size_and_the_next_line_survives() -> None:
    big = b"x" * 5000
    chunks = [b'{"ok":1}\n', big[:1000], big[1000:], b'\n{"ok":2}\n']
    assert await read_all(chunks, max_line_bytes=1024) == [b'{"ok":1}', OversizedLine(5000), b'{"ok":2}']
    # One chunk holding the whole oversized line, one byte at a time, and at end of input.
    assert await read_all([big + b"\nz\n"], max_line_bytes=1024) == [OversizedLine(5000), b"z"]
    assert await read_all([bytes([b]) for b in big[:1500] + b"\n"], max_line_bytes=1024) == [OversizedLine(1500)]
    assert await read_all([big], max_line_bytes=1024) == [OversizedLine(5000)]


@pytest.mark.parametrize("chunk_size", [1, 700, 1 << 20])
async def test_oversized_line_keeps_its_first_bytes_however_it_is_chunked(chunk_size: int) -> None:
    line = bytes(b for b in range(256) if b != 10) * 20  # 5100 bytes, no newline
    data = line + b"\n" + line[:3000] + b"\nok\n"
    chunks = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)]
    lines = await read_all(chunks, max_line_bytes=2048)
    assert lines == [OversizedLine(5100), OversizedLine(3000), b"ok"]
    assert [x.head for x in lines[:2] if isinstance(x, OversizedLine)] == [line[:1024], line[:1024]]


async def test_line_exactly_at_the_limit_is_kept() -> None:
    line = b"y" * 1024
    assert await read_all([line[:10], line[10:] + b"\n"], max_line_bytes=1024) == [line]
    assert await read_all([line + b"y\n"], max_line_bytes=1024) == [OversizedLine(1025)]


async def test_oversized_line_is_never_buffered_whole() -> None:
    receive, send = memory_pipe(max_buffer=4)
    reader = LineReader(receive, max_line_bytes=4096)
    chunk = b"z" * 65536

    async def produce() -> None:
        for _ in range(256):  # 16 MiB in one line
            await send.send(chunk)
        await send.send(b"\nafter\n")
        await send.aclose()

    results: list[bytes | OversizedLine] = []
    with receive, anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            results.append(await reader.receive())
            results.append(await reader.receive())
            # The partial buffer never held more than one chunk past the limit.
            assert len(reader._partial) <= 4096 + len(chunk)
    assert results == [OversizedLine(256 * 65536), b"after"]


async def test_writer_batches_queued_lines_into_one_write_and_drains_on_close() -> None:
    receive, send = memory_pipe(max_buffer=100)
    writer = LineWriter(send, max_queue=100)
    for i in range(50):
        await writer.send(b'{"n":%d}\n' % i)
    writer.close()
    with anyio.fail_after(5):
        await writer.run()
    writes = []
    with receive:
        async for chunk in receive:
            writes.append(chunk)
    assert len(writes) == 1  # all fifty were queued before the writer ran: one write
    assert writes[0] == b"".join(b'{"n":%d}\n' % i for i in range(50))


async def test_writer_marks_itself_broken_when_the_stream_fails_and_drops_later_lines() -> None:
    receive, send = memory_pipe()
    receive.close()  # nobody reads our output any more
    broken: list[bool] = []
    writer = LineWriter(send, on_broken=lambda: broken.append(True))
    await writer.send(b"1\n")
    with anyio.fail_after(5):
        await writer.run()
    assert writer.broken and broken == [True]
    assert writer.send_nowait(b"2\n") is False


def test_an_oversized_line_is_its_size_and_never_shows_its_head() -> None:
    first, second = OversizedLine(5000, b'{"secret": "sk-123'), OversizedLine(5000, b"other")
    assert first == second and hash(first) == hash(second) and first != OversizedLine(5001)
    assert repr(first) == "OversizedLine(size=5000)"
