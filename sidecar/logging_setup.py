"""Logging for the process: everything goes to stderr, never to stdout (stdout is the wire).

``setup_logging(level)`` installs one stderr handler on the root logger. Python warnings
are routed into logging too, so a library's warning shows up as a log line instead of
a bare write. What must stay true: no handler here ever writes to fd 1.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
