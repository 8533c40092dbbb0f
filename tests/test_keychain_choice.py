"""Which keychain holds the secrets key (sidecar/secrets/keychain.py): a rule, never keyring's
discovery of backends. PYTHON_KEYRING_BACKEND first, then macOS's and Windows' own backend
loaded by name (after keyring's config file), Linux's Secret Service client, keyring's own
choice elsewhere; a backend's failure is KeychainUnavailable."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from sidecar.secrets.keychain import KeychainUnavailable, open_keychain

keyring_core = pytest.importorskip("keyring.core", reason="keyring chooses the backend on macOS and Windows")


class Recorded:
    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.entries.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.entries[(service, username)] = password


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The backends loaded by name; discovery and the config file fail the test if used."""
    names: list[str] = []

    def load_keyring(name: str) -> Recorded:
        names.append(name)
        return Recorded(name)

    def discovery(*_args: Any) -> Any:
        raise AssertionError("keyring's discovery of backends was used")

    monkeypatch.setattr(keyring_core, "load_keyring", load_keyring)
    monkeypatch.setattr(keyring_core, "load_config", lambda: None)
    monkeypatch.setattr(keyring_core, "get_keyring", discovery)
    monkeypatch.setattr(keyring_core.backend, "get_all_keyring", discovery)
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND", raising=False)
    return names


@pytest.mark.parametrize(("platform", "name"), [
    ("darwin", "keyring.backends.macOS.Keyring"),
    ("win32", "keyring.backends.Windows.WinVaultKeyring"),
])
def test_macos_and_windows_load_their_own_backend_directly(monkeypatch: pytest.MonkeyPatch, loaded: list[str],
                                                           platform: str, name: str) -> None:
    monkeypatch.setattr(sys, "platform", platform)
    chain = open_keychain()
    chain.set_password("chat-sidecar", "u", "k")
    assert chain.get_password("chat-sidecar", "u") == "k"
    assert loaded == [name]


def test_keyrings_config_file_is_read_first_on_macos(monkeypatch: pytest.MonkeyPatch, loaded: list[str]) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    configured = Recorded("from keyringrc.cfg")
    configured.entries[("s", "u")] = "configured"
    monkeypatch.setattr(keyring_core, "load_config", lambda: configured)
    assert open_keychain().get_password("s", "u") == "configured"
    assert loaded == []


@pytest.mark.parametrize("platform", ["darwin", "win32", "linux"])
def test_python_keyring_backend_is_honoured_everywhere(monkeypatch: pytest.MonkeyPatch, loaded: list[str],
                                                       platform: str) -> None:
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "toy_keyring.FileKeyring")
    open_keychain()
    assert loaded == ["toy_keyring.FileKeyring"]


def test_on_linux_the_secret_service_names_our_client(monkeypatch: pytest.MonkeyPatch, loaded: list[str]) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    for chosen in (None, "keyring.backends.SecretService.Keyring"):
        if chosen is not None:
            monkeypatch.setenv("PYTHON_KEYRING_BACKEND", chosen)
        with pytest.raises(KeychainUnavailable, match="SecretServiceError: no session bus"):
            open_keychain()  # our client (keyring's would say otherwise), which finds no bus here
    assert loaded == []


def test_another_os_gets_keyrings_own_choice(monkeypatch: pytest.MonkeyPatch, loaded: list[str]) -> None:
    monkeypatch.setattr(sys, "platform", "freebsd14")
    chosen = Recorded("keyring's choice")
    monkeypatch.setattr(keyring_core, "get_keyring", lambda: chosen)
    chain = open_keychain()
    chain.set_password("s", "u", "p")
    assert chosen.entries == {("s", "u"): "p"}


def test_a_failing_backend_is_keychain_unavailable(monkeypatch: pytest.MonkeyPatch, loaded: list[str]) -> None:
    from keyring.errors import KeyringLocked

    class Locked(Recorded):
        def get_password(self, service: str, username: str) -> str | None:
            raise KeyringLocked("secret-looking text that must not be repeated")

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(keyring_core, "load_config", lambda: Locked("locked"))
    with pytest.raises(KeychainUnavailable) as raised:
        open_keychain().get_password("s", "u")
    assert str(raised.value) == "KeyringLocked"

    def not_viable(name: str) -> Any:
        raise RuntimeError("not this platform")

    monkeypatch.setattr(keyring_core, "load_config", lambda: None)
    monkeypatch.setattr(keyring_core, "load_keyring", not_viable)
    with pytest.raises(KeychainUnavailable, match="^RuntimeError$"):
        open_keychain()


def test_without_keyring_a_named_backend_is_keychain_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "keyring.core", None)  # an import of it fails
    with pytest.raises(KeychainUnavailable, match="keyring is not installed"):
        open_keychain()
