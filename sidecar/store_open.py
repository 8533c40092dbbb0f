"""Opening the store as the process does it: the one way, for both start-up paths.

``open_store(config, migrate=...)``: ``<data dir>/chat.db`` with the process's SecretBox
(the OS keychain unless ``--no-keychain``; the host's key from ``--secret-key-fd``, read
here, once), its schema migrated (or refused when not current, ``migrate=False``), and
what a dead process left running recovered (``sidecar.store.store.open_store``).
Blocking: the early answers call it before the event loop exists (sidecar/coldstart.py),
the App in a worker thread (sidecar/app.py). Light on imports: the store's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.config import Config
from sidecar.errors import SidecarError

if TYPE_CHECKING:
    from sidecar.store.store import Store


def open_store(config: Config, *, migrate: bool) -> Store:
    from sidecar.secrets.box import SecretBox
    from sidecar.store.store import open_store as open_database

    box = SecretBox(config.data_dir, host_key=_host_key_from_fd(config), use_keychain=config.keychain)
    return open_database(config.data_dir, secrets=box, migrate_schema=migrate)


def _host_key_from_fd(config: Config) -> bytes | None:
    if config.secret_key_fd is None:
        return None
    from sidecar.secrets.keys import read_key_fd

    try:
        return read_key_fd(config.secret_key_fd)
    except ValueError as exc:
        raise SidecarError(f"the secrets key on fd {config.secret_key_fd} is unusable: {exc}") from exc
