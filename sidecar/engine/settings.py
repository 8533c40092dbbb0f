"""SettingsService: settings:get / settings:update, kept in the store's settings table.

``current()`` is a cheap synchronous read of the cached ChatSettings for the hot path
(every generation reads its coalescing and persistence intervals from it). Updates are
serialised: each one applies its changes to the result of the one before (none is lost).
In an update a field left out keeps its value and ``null`` resets it to the default of
ChatSettings.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import msgspec

from protocol.common import EmptyParams
from protocol.settings import ChatSettings, ChatSettingsUpdate
from sidecar.errors import InvalidParams

SETTINGS_KEY = "chat_settings"

_RANGES: dict[str, tuple[float, float]] = {
    "delta_coalesce_ms": (0, 1000),
    "persist_interval_ms": (20, 5000),
    "max_tokens": (1, 10_000_000),
    "temperature": (0, 2),
    "top_p": (0, 1),
    "summary_every": (0, 10_000),
}


class SettingsService:
    def __init__(
        self,
        *,
        get_setting: Callable[[str], Awaitable[str | None]],
        set_setting: Callable[[str, str | None], Awaitable[None]],
    ) -> None:
        self._get_setting = get_setting
        self._set_setting = set_setting
        self._current = ChatSettings()
        self._update_lock = anyio.Lock()

    async def load(self) -> None:
        raw = await self._get_setting(SETTINGS_KEY)
        if raw:
            try:
                self._current = msgspec.json.decode(raw, type=ChatSettings)
            except msgspec.ValidationError:
                self._current = ChatSettings()  # written by a newer/older build: start clean

    def current(self) -> ChatSettings:
        return self._current

    async def get_settings(self, params: EmptyParams | None = None) -> ChatSettings:
        return self._current

    async def update_settings(self, params: ChatSettingsUpdate) -> ChatSettings:
        defaults = ChatSettings()
        changes = {
            f: getattr(defaults, f) if getattr(params, f) is None else getattr(params, f)
            for f in params.__struct_fields__
            if getattr(params, f) is not msgspec.UNSET
        }
        for field, value in changes.items():
            bounds = _RANGES.get(field)
            if bounds and value is not None and not bounds[0] <= value <= bounds[1]:
                camel = params.__struct_encode_fields__[params.__struct_fields__.index(field)]
                raise InvalidParams(
                    f"invalid params: {camel} must be between {bounds[0]:g} and {bounds[1]:g} - at `$.{camel}`"
                )
        async with self._update_lock:
            updated = msgspec.structs.replace(self._current, **changes)
            await self._set_setting(SETTINGS_KEY, msgspec.json.encode(updated).decode())
            self._current = updated
        return updated
