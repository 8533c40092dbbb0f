"""Logging for the process: everything goes to stderr, never to stdout (stdout is the wire).

``setup_logging(level)`` installs one stderr handler on the root logger. Python warnings
are routed into logging too, so a library's warning shows up as a log line instead of
a bare write. The HTTP client's own per-request INFO lines ("HTTP Request: POST ...") are
shown at DEBUG only: at INFO they would add a line per provider call to the app's log.

The modules that answer the first requests (sidecar/coldstart.py and what it reaches) log
through an ``EarlyLogger(__name__)``: importing ``logging`` costs those answers about 4 ms, and
they log little, mostly below the default level. ``defer_setup(level)`` names the level at
the start; a record below it is dropped there, as logging would drop it; the first record at
or above it through an early logger, or ``finish_setup``, whichever comes first, installs
the handler. What must stay true: no handler here ever writes to fd 1, and no record is
emitted before the handler is installed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging

FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"


QUIET_BELOW_DEBUG = ("httpx2", "httpcore2")
"""Libraries whose INFO lines are per-request noise: held at WARNING unless DEBUG is asked for."""

LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
"""logging's numbers for the levels sidecar.config accepts."""

_deferred_level: str | None = None
"""The level ``defer_setup`` named, until the handler is installed."""


def setup_logging(level: str = "WARNING") -> None:
    global _deferred_level
    import logging

    _deferred_level = None
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET_BELOW_DEBUG:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    logging.captureWarnings(True)


def defer_setup(level: str) -> None:
    """``setup_logging(level)`` at the first early record, or when it is called itself."""
    global _deferred_level
    if level not in LEVELS:  # here, not at the first record, which may come much later
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    _deferred_level = level


def finish_setup() -> None:
    """Install the deferred handler now, if no record has yet."""
    if _deferred_level is not None:
        setup_logging(_deferred_level)


class EarlyLogger:
    """``logging.getLogger(name)``, looked up (and the deferred handler installed) at the
    first record: the same records, levels and handlers as a plain module logger."""

    __slots__ = ("name", "_logger")

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger: logging.Logger | None = None

    def _real(self) -> logging.Logger:
        if self._logger is None:
            import logging

            finish_setup()
            self._logger = logging.getLogger(self.name)
        return self._logger

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log("DEBUG", msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log("INFO", msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log("WARNING", msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log("ERROR", msg, args, kwargs)

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        """ERROR with the exception being handled, as ``Logger.exception``."""
        kwargs.setdefault("exc_info", True)
        self._log("ERROR", msg, args, kwargs)

    def _log(self, level: str, msg: object, args: tuple[object, ...], kwargs: dict[str, Any]) -> None:
        if _wanted(level):
            # the record names the caller's line (two frames up: the level method, then this)
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 2
            self._real().log(LEVELS[level], msg, *args, **kwargs)


def _wanted(level: str) -> bool:
    """False for a record below the deferred level: logging would drop it (until the handler
    is installed no logger of ours has a level of its own, so the root's decides), and it is
    dropped without loading logging."""
    return _deferred_level is None or LEVELS[level] >= LEVELS[_deferred_level]
