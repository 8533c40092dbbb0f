"""Logging for the process: everything goes to stderr, never to stdout (stdout is the wire).

``setup_logging(level)`` installs one stderr handler on the root logger. Python warnings
are routed into logging too, so a library's warning shows up as a log line instead of
a bare write. The HTTP client's own per-request INFO lines ("HTTP Request: POST ...") are
shown at DEBUG only: at INFO they would add a line per provider call to the app's log.
What must stay true: no handler here ever writes to fd 1.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"


QUIET_BELOW_DEBUG = ("httpx2", "httpcore2")
"""Libraries whose INFO lines are per-request noise: held at WARNING unless DEBUG is asked for."""


def setup_logging(level: str = "WARNING") -> None:
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
