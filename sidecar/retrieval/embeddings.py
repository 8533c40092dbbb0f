"""Embedding models: texts in, L2-normalized float32 vectors out.

    Embedder.embed(texts) -> Embedded(vectors, usage)
        vectors: numpy array (len(texts), dims), float32, unit rows
        usage:   one Usage per HTTP request whose answer reported its tokens
        HttpEmbedder   OpenAI-compatible  POST {baseUrl}/embeddings   {"model", "input": [...]}
                       Ollama             POST {baseUrl}/api/embed    {"model", "input": [...]}
        LocalEmbedder  wordllama, in process (the optional extra ``local-embeddings``)

HTTP embedders use the provider's stored configuration (base URL, key, custom headers; not
its custom chat body) and the provider transport (``sidecar/providers/transport.py``): the
same client settings and the same retry rules as chat (connect errors, timeouts, 408,
429, 5xx, ``retry-after``), then a ProviderCallError. Texts go in batches of at most
``BATCH_TEXTS`` texts and ``BATCH_CHARS`` characters, one request at a time.

Usage: what a request's answer says it used, as ``Usage(input_tokens=n)``: OpenAI's
``usage.prompt_tokens`` (else ``usage.total_tokens``), Ollama's ``prompt_eval_count``. It is
untrusted and never fails the embedding: a count that is missing, not an integer, negative,
or larger than the request could hold (more tokens than its body has bytes, plus
``USAGE_SLACK_PER_TEXT`` special tokens a text) is dropped, that request reports none. The
local embedder reports none (no provider, no cost). Who pays is the caller's business:
query embeddings made for a session are charged to it (``retriever.charge_embedding``);
ingestion reports are not used.

Must stay true:
- an answer is checked before it is used: one finite vector per input, all of one
  dimension, in input order (OpenAI's ``index``); anything else is a ProviderCallError
  (``malformed``), never a silently wrong vector;
- the local embedder never touches the network: wordllama is loaded from the files its
  wheel ships (``cache_dir`` = the installed package, ``disable_download``), which also
  works around its loader looking for the tokenizer in ``tokenizer/`` while the wheel has
  ``tokenizers/``; it runs in a worker thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx2
import msgspec
import numpy as np

from protocol.kb import LOCAL_EMBEDDING_PROVIDER
from protocol.types import Usage
from sidecar.errors import SidecarError
from sidecar.providers.errors import ProviderCallError, error_detail
from sidecar.providers.redact import Redactor, safe_url
from sidecar.providers.transport import make_client, open_response
from sidecar.providers.types import ProviderSettings
from sidecar.usage_counts import count as reported_count

__all__ = [
    "Embedder",
    "Embedded",
    "HttpEmbedder",
    "LocalEmbedder",
    "LOCAL_MODELS",
    "BATCH_TEXTS",
    "BATCH_CHARS",
    "normalize_rows",
    "local_embeddings_available",
    "usage_of_answer",
]

log = logging.getLogger(__name__)

BATCH_TEXTS = 64
BATCH_CHARS = 120_000
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
LOCAL_MODELS = {"wordllama": 256}
"""Local model id -> its dimensions."""
USAGE_SLACK_PER_TEXT = 8
"""Special tokens a model may add to each text on top of one token per byte at most."""
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Embedded:
    """What one ``embed`` call gave."""

    vectors: np.ndarray
    """(len(texts), dims), float32, unit rows, in input order."""
    usage: tuple[Usage, ...] = ()
    """One entry per request whose answer reported a plausible token count (module
    docstring); a request that reported none has no entry. Empty for the local embedder."""


class Embedder(Protocol):
    key: str
    """``providerId/modelId``: the model's name in stored vectors."""
    input_limit: int | None
    """Input tokens the model takes (None: unknown)."""

    async def embed(self, texts: Sequence[str]) -> Embedded: ...

    async def aclose(self) -> None: ...


