"""Reading a JSON column: the one rule for what of it is served.

Owns ``STORED_JSON_DEPTH`` and the two reads every repository uses on a JSON column:
``decode_column`` (strict: a StoreError naming the row and column, for code that rewrites
what it read) and ``lenient_json`` (the value, or a default logged naming the row and column,
for reads that answer the caller). It is kept out of sidecar/store/rows.py (which maps
whole rows) so that the secrets' re-seal pass at the handshake reads the JSON of its
columns without importing the row types.

Must stay true: a column that does not decode, or nests deeper than STORED_JSON_DEPTH (a
value stored before params were bounded, or written by an agent, that would fail to
encode again), is never served as it is.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.limits import MAX_JSON_DEPTH
from sidecar.errors import StoreError
from sidecar.jsondepth import json_text_too_deep
from sidecar.logging_setup import EarlyLogger

__all__ = ["STORED_JSON_DEPTH", "decode_column", "lenient_json"]

log = EarlyLogger(__name__)

STORED_JSON_DEPTH = 4 * MAX_JSON_DEPTH
"""Deeper stored JSON is not served. Params are bounded to MAX_JSON_DEPTH (a column adds
at most two typed levels); this leaves room for values the engine or an agent wrote, and
is far below the nesting at which encoding a reply would fail."""


def decode_column(decoder: msgspec.json.Decoder[Any], raw: str | None, what: str, row_id: str) -> Any:
    """The decoded column (None stays None); StoreError naming ``what`` of ``row_id`` otherwise."""
    if raw is None:
        return None
    if json_text_too_deep(raw, STORED_JSON_DEPTH):
        raise StoreError(f"stored {what} of {row_id} nests deeper than {STORED_JSON_DEPTH} levels")
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise StoreError(f"stored {what} of {row_id} is not valid: {exc}") from exc
    except RecursionError as exc:
        raise StoreError(f"stored {what} of {row_id} nests too deep to decode") from exc


def lenient_json(decoder: msgspec.json.Decoder[Any], raw: str | None, what: str, row_id: str, default: Any = None) -> Any:
    """The decoded column, or ``default`` (logged, naming row and column) when it cannot be
    served; for reads that answer the caller, never for read-modify-write."""
    try:
        return decode_column(decoder, raw, what, row_id)
    except StoreError as exc:
        log.warning("%s; served without it", exc.message)
        return default
