"""Which MIME types are text (inlined or read as documents rather than described)."""

from __future__ import annotations

__all__ = ["is_text_mime"]

_TEXT_MIME_PREFIXES = ("text/",)
_TEXT_MIMES = {
    "application/json",
    "application/xml",
    "application/x-yaml",
    "application/yaml",
    "application/javascript",
    "application/typescript",
    "application/x-python",
    "application/x-sh",
    "application/sql",
    "application/toml",
}


def is_text_mime(mime: str) -> bool:
    mime = mime.split(";", 1)[0].strip().lower()
    return (
        mime.startswith(_TEXT_MIME_PREFIXES)
        or mime in _TEXT_MIMES
        or mime.endswith("+json")
        or mime.endswith("+xml")
    )
