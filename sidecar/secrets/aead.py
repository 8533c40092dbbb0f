"""AES-256-GCM sealing and opening of one value (``pycryptodome``).

The bytes are those of ``cryptography``'s ``AESGCM`` (what sealed the values stored so
far): a 12-byte nonce, the ciphertext with its 16-byte tag appended, the associated data
authenticated and not stored. ``open_sealed`` checks the tag in constant time
(``decrypt_and_verify``) and raises ``TagMismatch`` when the key, nonce, associated data,
ciphertext or tag is not the one sealed.

Must stay true: pycryptodome is imported only here and only when a value is sealed or
opened (never at a start that has nothing to seal); no key or plaintext in an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from Crypto.Cipher._mode_gcm import GcmMode

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


class TagMismatch(ValueError):
    """The value does not open with this key and associated data (damaged, moved or forged)."""


def seal(key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """``ciphertext + tag`` of ``plaintext`` under ``key`` (32 bytes) and ``nonce`` (12)."""
    cipher = _cipher(key, nonce)
    cipher.update(aad)
    ciphertext, tag = cipher.encrypt_and_digest(plaintext)
    return bytes(ciphertext + tag)


def open_sealed(key: bytes, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
    """The plaintext of ``ciphertext + tag``; TagMismatch unless it is authentic."""
    if len(sealed) < TAG_BYTES:
        raise TagMismatch("the sealed value is shorter than its tag")
    cipher = _cipher(key, nonce)
    cipher.update(aad)
    try:
        return bytes(cipher.decrypt_and_verify(sealed[:-TAG_BYTES], sealed[-TAG_BYTES:]))
    except ValueError:
        raise TagMismatch("the tag does not match") from None


def _cipher(key: bytes, nonce: bytes) -> GcmMode:
    from Crypto.Cipher import AES

    if len(key) != KEY_BYTES:
        raise ValueError(f"an AES-256 key is {KEY_BYTES} bytes")
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"the nonce is {NONCE_BYTES} bytes")
    return AES.new(key, AES.MODE_GCM, nonce=nonce, mac_len=TAG_BYTES)
