"""The Linux keychain of the secrets key: our Secret Service client (sidecar/secrets/
secret_service.py) against a fake service on a private D-Bus session bus.

A key is created and found again; an entry in keyring's format (and one keyring's own
SecretService backend writes) is found, and keyring finds ours; no bus or no service is
"no keychain"; a locked item is unlocked through its prompt, and a dismissed or
unanswered prompt is "no keychain" (the key file then); and over the subprocess, a key
kept in the keychain across two starts opens the sealed API key.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_secret_service import DBUS_DAEMON, FakeSecretService, private_session_bus
from sidecar_proc import ROOT

from sidecar.secrets import secret_service
from sidecar.secrets.box import SecretBox
from sidecar.secrets.keys import KEYCHAIN_SERVICE, keychain_key, make_key

pytestmark = pytest.mark.skipif(
    DBUS_DAEMON is None or not sys.platform.startswith("linux"),
    reason="needs dbus-daemon (Debian package dbus) and Linux, where the sidecar talks to the Secret Service",
)

MATERIAL = bytes(range(100, 132))


@pytest.fixture
def bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with private_session_bus(tmp_path / "bus") as address:
        monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", address)
        monkeypatch.delenv("PYTHON_KEYRING_BACKEND", raising=False)
        yield address


def account_of(data_dir: Path) -> str:
    """The username keys.py uses for a data dir (spelled out: it is what keychains hold)."""
    return "data-dir:" + hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:24]


def keyring_entry(service: FakeSecretService, data_dir: Path, material: bytes, *, locked: bool = False) -> None:
    """An entry as keyring's SecretService backend writes it (keyring 25.7)."""
    account = account_of(data_dir)
    service.add_item(
        service.default,
        f"Password for '{account}' on 'chat-sidecar'",
        {"username": account, "service": "chat-sidecar", "application": "Python keyring library"},
        base64.b64encode(material),
        locked=locked,
    )


