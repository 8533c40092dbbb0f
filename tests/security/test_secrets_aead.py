"""AES-256-GCM of stored secrets (sidecar/secrets/aead.py, pycryptodome): the bytes
``cryptography``'s AESGCM produced, so every value sealed so far still opens.

The vectors below were made with cryptography 50.0.2's ``AESGCM(key).encrypt(nonce,
plaintext, aad)`` (and a value with SecretBox.seal as it was then, from a key file); the
NIST one is the GCM specification's test case 16 (AES-256, 60-byte plaintext, 20-byte AAD).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from sidecar.errors import SecretsLocked
from sidecar.secrets import aead
from sidecar.secrets.box import SecretBox

KAT_KEY = bytes.fromhex("f7341ed48c6ef353e1e2a04a30e75819eee430b8f1d8c41afa945475b89f9d41")
CRYPTOGRAPHY_VECTORS = [
    # (aad = the purpose, plaintext, nonce, ciphertext + tag), made by cryptography's AESGCM
    ("providers.api_key", "sk-test-ABCDEF0123456789", "2bbcdf26f2fbbbcf4232e50c",
     "ea0dc2c982eacda4cc3b3270770aa64006c7e345de2e203eb5b2250b49e2832e6c1f99b5718cbf86"),
    ("mcp_servers.env", "", "401494f5766541cce6b97613", "9e3379fd1d1ccb170597a05da342b96c"),
    ("providers.headers", "Bearer \u00e9\u4e2d\u6587 token", "e1e261f6533750114465058e",
     "a7e2ca8490036d3a2cf1221eb86ed3e63e13f34eb26f9631af9074421caf5538eeecf17585"),
]

NIST_KEY = bytes.fromhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
NIST_IV = bytes.fromhex("cafebabefacedbaddecaf888")
NIST_AAD = bytes.fromhex("feedfacedeadbeeffeedfacedeadbeefabaddad2")
NIST_PLAINTEXT = bytes.fromhex(
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
    "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"
)
NIST_CIPHERTEXT = bytes.fromhex(
    "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
    "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
)
NIST_TAG = bytes.fromhex("76fc6ece0f4e1768cddf8853bb2d551b")

BOX_KEY_FILE_MATERIAL = bytes(range(32))
BOX_SEALED = "enc1:6c742306a8331c97:ogLOe41dyn65hCJKqiugLHO6pcfUhd4PjM85qTpRp4nM9NVTzDABYV99LZOwYv6Dzo1iQMByDnE6PA=="
"""SecretBox.seal("sk-live-sealed-by-cryptography", "providers.api_key") with cryptography."""


@pytest.mark.parametrize(("purpose", "plaintext", "nonce", "sealed"), CRYPTOGRAPHY_VECTORS)
def test_the_bytes_are_those_cryptography_sealed(purpose: str, plaintext: str, nonce: str, sealed: str) -> None:
    assert aead.seal(KAT_KEY, bytes.fromhex(nonce), plaintext.encode(), purpose.encode()).hex() == sealed
    assert aead.open_sealed(KAT_KEY, bytes.fromhex(nonce), bytes.fromhex(sealed), purpose.encode()) == plaintext.encode()


def test_the_nist_gcm_vector() -> None:
    assert aead.seal(NIST_KEY, NIST_IV, NIST_PLAINTEXT, NIST_AAD) == NIST_CIPHERTEXT + NIST_TAG
    assert aead.open_sealed(NIST_KEY, NIST_IV, NIST_CIPHERTEXT + NIST_TAG, NIST_AAD) == NIST_PLAINTEXT


def test_a_tampered_tag_ciphertext_or_aad_does_not_open() -> None:
    sealed = NIST_CIPHERTEXT + NIST_TAG
    for bad in (sealed[:-1] + bytes([sealed[-1] ^ 1]), bytes([sealed[0] ^ 0x80]) + sealed[1:], sealed[:-1], sealed[:15]):
        with pytest.raises(aead.TagMismatch):
            aead.open_sealed(NIST_KEY, NIST_IV, bad, NIST_AAD)
    with pytest.raises(aead.TagMismatch):
        aead.open_sealed(NIST_KEY, NIST_IV, sealed, NIST_AAD + b"x")
    with pytest.raises(aead.TagMismatch):
        aead.open_sealed(bytes(32), NIST_IV, sealed, NIST_AAD)


def box_with_key_file(data: Path) -> SecretBox:
    data.mkdir(parents=True, exist_ok=True)
    fd = os.open(data / "secret.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as stream:
        stream.write(base64.b64encode(BOX_KEY_FILE_MATERIAL).decode() + "\n")
    return SecretBox(data, use_keychain=False)


def test_a_value_sealed_by_the_cryptography_code_opens(tmp_path: Path) -> None:
    box = box_with_key_file(tmp_path)
    assert box.open(BOX_SEALED, "providers.api_key") == "sk-live-sealed-by-cryptography"
    resealed = box.seal("sk-live-sealed-by-cryptography", "providers.api_key")
    assert resealed != BOX_SEALED and box.key_of(resealed) == box.key_of(BOX_SEALED)  # a fresh nonce, same key
    assert box.open(resealed, "providers.api_key") == "sk-live-sealed-by-cryptography"


def test_a_tampered_stored_value_or_another_purpose_is_locked(tmp_path: Path) -> None:
    box = box_with_key_file(tmp_path)
    prefix, _, body = BOX_SEALED.rpartition(":")
    raw = bytearray(base64.b64decode(body))
    raw[-1] ^= 1  # the tag
    with pytest.raises(SecretsLocked, match="cannot be decrypted"):
        box.open(f"{prefix}:{base64.b64encode(bytes(raw)).decode()}", "providers.api_key")
    with pytest.raises(SecretsLocked, match="cannot be decrypted"):
        box.open(BOX_SEALED, "providers.headers")  # the purpose is the associated data
    with pytest.raises(SecretsLocked, match="cannot be decrypted"):
        box.open(f"{prefix}:{base64.b64encode(bytes(raw[:8])).decode()}", "providers.api_key")  # cut short


def test_a_key_id_is_the_one_stored_values_name_and_a_key_never_shows_its_material() -> None:
    from sidecar.secrets.keys import make_key

    key = make_key(b"k" * 32, "file")
    assert key.kid == "8c51cac5b6ed15ba"  # what sealed values of this material carry (enc1:<kid>:...)
    same, other = make_key(b"k" * 32, "file"), make_key(b"k" * 32, "host")
    assert key == same and hash(key) == hash(same) and key != other
    assert "kkkk" not in repr(key) and repr(key) == "Key(kid='8c51cac5b6ed15ba', source='file')"
