"""Which OS keychain holds the secrets key, chosen by rule (never by discovering backends).

- ``PYTHON_KEYRING_BACKEND`` set (a dotted class name, as keyring reads it): that keyring
  backend, loaded by ``keyring.core.load_keyring``, on every platform (hosts and tests
  choose with it). On Linux keyring is not shipped: there the name
  ``keyring.backends.SecretService.Keyring`` means the client of ``secret_service`` (the
  same entries), and another name needs keyring installed (else: no keychain).
- else macOS: ``keyring.backends.macOS.Keyring``; Windows:
  ``keyring.backends.Windows.WinVaultKeyring`` (after keyring's own ``keyringrc.cfg``, which
  may name another backend); each loaded directly, without keyring's entry-point discovery
  (which imports every backend, and costs ~50 ms).
- else Linux: the Secret Service client of ``secret_service`` (what keyring chose there,
  its SecretService backend; without ``secretstorage`` and so without ``cryptography``).
- else (another OS): keyring's own choice, when keyring is installed.

``open_keychain()`` gives a ``Keychain`` (``get_password``, ``set_password``, ``close``) or
raises ``KeychainUnavailable``, and so do its methods: for any failure of the backend (no
session bus, no service, locked, a keyring error, keyring or jeepney not installed), so
the caller has one thing to catch. Its message names the failure, never a secret.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

SECRET_SERVICE_BACKEND = "keyring.backends.SecretService.Keyring"
PLATFORM_BACKENDS = {
    "darwin": "keyring.backends.macOS.Keyring",
    "win32": "keyring.backends.Windows.WinVaultKeyring",
}


class KeychainUnavailable(Exception):
    """No working keychain (the message is the failure's type or a fixed phrase)."""


class Keychain(Protocol):
    def get_password(self, service: str, username: str) -> str | None: ...

    def set_password(self, service: str, username: str, password: str) -> None: ...

    def close(self) -> None: ...


def open_keychain() -> Keychain:
    """The keychain the rule chooses (KeychainUnavailable when it cannot be had)."""
    linux = sys.platform.startswith("linux")
    chosen = os.environ.get("PYTHON_KEYRING_BACKEND", "").strip()
    if chosen:
        if chosen == SECRET_SERVICE_BACKEND and linux:
            return _SecretServiceKeychain()
        return _KeyringKeychain(lambda core: core.load_keyring(chosen))
    if linux:
        return _SecretServiceKeychain()
    default = PLATFORM_BACKENDS.get(sys.platform)
    if default is None:
        return _KeyringKeychain(lambda core: core.get_keyring())
    return _KeyringKeychain(lambda core: core.load_config() or core.load_keyring(default))


class _SecretServiceKeychain:
    """The Secret Service client, its errors as KeychainUnavailable (one connection)."""

    def __init__(self) -> None:
        from sidecar.secrets.secret_service import SecretService, SecretServiceError

        self._error = SecretServiceError
        try:
            self._service = SecretService.connect()
        except SecretServiceError as exc:
            raise KeychainUnavailable(f"{type(exc).__name__}: {exc}") from None

    def get_password(self, service: str, username: str) -> str | None:
        try:
            return self._service.get_password(service, username)
        except self._error as exc:
            raise KeychainUnavailable(f"{type(exc).__name__}: {exc}") from None

    def set_password(self, service: str, username: str, password: str) -> None:
        try:
            self._service.set_password(service, username, password)
        except self._error as exc:
            raise KeychainUnavailable(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._service.close()


class _KeyringKeychain:
    """A keyring backend (``load`` gets it from ``keyring.core``), its errors as
    KeychainUnavailable."""

    def __init__(self, load: Callable[[Any], Any]) -> None:
        try:
            import keyring.core
            from keyring.errors import KeyringError
        except ImportError:
            raise KeychainUnavailable("keyring is not installed") from None
        # what the backends raise: their KeyringError, OSError, RuntimeError (a backend that
        # is not viable here), ValueError; and loading a named one: ImportError, AttributeError
        self._errors: tuple[type[Exception], ...] = (KeyringError, OSError, RuntimeError, ValueError)
        try:
            self._backend = load(keyring.core)
        except (*self._errors, ImportError, AttributeError) as exc:
            raise KeychainUnavailable(type(exc).__name__) from None

    def get_password(self, service: str, username: str) -> str | None:
        try:
            stored = self._backend.get_password(service, username)
        except self._errors as exc:
            raise KeychainUnavailable(type(exc).__name__) from None
        return None if stored is None else str(stored)

    def set_password(self, service: str, username: str, password: str) -> None:
        try:
            self._backend.set_password(service, username, password)
        except self._errors as exc:
            raise KeychainUnavailable(type(exc).__name__) from None

    def close(self) -> None:
        return None
