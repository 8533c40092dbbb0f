"""Time-ordered ids (UUIDv7, RFC 9562) and the millisecond clock of the store.

Owns: ``new_id()`` and ``now_ms()``.
Must stay true: ids from one process sort (as text) in the order they were made, even
several within the same millisecond or when the wall clock steps back; they are the
canonical lowercase 8-4-4-4-12 form, so text order equals numeric order. Random text keys
make B-tree inserts scatter over the whole index; time-ordered keys append at the end.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["new_id", "now_ms", "UuidV7Generator"]

_RAND_BITS = 74  # 12 bits rand_a + 62 bits rand_b
_RAND_MAX = (1 << _RAND_BITS) - 1
# A fresh millisecond starts the random field below half its range, so the increments of
# ids made in the same millisecond practically never overflow it.
_FRESH_MASK = (1 << (_RAND_BITS - 1)) - 1


def now_ms() -> int:
    """Milliseconds since the epoch (the unit of every timestamp in the store)."""
    return time.time_ns() // 1_000_000


class UuidV7Generator:
    """Monotonic UUIDv7 generator (RFC 9562 section 6.2, method 2: random increment)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def __call__(self) -> str:
        ms = now_ms()
        with self._lock:
            if ms > self._last_ms:
                rand = int.from_bytes(os.urandom(10), "big") & _FRESH_MASK
            else:
                # Same millisecond or the clock stepped back: stay on the last timestamp
                # and step the random field forward so the order still holds.
                ms = self._last_ms
                rand = self._last_rand + 1 + (int.from_bytes(os.urandom(4), "big") & 0xFFFF)
                if rand > _RAND_MAX:
                    ms += 1
                    rand = int.from_bytes(os.urandom(10), "big") & _FRESH_MASK
            self._last_ms = ms
            self._last_rand = rand
        return _format(ms, rand)


def _format(ms: int, rand: int) -> str:
    rand_a = rand >> 62
    rand_b = rand & ((1 << 62) - 1)
    value = (
        ((ms & 0xFFFF_FFFF_FFFF) << 80)
        | (0x7 << 76)
        | (rand_a << 64)
        | (0b10 << 62)
        | rand_b
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


new_id = UuidV7Generator()
"""The process-wide generator: ``new_id()`` returns a fresh UUIDv7 string."""