def test_a_key_created_in_the_keychain_is_found_again(bus: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with FakeSecretService(bus) as service:
        assert keychain_key(data, create=False) is None  # no entry yet, and none is written
        assert service.default.items == []
        created = keychain_key(data, create=True)
        assert created is not None and created.source == "keychain"
        (item,) = service.default.items
        account = account_of(data)
        assert item.attributes == {"username": account, "service": "chat-sidecar", "application": "Python keyring library"}
        assert item.label == f"Password for '{account}' on 'chat-sidecar'"
        assert item.content_type == "text/plain"
        assert base64.b64decode(item.secret) == created.material
        assert keychain_key(data, create=False) == created
        assert "OpenSession" in service.calls


def test_an_entry_in_keyrings_format_is_found(bus: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with FakeSecretService(bus) as service:
        keyring_entry(service, tmp_path / "other", b"O" * 32)  # another data dir's entry
        keyring_entry(service, data, MATERIAL)
        assert keychain_key(data, create=False) == make_key(MATERIAL, "keychain")
        assert keychain_key(data, create=True) == make_key(MATERIAL, "keychain")  # found, not replaced
        assert len(service.default.items) == 2


def test_keyrings_own_backend_and_ours_find_each_others_entries(bus: str, tmp_path: Path) -> None:
    pytest.importorskip("secretstorage", reason="keyring's SecretService backend needs secretstorage")
    from keyring.backends.SecretService import Keyring

    with FakeSecretService(bus) as service:
        theirs = Keyring()
        theirs.set_password(KEYCHAIN_SERVICE, account_of(tmp_path / "a"), base64.b64encode(MATERIAL).decode())
        assert keychain_key(tmp_path / "a", create=False) == make_key(MATERIAL, "keychain")
        ours = keychain_key(tmp_path / "b", create=True)
        assert ours is not None
        assert theirs.get_password(KEYCHAIN_SERVICE, account_of(tmp_path / "b")) == base64.b64encode(ours.material).decode()
        assert len(service.default.items) == 2


def test_no_service_or_no_bus_is_no_keychain(bus: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.secrets.keys")
    assert keychain_key(tmp_path / "data", create=True) is None  # the bus has no Secret Service
    assert "org.freedesktop.DBus.Error.ServiceUnknown" in caplog.text
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS")
    assert keychain_key(tmp_path / "data", create=True) is None
    assert "no session bus" in caplog.text
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path / 'nothing-here'}")
    assert keychain_key(tmp_path / "data", create=True) is None
    assert "cannot connect to the session bus (FileNotFoundError)" in caplog.text


def test_a_locked_item_is_unlocked_by_its_prompt(bus: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with FakeSecretService(bus, prompt="accept") as service:
        keyring_entry(service, data, MATERIAL, locked=True)
        assert keychain_key(data, create=False) == make_key(MATERIAL, "keychain")
        assert service.calls.count("Prompt") == 1
        assert not service.default.items[0].locked


def test_a_dismissed_prompt_is_no_keychain_and_the_key_file_seals(bus: str, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.secrets.keys")
    data = tmp_path / "data"
    data.mkdir()
    with FakeSecretService(bus, prompt="dismiss") as service:
        keyring_entry(service, data, MATERIAL, locked=True)
        assert keychain_key(data, create=False) is None
        assert "SecretServiceLocked: the keychain's prompt was dismissed" in caplog.text
        service.default.locked = True  # and a locked collection cannot be written either
        box = SecretBox(data)
        box.settle()
        assert box.primary_source == "file" and (data / "secret.key").exists()
        assert len(service.default.items) == 1  # nothing written behind the user's back


def test_an_unanswered_prompt_is_dismissed_in_time(bus: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_service, "PROMPT_SECONDS", 0.3)
    data = tmp_path / "data"
    with FakeSecretService(bus, prompt="never") as service:
        keyring_entry(service, data, MATERIAL, locked=True)
        assert keychain_key(data, create=False) is None
        assert service.calls[-1] == "Dismiss"
        assert service.default.items[0].locked


def test_without_a_default_collection_reading_writes_nothing_and_writing_creates_it(bus: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with FakeSecretService(bus, default_collection=False) as service:
        assert keychain_key(data, create=False) is None
        assert service.collections == {}
        created = keychain_key(data, create=True)
        assert created is not None
        assert service.default.label == "Default" and len(service.default.items) == 1


def test_the_linux_keychain_imports_neither_keyring_nor_cryptography(bus: str, tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from sidecar.secrets.keys import keychain_key; "
        f"assert keychain_key(Path({str(tmp_path / 'data')!r}), create=True) is not None; "
        "print(sorted(m for m in ('keyring', 'secretstorage', 'cryptography', 'Crypto') if m in sys.modules))"
    )
    with FakeSecretService(bus):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ), capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.anyio
async def test_a_key_kept_in_the_keychain_across_two_starts_opens_the_api_key(bus: str, tmp_path: Path) -> None:
    from chat_helpers import configure_provider, wait_final
    from scripted_server import scripted_provider
    from sidecar_proc import spawn_sidecar

    data = tmp_path / "data"
    env = {"CHAT_SIDECAR_KEYCHAIN": "on", "DBUS_SESSION_BUS_ADDRESS": bus}
    with FakeSecretService(bus) as service:
        async with scripted_provider() as server:
            async with spawn_sidecar(data, env=env, subprocess=True) as proc:
                info = await proc.call("sidecar:initialize", {})
                assert info["secrets"] == {"state": "ready", "source": "keychain", "locked": 0}
                await configure_provider(proc, server.base_url)
                await proc.close()
            assert not (data / "secret.key").exists() and len(service.default.items) == 1
            async with spawn_sidecar(data, env=env, subprocess=True) as proc:
                info = await proc.call("sidecar:initialize", {})
                assert info["secrets"] == {"state": "ready", "source": "keychain", "locked": 0}
                session = await proc.call("chat:session:create", {})
                sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hello"}})
                assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"  # the API key opened
                await proc.close()