def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero), as contiguous float32. The norms
    are taken in float64: squares of float32 values near its largest would overflow it."""
    wide = np.asarray(matrix, dtype=np.float64)
    norms = np.linalg.norm(wide, axis=1, keepdims=True)
    out = np.zeros_like(wide)
    np.divide(wide, norms, out=out, where=norms > 0)
    return np.ascontiguousarray(out, dtype=np.float32)


class _OpenAIItem(msgspec.Struct):
    embedding: list[float]
    index: int | None = None


class _OpenAIAnswer(msgspec.Struct):
    data: list[_OpenAIItem]
    usage: msgspec.Raw = msgspec.Raw()
    """Raw (empty when absent): a malformed usage must not fail decoding the vectors."""


class _OllamaAnswer(msgspec.Struct):
    embeddings: list[list[float]]
    prompt_eval_count: msgspec.Raw = msgspec.Raw()


_openai = msgspec.json.Decoder(_OpenAIAnswer)
_ollama = msgspec.json.Decoder(_OllamaAnswer)


def _count(value: object, ceiling: int) -> int | None:
    """A reported count (sidecar/usage_counts.py) no larger than the request could hold."""
    tokens = reported_count(value)
    return tokens if tokens is not None and tokens <= ceiling else None


def usage_of_answer(kind: str, raw: msgspec.Raw, ceiling: int) -> Usage | None:
    """The usage an embeddings answer reported, or None when it is missing or implausible.

    ``kind``: ``openai`` (``raw`` is the answer's ``usage`` object: ``prompt_tokens``, else
    ``total_tokens``) or ``ollama`` (``raw`` is its ``prompt_eval_count``); ``ceiling``: the
    most tokens the request could hold. Never raises."""
    if not raw:
        return None
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:  # e.g. a number out of range
        return None
    if kind == "ollama":
        tokens = _count(value, ceiling)
    elif isinstance(value, dict):
        field = "prompt_tokens" if "prompt_tokens" in value else "total_tokens"
        tokens = _count(value.get(field), ceiling)
    else:
        tokens = None
    return Usage(input_tokens=tokens) if tokens is not None else None


class HttpEmbedder:
    """An embedding model on an OpenAI-compatible or Ollama provider."""

    def __init__(
        self,
        settings: ProviderSettings,
        model_id: str,
        *,
        key: str,
        input_limit: int | None = None,
        name: str = "",
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        if settings.type not in ("openai-compat", "ollama"):
            raise SidecarError(
                f"provider {name or settings.type!r} ({settings.type}) has no embeddings endpoint: use an "
                "OpenAI-compatible or Ollama provider, or the local embedder"
            )
        self.key = key
        self.input_limit = input_limit
        self.model_id = model_id
        self._settings = settings
        self._redactor = Redactor(settings.api_key, settings.headers, settings.base_url)
        self._label = f"{name or settings.type} ({safe_url(settings.base_url)})"
        try:
            base = httpx2.URL(settings.base_url)
        except httpx2.InvalidURL as exc:
            raise self._error(f"invalid base URL ({exc})", "bad_request") from exc
        if base.scheme not in ("http", "https"):
            raise self._error("the base URL must start with http:// or https://", "bad_request")
        path = base.path.rstrip("/")
        if settings.type == "ollama":
            path += "/embed" if path.endswith("/api") else "/api/embed"
        else:
            path += "/embeddings"
        self._url = base.copy_with(path=path)
        self._client = make_client(settings, transport)

    def _describe(self, detail: str) -> str:
        return self._redactor.redact(f"{self._label}: embeddings: {detail}")

    def _error(self, detail: str, kind: Any, *, retryable: bool = False) -> ProviderCallError:
        return ProviderCallError(self._describe(detail), kind=kind, retryable=retryable, provider=self._settings.type)

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if self._settings.api_key:
            headers["authorization"] = f"Bearer {self._settings.api_key}"
        headers.update(self._settings.headers)
        return headers

    async def embed(self, texts: Sequence[str]) -> Embedded:
        if not texts:
            return Embedded(vectors=np.zeros((0, 0), dtype=np.float32))
        parts: list[np.ndarray] = []
        usage: list[Usage] = []
        for batch in _batches(texts):
            vectors, used = await self._call(batch)
            parts.append(vectors)
            if used is not None:
                usage.append(used)
        dims = {p.shape[1] for p in parts}
        if len(dims) != 1:
            raise self._error(f"the model answered vectors of different sizes {sorted(dims)}", "malformed")
        return Embedded(vectors=parts[0] if len(parts) == 1 else np.vstack(parts), usage=tuple(usage))

    async def _call(self, batch: list[str]) -> tuple[np.ndarray, Usage | None]:
        # an empty input is refused by some servers; a space embeds as "nothing"
        inputs = [t if t.strip() else " " for t in batch]
        body = _encode({"model": self.model_id, "input": inputs})
        async with open_response(
            self._client, url=self._url, body=body, headers=self._headers(), settings=self._settings,
            describe=self._describe,
        ) as response:
            try:
                raw = bytearray()
                async for data in response.aiter_bytes():
                    raw += data
                    if len(raw) > MAX_RESPONSE_BYTES:
                        raise self._error("the answer is too large", "malformed")
            except httpx2.TimeoutException as exc:
                raise self._error("no complete answer in time", "timeout", retryable=True) from exc
            except httpx2.TransportError as exc:
                raise self._error(f"connection lost ({type(exc).__name__})", "disconnect", retryable=True) from exc
        return self._parse(bytes(raw), len(batch), len(body) + USAGE_SLACK_PER_TEXT * len(batch))

    def _parse(self, raw: bytes, count: int, ceiling: int) -> tuple[np.ndarray, Usage | None]:
        """The vectors (checked) and the usage of one answer; ``ceiling``: the most tokens
        the request could hold."""
        try:
            if self._settings.type == "ollama":
                ollama = _ollama.decode(raw)
                rows = ollama.embeddings
                usage = usage_of_answer("ollama", ollama.prompt_eval_count, ceiling)
            else:
                answer = _openai.decode(raw)
                usage = usage_of_answer("openai", answer.usage, ceiling)
                items = answer.data
                if all(item.index is not None for item in items):
                    items = sorted(items, key=lambda item: item.index or 0)
                    if [item.index for item in items] != list(range(len(items))):
                        raise self._error("the answer's indexes do not match the inputs", "malformed")
                rows = [item.embedding for item in items]
        except msgspec.DecodeError as exc:
            raise self._error(f"unexpected answer ({exc}): {error_detail(raw[:2000])}", "malformed") from exc
        if len(rows) != count:
            raise self._error(f"{len(rows)} vectors for {count} inputs", "malformed")
        dims = {len(r) for r in rows}
        if len(dims) != 1 or 0 in dims:
            raise self._error(f"vectors of sizes {sorted(dims)[:5]} in one answer", "malformed")
        matrix = np.asarray(rows, dtype=np.float64)
        if not np.isfinite(matrix).all() or (np.abs(matrix) > np.finfo(np.float32).max).any():
            raise self._error("the answer holds numbers that are not finite float32 values", "malformed")
        return normalize_rows(matrix), usage

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._client.aclose()


def _batches(texts: Sequence[str]) -> list[list[str]]:
    out: list[list[str]] = []
    current: list[str] = []
    chars = 0
    for text in texts:
        if current and (len(current) >= BATCH_TEXTS or chars + len(text) > BATCH_CHARS):
            out.append(current)
            current, chars = [], 0
        current.append(text)
        chars += len(text)
    if current:
        out.append(current)
    return out


def local_embeddings_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("wordllama") is not None


class LocalEmbedder:
    """wordllama (256 dimensions, English-centric) inside the process, loaded on first use."""

    input_limit: int | None = None
    """None: wordllama averages the vectors of every token of a text (its tokenizer does not
    truncate), so a base's chunks keep the base's size (a limit of 512 cut them to 412 tokens,
    and ranked them lower: tools/bench/bench_retrieval.py)."""

    def __init__(self, model_id: str = "wordllama") -> None:
        if model_id not in LOCAL_MODELS:
            raise SidecarError(f"unknown local embedding model {model_id!r}; known: {sorted(LOCAL_MODELS)}")
        if not local_embeddings_available():
            raise SidecarError(
                "the local embedder needs the optional extra: pip install 'chat-sidecar[local-embeddings]'"
            )
        self.key = f"{LOCAL_EMBEDDING_PROVIDER}/{model_id}"
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                import wordllama
                from wordllama import WordLlama

                package = Path(wordllama.__file__).resolve().parent
                self._model = WordLlama.load(cache_dir=package, disable_download=True)
            return self._model

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        model = self._load()
        if not texts:
            return np.zeros((0, LOCAL_MODELS["wordllama"]), dtype=np.float32)
        out = []
        for i in range(0, len(texts), 512):
            out.append(np.asarray(model.embed(list(texts[i : i + 512]), norm=True), dtype=np.float32))
        return normalize_rows(np.vstack(out))

    async def embed(self, texts: Sequence[str]) -> Embedded:
        try:
            vectors = await anyio.to_thread.run_sync(self.embed_blocking, list(texts))
        except (OSError, ValueError, RuntimeError) as exc:
            raise SidecarError(f"the local embedder failed: {type(exc).__name__}: {exc}") from exc
        return Embedded(vectors=vectors)  # in process: no usage, no cost

    async def aclose(self) -> None:
        return None
