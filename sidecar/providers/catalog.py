"""Model discovery: the models an endpoint offers, with what it says about each.

Owns the reading of the three model-list formats:
- OpenAI-compatible ``GET {base}/models``: ``data[].id``, ``owned_by``, ``created``, and the
  context size servers add under various names (``context_length``: OpenRouter, Together;
  ``context_window``: Groq; ``max_model_len``: vLLM);
- Anthropic ``GET {base}/v1/models``: paged (``has_more`` / ``last_id`` followed, at most
  MAX_PAGES pages), ``display_name``, ``created_at`` (RFC 3339), ``max_input_tokens``,
  ``max_tokens``;
- Ollama ``GET {base}/api/tags`` (``models[].name``), then ``POST /api/show`` per model
  (at most SHOW_AT_ONCE at a time, MAX_SHOWN models) for ``model_info["<arch>.context_length"]``;
  a model whose details do not come is listed without them and named in the notes.
A list that is not the format's JSON is ProviderCallError(malformed); every request goes
through the provider's own client (its headers, timeouts and retries).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import anyio
import msgspec

from protocol.providers import ListedModel
from sidecar.providers.base import HttpProvider
from sidecar.providers.errors import ProviderCallError

__all__ = ["list_catalog", "MAX_PAGES", "MAX_SHOWN", "SHOW_AT_ONCE"]

MAX_PAGES = 20
MAX_SHOWN = 200
SHOW_AT_ONCE = 4
_CONTEXT_KEYS = ("context_length", "context_window", "max_model_len", "max_context_length")


class _Page(msgspec.Struct):
    data: list[dict[str, Any]] | None = None
    models: list[dict[str, Any]] | None = None
    has_more: bool = False
    last_id: str | None = None


_page = msgspec.json.Decoder(_Page)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**62 else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _time_ms(value: Any) -> int | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 2**40:
        return int(value * 1000)  # OpenAI: seconds
    if isinstance(value, str):
        try:
            return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            return None
    return None


async def _read(provider: HttpProvider, url: Any, body: Any = None) -> _Page:
    raw = await provider.fetch(url, body=body)
    try:
        page = _page.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise provider.error(f"malformed model list ({exc})", kind="malformed") from exc
    return page


async def list_catalog(provider: HttpProvider) -> tuple[list[ListedModel], list[str]]:
    """(the endpoint's models, notes on what could not be read)."""
    if provider.kind == "anthropic":
        return await _anthropic(provider), []
    if provider.kind == "ollama":
        return await _ollama(provider)
    return await _openai(provider), []


async def _openai(provider: HttpProvider) -> list[ListedModel]:
    page = await _read(provider, provider.models_endpoint())
    if page.data is None:
        raise provider.error("malformed model list (no `data` array)", kind="malformed")
    out: list[ListedModel] = []
    for entry in page.data:
        model_id = _str(entry.get("id"))
        if model_id is None:
            continue
        context = next((v for k in _CONTEXT_KEYS if (v := _int(entry.get(k))) is not None), None)
        out.append(ListedModel(
            id=model_id, name=_str(entry.get("name")), context_window=context,
            max_output_tokens=_int(entry.get("max_completion_tokens") or entry.get("max_output_tokens")),
            owned_by=_str(entry.get("owned_by")), created_at=_time_ms(entry.get("created")),
        ))
    return out


async def _anthropic(provider: HttpProvider) -> list[ListedModel]:
    out: list[ListedModel] = []
    url = provider.models_endpoint()
    for _ in range(MAX_PAGES):
        page = await _read(provider, url)
        if page.data is None:
            raise provider.error("malformed model list (no `data` array)", kind="malformed")
        for entry in page.data:
            model_id = _str(entry.get("id"))
            if model_id is not None:
                out.append(ListedModel(
                    id=model_id, name=_str(entry.get("display_name")),
                    context_window=_int(entry.get("max_input_tokens")),
                    max_output_tokens=_int(entry.get("max_tokens")), created_at=_time_ms(entry.get("created_at")),
                ))
        if not page.has_more or not page.last_id:
            break
        url = provider.models_endpoint().copy_merge_params({"after_id": page.last_id})
    return out


async def _ollama(provider: HttpProvider) -> tuple[list[ListedModel], list[str]]:
    page = await _read(provider, provider.models_endpoint())
    if page.models is None:
        raise provider.error("malformed model list (no `models` array)", kind="malformed")
    names = [n for entry in page.models if (n := _str(entry.get("name")) or _str(entry.get("model")))]
    tags = provider.models_endpoint()
    show = tags.copy_with(path=tags.path.removesuffix("/tags") + "/show")
    contexts: dict[str, int | None] = {}
    notes: list[str] = []
    limiter = anyio.CapacityLimiter(SHOW_AT_ONCE)

    async def details(name: str) -> None:
        async with limiter:
            try:
                raw = await provider.fetch(show, body={"model": name})
                info = msgspec.json.decode(raw).get("model_info") or {}
            except (ProviderCallError, msgspec.DecodeError, AttributeError) as exc:
                notes.append(f"{name}: no details ({getattr(exc, 'message', exc)})")
                return
        arch = info.get("general.architecture") if isinstance(info, dict) else None
        contexts[name] = _int(info.get(f"{arch}.context_length")) if isinstance(arch, str) else None

    async with anyio.create_task_group() as tg:
        for name in names[:MAX_SHOWN]:
            tg.start_soon(details, name)
    if len(names) > MAX_SHOWN:
        notes.append(f"details of the first {MAX_SHOWN} models only")
    entries = {(_str(e.get("name")) or _str(e.get("model"))): e for e in page.models}
    return [
        ListedModel(id=name, context_window=contexts.get(name),
                    created_at=_time_ms((entries.get(name) or {}).get("modified_at")))
        for name in names
    ], sorted(notes)
