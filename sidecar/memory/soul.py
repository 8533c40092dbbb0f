"""SoulService: ``assistant:soul:get|set|history|revert``, and the Soul.md a request gets.

Soul.md (seed 004 section 4.1) is the assistant's self-description that evolves. Every
version is a row of ``soul_versions`` (SoulRepo), numbered per scope (an assistant id, or
``global`` for the Soul.md of every assistant without its own); a version is never
rewritten: ``set``, ``revert`` and an approved ``soul_update`` tool call each add one.
An empty version clears an assistant's own Soul.md (it then inherits the global one).

What a request gets (``effective``): the assistant's own current version if it is not
empty, else the global one; while a scope has no version in the database yet, a Soul.md
file of an older version is read instead (``<dataDir>/assistants/<id>/Soul.md``, then
``<dataDir>/Soul.md``; never written).

Size limit: MAX_SOUL_BYTES (16 KiB of UTF-8, about 4,000 tokens) per version; a longer
``set`` or tool edit is refused (INVALID_PARAMS / a tool error), a longer legacy file is
cut there. Its tokens are counted in the context budget: the request builder takes them
(with the basic memory text) off the history's share of the window.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import msgspec

from protocol.memory import (
    GLOBAL_SCOPE,
    MAX_SOUL_BYTES,
    AssistantSoul,
    SoulGetParams,
    SoulHistoryParams,
    SoulRevertParams,
    SoulSetParams,
    SoulSource,
    SoulVersion,
)
from sidecar.errors import InvalidParams, NotFound
from sidecar.memory.soul_files import SoulFiles
from sidecar.store.async_store import AsyncStore
from sidecar.store.store import Store

__all__ = ["SoulService", "SoulView", "effective_soul", "soul_diff", "check_soul"]


class SoulView(msgspec.Struct, kw_only=True):
    content: str
    version: int
    """The scope's own current version (0: none)."""
    inherited: bool
    source: SoulSource | None = None
    updated_at: int | None = None


def _cut(text: str) -> str:
    data = text.encode("utf-8")
    if len(data) <= MAX_SOUL_BYTES:
        return text
    return data[:MAX_SOUL_BYTES].decode("utf-8", errors="ignore")


def effective_soul(store: Store, files: SoulFiles, assistant_id: str) -> SoulView:
    """The Soul.md requests of ``assistant_id`` get (blocking: a store thread)."""
    own, shared = store.souls.effective(assistant_id, GLOBAL_SCOPE)
    if own is not None and own.content.strip():
        return SoulView(content=own.content, version=own.version, inherited=False, source=own.source,
                        updated_at=own.created_at)
    version = own.version if own is not None else 0
    if assistant_id != GLOBAL_SCOPE and shared is not None and shared.content.strip():
        return SoulView(content=shared.content, version=version, inherited=True, source=shared.source,
                        updated_at=shared.created_at)
    if shared is None:  # nothing in the database for either: a Soul.md file of an older version
        own_file = files.read_own(assistant_id) if own is None and assistant_id != GLOBAL_SCOPE else None
        legacy = own_file or files.read_global()
        if legacy:
            return SoulView(content=_cut(legacy), version=version, inherited=own_file is None and assistant_id != GLOBAL_SCOPE,
                            source="import")
    return SoulView(content="", version=version, inherited=False)


def check_soul(content: str, field: str = "content") -> str:
    if "\x00" in content:
        raise InvalidParams(f"invalid params: {field} must not contain NUL characters - at `$.{field}`")
    size = len(content.encode("utf-8", errors="surrogatepass"))
    if size > MAX_SOUL_BYTES:
        raise InvalidParams(
            f"invalid params: {field} is {size} bytes; a Soul.md is at most {MAX_SOUL_BYTES} bytes - at `$.{field}`"
        )
    return content


def soul_diff(old: str, new: str, scope: str) -> str:
    """A unified diff of two versions (what an approval shows)."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"Soul.md ({scope}, current)", tofile=f"Soul.md ({scope}, proposed)",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


class SoulService:
    def __init__(self, store: AsyncStore, data_dir: Path) -> None:
        self._store = store
        self.files = SoulFiles(data_dir)

    async def _scope(self, scope: str) -> str:
        if scope != GLOBAL_SCOPE and not await self._store.run(lambda s: s.assistants.exists(scope)):
            raise NotFound(f"assistant {scope!r} not found (use an assistant id or 'global') - at `$.id`",
                           data={"assistantId": scope})
        return scope

    async def effective(self, scope: str) -> SoulView:
        return await self._store.run(lambda s: effective_soul(s, self.files, scope))

    async def view(self, scope: str) -> AssistantSoul:
        from sidecar.tokens import count_text

        view = await self._store.run(lambda s: effective_soul(s, self.files, scope))
        return AssistantSoul(
            assistant_id=scope, content=view.content, version=view.version, inherited=view.inherited,
            source=view.source,
            updated_at=view.updated_at, bytes=len(view.content.encode("utf-8")),
            tokens=count_text(view.content), max_bytes=MAX_SOUL_BYTES,
        )

    async def get(self, params: SoulGetParams) -> AssistantSoul:
        return await self.view(await self._scope(params.id))

    async def set(self, params: SoulSetParams) -> AssistantSoul:
        scope = await self._scope(params.id)
        content = check_soul(params.content)
        reason = params.reason.strip() if params.reason and params.reason.strip() else None
        await self._store.run(lambda s: s.souls.add(scope, content, source="user", reason=reason))
        return await self.view(scope)

    async def add_from_tool(
        self, scope: str, content: str, *, base_version: int, reason: str | None, session_id: str, message_id: str
    ) -> AssistantSoul:
        content = check_soul(content)
        await self._store.run(lambda s: s.souls.add(
            scope, content, source="tool", reason=reason, session_id=session_id, message_id=message_id,
            base_version=base_version))
        return await self.view(scope)

    async def history(self, params: SoulHistoryParams) -> list[SoulVersion]:
        scope = await self._scope(params.id)
        rows = await self._store.run(lambda s: s.souls.history(scope, params.limit, params.offset))
        return [r.to_wire() for r in rows]

    async def revert(self, params: SoulRevertParams) -> AssistantSoul:
        scope = await self._scope(params.id)
        old = await self._store.run(lambda s: s.souls.version(scope, params.version))
        await self._store.run(lambda s: s.souls.add(
            scope, old.content, source="revert", reason=f"revert to version {old.version}", reverted_from=old.version))
        return await self.view(scope)
