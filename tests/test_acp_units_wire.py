"""ACP building blocks in-process, what comes off the agent's stdout: the JsonLines filter
stage of the line reader (junk, oversized and odd lines, the fast path of updates) and the
decoding of updates and of the agent's capabilities."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from sidecar.acp.types import AgentFeatures, UnknownUpdate, decode_update
from sidecar.children.lines import JsonLines
from sidecar.rpc.framing import LineReader

pytestmark = pytest.mark.anyio
enc = msgspec.json.encode


# ---- JsonLines: the filter stage of the one line reader --------------------------------


class _Chunks(anyio.abc.ByteReceiveStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._chunks:
            raise anyio.EndOfStream
        return self._chunks.pop(0)

    async def aclose(self) -> None:
        self._chunks = []


class _Filtered:
    """What the reader hands on through a JsonLines stage, joined back as NDJSON."""

    def __init__(self, chunks: list[bytes], *, max_line_bytes: int, fast: dict | None = None, stage: JsonLines | None = None) -> None:
        self.stage = stage or JsonLines(max_line_bytes=max_line_bytes)
        self.stage.fast.update(fast or {})
        self.reader = LineReader(_Chunks(chunks), max_line_bytes, line_filter=self.stage)

    @property
    def junk_lines(self) -> int:
        return self.stage.junk_lines


async def _drain(stream: _Filtered) -> bytes:
    out = b""
    async for line in stream.reader:
        assert isinstance(line, bytes)
        out += line + b"\n"
    return out


WIRE = (
    b"Welcome banner\n"
    b'{"jsonrpc":"2.0","id":0,"result":{}}\n'
    b"\n"
    b'{"truncated": [1, 2\n'
    b'[{"jsonrpc":"2.0","id":1,"result":null}]\n'
    b"42\n"
    b'  {"jsonrpc":"2.0","method":"x"}  \n'
    b'{"jsonrpc":"2.0","id":2,"result":"tail without newline"}'
)
EXPECTED = (
    b'{"jsonrpc":"2.0","id":0,"result":{}}\n'
    b'[{"jsonrpc":"2.0","id":1,"result":null}]\n'
    b'{"jsonrpc":"2.0","method":"x"}\n'
    b'{"jsonrpc":"2.0","id":2,"result":"tail without newline"}\n'
)


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(WIRE)])
async def test_filter_drops_junk_lines_whatever_the_chunking(size: int) -> None:
    chunks = [WIRE[i : i + size] for i in range(0, len(WIRE), size)]
    stream = _Filtered(chunks, max_line_bytes=1000)
    assert await _drain(stream) == EXPECTED
    assert stream.junk_lines == 3  # banner, truncated JSON, a bare number


async def test_filter_drops_oversized_lines_with_bounded_memory() -> None:
    big = b'{"x":"' + b"a" * 5000 + b'"}\n'
    ok = b'{"jsonrpc":"2.0","id":3,"result":1}\n'
    chunks = [big[i : i + 100] for i in range(0, len(big), 100)] + [ok]
    stream = _Filtered(chunks, max_line_bytes=1000)
    assert await _drain(stream) == ok
    assert stream.junk_lines == 1
    assert len(stream.reader._partial) == 0


async def test_filter_fast_path_hands_updates_over_in_order() -> None:
    seen: list[bytes] = []
    lines = [
        enc({"jsonrpc": "2.0", "method": "session/update", "params": {"n": i}}) + b"\n" for i in range(5)
    ] + [enc({"jsonrpc": "2.0", "id": 7, "method": "session/update", "params": {}}) + b"\n"]
    stream = _Filtered(
        [b"".join(lines)], max_line_bytes=1000, fast={"session/update": lambda p: seen.append(bytes(p))}
    )
    # a request with the same method name is not a notification: it goes to the peer
    assert await _drain(stream) == lines[-1]
    assert seen == [b'{"n":%d}' % i for i in range(5)]


async def test_filter_survives_methods_of_odd_types_and_failing_lines(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[bytes] = []
    odd = [b'{"method":[1]}\n', b'{"method":{"a":1}}\n', b'{"method":null,"params":1}\n']
    after = enc({"jsonrpc": "2.0", "method": "session/update", "params": {"n": 1}}) + b"\n"
    ok = b'{"jsonrpc":"2.0","id":4,"result":1}\n'
    stream = _Filtered(
        [b"".join(odd) + after + ok], max_line_bytes=1000,
        fast={"session/update": lambda p: seen.append(bytes(p))},
    )
    # an unhashable method is no fast-path notification: the peer gets it and answers it
    with anyio.fail_after(5):
        assert await _drain(stream) == b"".join(odd) + ok
    assert seen == [b'{"n":1}']

    # whatever else goes wrong with one line is logged and that line alone is skipped
    class Boom(JsonLines):
        def _check(self, line: bytes) -> bytes | None:
            if b"boom" in line:
                raise KeyError("boom")
            return super()._check(line)

    stream = _Filtered([b'{"boom":1}\n' + ok], max_line_bytes=1000, stage=Boom(max_line_bytes=1000))
    with anyio.fail_after(5):
        assert await _drain(stream) == ok
    assert stream.junk_lines == 1 and "could not be handled" in caplog.text


# ---- decoding -------------------------------------------------------------------------


def test_unknown_and_malformed_updates_decode_as_unknown() -> None:
    assert decode_update(b'{"sessionUpdate":"brand_new","x":1}') == UnknownUpdate("brand_new")
    assert decode_update(b'{"sessionUpdate":"tool_call"}') == UnknownUpdate("tool_call")  # no toolCallId
    assert decode_update(b'{"sessionUpdate":"plan","entries":"many"}') == UnknownUpdate("plan")
    assert decode_update(b"[1,2]") == UnknownUpdate("?")
    assert decode_update(b"not json") == UnknownUpdate("?")


def test_capabilities_absent_null_or_odd_are_false() -> None:
    for result in (None, {}, {"agentCapabilities": None}, {"agentCapabilities": {"loadSession": "yes"}},
                   {"agentCapabilities": {"sessionCapabilities": {"fork": None, "close": True}}}):
        features = AgentFeatures.from_result(result)
        assert not (features.load_session or features.fork_session or features.close_session or features.prompt_image)
    features = AgentFeatures.from_result({
        "agentCapabilities": {
            "loadSession": True,
            "promptCapabilities": {"image": True, "embeddedContext": True},
            "sessionCapabilities": {"fork": {}, "close": {"_meta": {}}},
            "mcpCapabilities": {"http": True},
        },
        "agentInfo": {"name": "a", "title": "Agent A", "version": "2"},
    })
    assert (features.load_session, features.fork_session, features.close_session) == (True, True, True)
    assert (features.prompt_image, features.prompt_embedded_context, features.mcp_http) == (True, True, True)
    assert features.agent_name == "Agent A"
