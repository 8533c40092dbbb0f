"""Where the key that seals stored secrets comes from.

In order of preference:
1. the host: the Electron main process keeps a random 32-byte key protected by
   ``safeStorage`` and passes it at every start, in ``sidecar:initialize {secretKey}``
   or on an inherited file descriptor (``--secret-key-fd N`` /
   ``CHAT_SIDECAR_SECRET_KEY_FD``); base64 of exactly 32 bytes;
2. the OS keychain (one entry per data dir, service ``chat-sidecar``, username
   ``data-dir:<hash of its path>``), when one works; which keychain is a rule, never a
   discovery (``sidecar.secrets.keychain``): ``PYTHON_KEYRING_BACKEND`` when set (a keyring
   backend's dotted name; on Linux ``keyring.backends.SecretService.Keyring`` is our own
   client), else macOS's and Windows' keyring backend loaded directly, else on Linux the
   freedesktop Secret Service over D-Bus (``sidecar.secrets.secret_service``, the entries
   keyring's SecretService backend wrote and reads); ``--no-keychain`` /
   ``CHAT_SIDECAR_KEYCHAIN=off`` skips it; any failure (no session bus, no service, a
   locked keychain whose prompt is dismissed) is "no keychain";
3. a key file ``<dataDir>/secret.key`` created with mode 0600 (it protects the database
   file copied alone, not a reader of the whole data dir: use 1. or 2. for that).

A key is known by its id (a hash of the key, never the key): every sealed value carries
the id of the key that sealed it, so a value sealed with a key we do not have is
recognised as locked instead of failing to decrypt as garbage.

Must stay true: key material is never logged or put in an error; the key file is never
readable by others (created 0600 with O_EXCL, refused when it is a symlink).
"""

from __future__ import annotations

import binascii
import os
import stat
from typing import Literal

from sidecar.logging_setup import EarlyLogger

log = EarlyLogger(__name__)

KEY_BYTES = 32
KEY_FILE = "secret.key"
KEYCHAIN_SERVICE = "chat-sidecar"
KeySource = Literal["host", "keychain", "file"]

DirPath = str | os.PathLike[str]
"""A data dir as the key functions take it (sidecar.datadir.StrPath, which this layer may not import)."""


class Key:
    """A key's material and where it comes from; equal keys have both equal."""

    __slots__ = ("material", "source", "_kid")

    def __init__(self, material: bytes, source: KeySource) -> None:
        self.material = material
        self.source: KeySource = source
        self._kid: str | None = None

    @property
    def kid(self) -> str:
        """Hashed at first use: a start that seals and compares no value hashes nothing."""
        if self._kid is None:
            self._kid = key_id(self.material)
        return self._kid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and (self.material, self.source) == (other.material, other.source)

    def __hash__(self) -> int:
        return hash((self.material, self.source))

    def __repr__(self) -> str:  # never the material
        return f"Key(kid={self.kid!r}, source={self.source!r})"


def key_id(material: bytes) -> str:
    import hashlib  # here: it loads OpenSSL (~3 ms), which a start that needs no key id does without

    return hashlib.sha256(b"chat-sidecar key id\0" + material).hexdigest()[:16]


def make_key(material: bytes, source: KeySource) -> Key:
    return Key(material, source)


def parse_key(text: str) -> bytes:
    """The 32 bytes of a base64 (standard or URL-safe, padding optional) key; ValueError otherwise."""
    cleaned = "".join(text.split())
    cleaned += "=" * (-len(cleaned) % 4)
    try:
        material = binascii.a2b_base64(cleaned.replace("-", "+").replace("_", "/"), strict_mode=True)
    except (binascii.Error, ValueError):
        raise ValueError("the key is not base64") from None
    if len(material) != KEY_BYTES:
        raise ValueError(f"the key must be {KEY_BYTES} bytes (base64 of {KEY_BYTES} random bytes)")
    return material


def read_key_fd(fd: int) -> bytes:
    """Read the host key from an inherited file descriptor (then closed)."""
    try:
        with os.fdopen(fd, "rb", closefd=True) as stream:
            data = stream.read(4096)
    except OSError as exc:
        raise ValueError(f"cannot read the key from fd {fd}: {exc.strerror or exc}") from exc
    return parse_key(data.decode("ascii", errors="replace"))


def _encode(material: bytes) -> str:
    return binascii.b2a_base64(material, newline=False).decode("ascii")


def keychain_key(data_dir: DirPath, *, create: bool) -> Key | None:
    """The data dir's key in the OS keychain (created there when ``create``), or None when
    there is no entry or no working keychain (logged: the failure's type, never a secret)."""
    # here, not at the top: a start without a keychain needs none of these (hashlib loads
    # OpenSSL); the account is the hash of the resolved Path's text, the name of stored entries
    import hashlib
    from pathlib import Path

    from sidecar.secrets.keychain import KeychainUnavailable, open_keychain

    account = "data-dir:" + hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:24]
    try:
        chain = open_keychain()
    except KeychainUnavailable as exc:
        log.info("no OS keychain for the secrets key: %s", exc)
        return None
    try:
        stored = chain.get_password(KEYCHAIN_SERVICE, account)
        if stored is None:
            if not create:
                return None
            material = os.urandom(KEY_BYTES)
            chain.set_password(KEYCHAIN_SERVICE, account, _encode(material))
            if chain.get_password(KEYCHAIN_SERVICE, account) != _encode(material):
                return None  # a backend that does not keep what it is given
            return make_key(material, "keychain")
        return make_key(parse_key(stored), "keychain")
    except KeychainUnavailable as exc:
        log.info("no OS keychain for the secrets key: %s", exc)
        return None
    except (ValueError, OSError, RuntimeError) as exc:  # the stored entry is not a key; a backend's own error
        log.info("no OS keychain for the secrets key: %s", type(exc).__name__)
        return None
    finally:
        chain.close()


def file_key(data_dir: DirPath, *, create: bool) -> Key | None:
    """The key in ``<data_dir>/secret.key`` (created 0600 when ``create``), or None."""
    path = os.path.join(data_dir, KEY_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        if not create:
            return None
        return _create_key_file(path)
    except OSError as exc:
        raise ValueError(f"cannot read the key file {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as stream:
        if os.name != "nt":
            mode = os.fstat(stream.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                os.fchmod(stream.fileno(), 0o600)
                log.warning("the key file %s was readable by others; now 0600", path)
        return make_key(parse_key(stream.read(4096).decode("ascii", errors="replace")), "file")


def _create_key_file(path: str) -> Key:
    material = os.urandom(KEY_BYTES)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as stream:
        stream.write((_encode(material) + "\n").encode("ascii"))
        stream.flush()
        os.fsync(stream.fileno())
    return make_key(material, "file")


def remove_key_file(data_dir: DirPath) -> bool:
    try:
        os.unlink(os.path.join(data_dir, KEY_FILE))
    except FileNotFoundError:
        return False
    return True
