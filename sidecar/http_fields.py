"""What may be sent as an HTTP/1.1 header field: the one rule for every secret or name the
sidecar puts in a request header (API keys, custom provider and MCP headers, server tokens).

``name_problem(name)`` / ``value_problem(value)`` / ``headers_problem(headers)`` /
``token_problem(token)``: why a header name, a value, a set of headers or a bearer token
(a value without whitespace) cannot be sent, or None. A name is an RFC 9110
token. A value is printable ASCII (tabs allowed): the HTTP client encodes values as ASCII,
and the wire refuses line breaks and other controls (a line break would start a header of
its own). A non-ASCII key or a key with a newline would otherwise fail deep inside a
request, far from the setting that holds it.

Must stay true: a message says what is wrong, never the value (a value is often a secret).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["name_problem", "value_problem", "headers_problem", "token_problem"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(r"[\t\x20-\x7e]*")


def name_problem(name: str) -> str | None:
    if not _TOKEN.fullmatch(name):
        return "must be letters, digits and !#$%&'*+-.^_`|~ only"
    return None


def value_problem(value: str) -> str | None:
    if not _VALUE.fullmatch(value):
        return "must be printable ASCII (an HTTP header carries it: no line break, control or non-ASCII character)"
    return None


def token_problem(token: str) -> str | None:
    if value_problem(token) or any(char.isspace() for char in token):
        return "must be printable ASCII without spaces (an HTTP header carries it)"
    return None


def headers_problem(headers: Mapping[str, str]) -> str | None:
    """The first header of ``headers`` that cannot be sent and why (naming it, never its value)."""
    for name, value in headers.items():
        if problem := name_problem(name):
            return f"header name {name[:64]!r} {problem}"
        if problem := value_problem(value):
            return f"the value of header {name[:64]!r} {problem}"
    return None
