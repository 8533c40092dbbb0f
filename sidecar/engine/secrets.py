"""SecretsService: settling the key of secrets at rest (``sidecar.secrets.box.secrets_info``
says what ``sidecar:initialize`` reports of it).

The key is settled once the store is open: with the host's key when it comes (an
inherited fd at start, or ``sidecar:initialize {secretKey}``), else at the handshake with
the sidecar's own key (OS keychain or key file). Settling re-seals stored secrets
(sidecar/store/secrets.py) through the store gateway.
"""

from __future__ import annotations

import anyio

from protocol.lifecycle import SecretsInfo
from sidecar.secrets.box import secrets_info
from sidecar.store.async_store import AsyncStore


class SecretsService:
    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        self._lock = anyio.Lock()

    async def settle(self, host_key: bytes | None = None) -> SecretsInfo:
        async with self._lock:  # two handshakes must not re-seal at once
            status = await self._store.run(lambda s: s.secrets.settle(host_key))
        return secrets_info(status)
