"""Token counting: the real vocabularies, offline, equal to tiktoken's own counts."""

from __future__ import annotations

import gzip
import hashlib
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.types import ImagePart, MessageV2, TextPart, ToolCall
from sidecar import tokens

KNOWN = [
    # (encoding, text, ids) - ids published in tiktoken's README / OpenAI cookbook
    ("cl100k_base", "hello world", [15339, 1917]),
    ("o200k_base", "hello world", [24912, 2375]),
]
SAMPLES = [
    "",
    "hello world",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "多语言文本：你好，世界！こんにちは世界",
    "def f(x):\n    return x ** 2  # comment\n\n\n",
    "<|endoftext|> is counted as ordinary text here",
    "emoji 😀🎉 and accents café naïve",
]

_URLS = {
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
}


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Any attempt to open a connection (a tiktoken download) fails the test loudly."""
    attempts: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: refuse(None, a))  # type: ignore[arg-type]
    return attempts


@pytest.mark.parametrize("name,text,ids", KNOWN)
def test_known_ids_offline(no_network: list[object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           name: str, text: str, ids: list[int]) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty: a tiktoken download would be needed
    enc = tokens.get_encoding(name)
    assert enc.encode_ordinary(text) == ids
    assert tokens.count_text(text, name) == len(ids)
    assert no_network == []
    assert list(tmp_path.iterdir()) == []  # nothing fetched into tiktoken's cache


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_counts_equal_tiktokens_own_constructor(no_network: list[object], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """tiktoken.get_encoding (its own pattern and hash check) on the same vocabulary, placed
    in its cache dir, counts exactly like ours; with the network refused, no download happens."""
    import tiktoken
    import tiktoken.registry

    raw = gzip.decompress(tokens.vocabulary_path(name).read_bytes())
    key = hashlib.sha1(_URLS[name].encode()).hexdigest()
    (tmp_path / key).write_bytes(raw)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    reference = tiktoken.get_encoding(name)
    ours = tokens.get_encoding(name)
    for text in SAMPLES:
        assert tokens.count_text(text, name) == len(reference.encode_ordinary(text)), text
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text)
    assert no_network == []


def test_model_families() -> None:
    for model in ("gpt-4o-mini", "openai/gpt-4.1", "gpt-5", "o3-mini", "o1", "GPT-4o"):
        choice = tokens.encoding_for_model(model)
        assert (choice.encoding, choice.exact) == ("o200k_base", True), model
    for model in ("gpt-4", "gpt-4-turbo", "gpt-3.5-turbo"):
        choice = tokens.encoding_for_model(model)
        assert (choice.encoding, choice.exact) == ("cl100k_base", True), model
    for model in ("claude-sonnet-4", "llama3.1:8b", "qwen2.5", "", None):
        choice = tokens.encoding_for_model(model)
        assert (choice.encoding, choice.exact) == ("cl100k_base", False), model


def test_message_estimate_adds_overhead_images_and_tool_calls() -> None:
    text = "The quick brown fox jumps over the lazy dog."
    plain = MessageV2(id="m", session_id="s", role="user", text_content=text, created_at=1, updated_at=1)
    n = tokens.count_text(text)
    assert tokens.message_tokens(plain) == n + tokens.MESSAGE_OVERHEAD
    with_image = MessageV2(
        id="m", session_id="s", role="user", content_type="multipart", text_content=text,
        parts=[TextPart(text=text), ImagePart(mime_type="image/png", url="file:///x.png")],
        created_at=1, updated_at=1,
    )
    assert tokens.message_tokens(with_image) == n + tokens.MESSAGE_OVERHEAD + tokens.IMAGE_TOKENS
    call = MessageV2(
        id="m", session_id="s", role="assistant", text_content="",
        tool_calls=[ToolCall(id="c", name="get_time", arguments='{"tz": "UTC"}')],
        created_at=1, updated_at=1,
    )
    assert tokens.message_tokens(call) > tokens.MESSAGE_OVERHEAD + 8
    assert tokens.content_hash(plain) != tokens.content_hash(with_image)


def test_nothing_loaded_at_import() -> None:
    """Importing the pipeline (as the sidecar does at start-up) loads no tiktoken."""
    code = (
        "import sys, sidecar.tokens, sidecar.pipeline.builder;"
        "print('tiktoken' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
