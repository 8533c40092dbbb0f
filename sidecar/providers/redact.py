"""Keeping secrets out of every message, log line and repr the providers produce.

Owns: ``Redactor`` (masks the API key, the values of credential-looking custom
headers and URL userinfo in any text) and ``safe_url`` (a URL with its userinfo
and query string removed and a bot token in its path masked, for display), which the
HTTP client's per-request log lines go through (``install_http_log_filter``, installed by
every client that logs requests: the providers', the sync client's, the channels').

Must stay true: every string a provider puts in an exception or a log record
has gone through ``Redactor.redact`` or contains no provider-supplied text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from sidecar.secrets.names import is_secret_name

__all__ = ["Redactor", "safe_url", "install_http_log_filter"]

_MASK = "***"
# Shorter values would mask common words in provider messages for no gain.
_MIN_SECRET_LEN = 6


_PATH_TOKEN = re.compile(r"/bot\d+:[A-Za-z0-9_-]+")
"""A Telegram bot token in a path (``/bot<id>:<secret>/getMe``, ``/file/bot<id>:<secret>/...``)."""


def safe_url(url: str) -> str:
    """``url`` without userinfo and query (where keys sometimes travel), and with a bot token
    in its path (Telegram's API puts it there) masked."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port out of range (``http://h:99999/``)
    except ValueError:
        return "<invalid url>"
    host = parts.hostname or ""
    if port is not None:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, _PATH_TOKEN.sub("/bot" + _MASK, parts.path), "", ""))


class Redactor:
    def __init__(self, api_key: str | None, headers: Mapping[str, str], base_url: str) -> None:
        secrets: set[str] = set()
        if api_key:
            secrets.add(api_key)
        for name, value in headers.items():
            if is_secret_name(name):
                secrets.add(value)
                # "Bearer <token>": the token alone may be echoed back.
                secrets.update(word for word in value.split() if len(word) >= _MIN_SECRET_LEN)
        try:
            parts = urlsplit(base_url)
            secrets.update(s for s in (parts.password, parts.username, parts.query) if s)
            secrets.update(value for _, value in parse_qsl(parts.query))
        except ValueError:
            pass
        # Longest first so a secret that contains another is masked whole.
        self._secrets = sorted((s for s in secrets if len(s) >= _MIN_SECRET_LEN), key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, _MASK)
        return text


class _SafeUrlFilter(logging.Filter):
    """Rewrites URL arguments of httpx2's "HTTP Request: ..." records to ``safe_url``.

    httpx2 logs every request URL at INFO; a base URL may carry credentials in its
    userinfo or query (``?api-key=``), which must not reach the log.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            record.args = tuple(
                safe_url(str(a)) if type(a).__name__ == "URL" or (isinstance(a, str) and "://" in a) else a
                for a in args
            )
        return True


_FILTER = _SafeUrlFilter()


def install_http_log_filter() -> None:
    """Idempotent: attach the URL filter to httpx2's logger."""
    logger = logging.getLogger("httpx2")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
