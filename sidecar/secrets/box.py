"""SecretBox: stored secret values sealed with AES-256-GCM (``sidecar.secrets.aead``).

A sealed value is ``enc1:<key id>:<base64 of nonce + ciphertext + tag>``, with a fresh
96-bit random nonce per value and the value's purpose (``providers.api_key``...) as
associated data, so a value cannot be moved to another field unnoticed. A value without
the prefix is legacy plaintext: it opens as itself, and the store re-seals it when the
keys are settled.

Settling decides the primary key (the one that seals) once, from the sources of
``sidecar.secrets.keys``: the host key if one was given (``sidecar:initialize
{secretKey}`` or a key fd), else the OS keychain, else the key file. It happens at the
handshake, or at the first use of a secret when the client skipped it; a host key given
later becomes the primary and the store re-seals everything it can open with it. Every
key we have opens the values it sealed; a value sealed with a key we do not have raises
SecretsLocked (nothing is lost: it stays stored, and a later start with the right key
opens it).

Must stay true: thread-safe (repositories run in worker threads); no key material or
plaintext in a log record, an error or a repr.
"""

from __future__ import annotations

import binascii
import os
import threading

import msgspec

from protocol.lifecycle import SecretsInfo
from sidecar.errors import SecretsLocked
from sidecar.logging_setup import EarlyLogger
from sidecar.secrets import aead
from sidecar.secrets.keys import DirPath, Key, KeySource, file_key, keychain_key, make_key

log = EarlyLogger(__name__)

PREFIX = "enc1:"
NONCE_BYTES = aead.NONCE_BYTES


class SecretsStatus(msgspec.Struct, kw_only=True):
    settled: bool
    source: KeySource | None
    """Where the sealing key comes from (None until settled)."""
    locked: int = 0
    """Stored values sealed with a key this process does not have (set by the store)."""


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


class SecretBox:
    def __init__(self, data_dir: DirPath, *, host_key: bytes | None = None, use_keychain: bool = True) -> None:
        self._data_dir = data_dir
        self._lock = threading.RLock()
        self._keys: dict[bytes, Key] = {}
        """Every key we have, by its material (its id is hashed only when a value needs it)."""
        self._primary: Key | None = None
        self._given_host = make_key(host_key, "host") if host_key is not None else None
        self._use_keychain = use_keychain
        self.locked = 0

    # -- keys ------------------------------------------------------------------------

    def settle(self, host_key: bytes | None = None) -> bool:
        """Decide the primary key (idempotent); a ``host_key`` given now becomes the primary
        even when already settled. True when the primary changed (the store re-seals)."""
        with self._lock:
            if host_key is not None:
                self._given_host = make_key(host_key, "host")
            if self._primary is not None and (self._given_host is None or self._primary == self._given_host):
                return False
            self._load_existing()
            primary: Key | None
            if self._given_host is not None:
                primary = self._given_host
            else:
                primary = next((k for k in self._keys.values() if k.source == "keychain"), None) or next(
                    (k for k in self._keys.values() if k.source == "file"), None
                )
                if primary is None:
                    primary = self._create_fallback()
            self._keys[primary.material] = primary
            changed = self._primary != primary
            self._primary = primary
            log.info("secrets are sealed with the %s key", primary.source)
            return changed

    def _load_existing(self) -> None:
        """Every key we can find, for opening (none is created here)."""
        found: list[Key | None] = [file_key(self._data_dir, create=False)]
        if self._use_keychain:
            found.append(keychain_key(self._data_dir, create=False))
        for key in found:
            if key is not None:
                self._keys.setdefault(key.material, key)

    def _create_fallback(self) -> Key:
        key = keychain_key(self._data_dir, create=True) if self._use_keychain else None
        return key if key is not None else _required(file_key(self._data_dir, create=True))

    def _key_by_id(self, kid: str | None) -> Key | None:
        return next((k for k in self._keys.values() if k.kid == kid), None)

    def kid_of_source(self, source: KeySource) -> str | None:
        with self._lock:
            return next((k.kid for k in self._keys.values() if k.source == source), None)

    @property
    def primary_source(self) -> KeySource | None:
        return self._primary.source if self._primary is not None else None

    def status(self) -> SecretsStatus:
        return SecretsStatus(settled=self._primary is not None, source=self.primary_source, locked=self.locked)

    # -- values ----------------------------------------------------------------------

    def seal(self, value: str, purpose: str) -> str:
        self.settle()
        with self._lock:
            key = self._primary
        assert key is not None
        nonce = os.urandom(NONCE_BYTES)
        sealed = aead.seal(key.material, nonce, value.encode("utf-8"), purpose.encode())
        return f"{PREFIX}{key.kid}:{binascii.b2a_base64(nonce + sealed, newline=False).decode('ascii')}"

    def open(self, value: str, purpose: str) -> str:
        """The plaintext of a stored value (legacy plaintext is returned as is)."""
        if not is_sealed(value):
            return value
        self.settle()
        kid, _, body = value[len(PREFIX) :].partition(":")
        with self._lock:
            key = self._key_by_id(kid)
        if key is None:
            raise SecretsLocked(f"a stored secret ({purpose}) was sealed with a key this process was not given")
        try:
            raw = binascii.a2b_base64(body, strict_mode=True)
            plain = aead.open_sealed(key.material, raw[:NONCE_BYTES], raw[NONCE_BYTES:], purpose.encode())
        except ValueError as exc:  # TagMismatch, bad base64, a nonce cut short
            raise SecretsLocked(f"a stored secret ({purpose}) cannot be decrypted (damaged or moved)") from exc
        return plain.decode("utf-8")

    def needs_reseal(self, value: str) -> bool | None:
        """True: plaintext, or sealed with a key we have that is not the primary; False:
        sealed with the primary; None: sealed with a key we do not have (locked)."""
        if not is_sealed(value):
            return True
        kid = self.key_of(value)
        with self._lock:
            if self._primary is not None and kid == self._primary.kid:
                return False
            return True if self._key_by_id(kid) is not None else None

    @staticmethod
    def key_of(value: str) -> str | None:
        return value[len(PREFIX) :].partition(":")[0] if is_sealed(value) else None


def _required(key: Key | None) -> Key:
    if key is None:  # file_key(create=True) always returns a key or raises
        raise SecretsLocked("no key to seal secrets with")
    return key


def secrets_info(status: SecretsStatus) -> SecretsInfo:
    """What the answer reports of a settled key."""
    assert status.source is not None  # settled
    return SecretsInfo(state="locked" if status.locked else "ready", source=status.source, locked=status.locked)
