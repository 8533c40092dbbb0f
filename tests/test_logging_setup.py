"""The process's logging: one stderr handler, installed before the first record, and the
early loggers that keep ``logging`` off the way to the first answers.

Each case runs in a fresh interpreter: what it checks is the process's root logger and
which modules are loaded, which a test process shares with every other test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> tuple[dict[str, object], str]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_an_early_logger_loads_logging_and_the_handler_at_its_first_shown_record() -> None:
    got, stderr = _run(
        """
        import json, sys
        from sidecar.logging_setup import EarlyLogger, defer_setup
        log = EarlyLogger("sidecar.example")
        defer_setup("INFO")
        log.debug("dropped below the level, as logging would")
        before = "logging" in sys.modules
        def where_it_was_called():
            log.info("first %s", "record")
        where_it_was_called()
        import logging
        seen = []
        class Keep(logging.Handler):
            def emit(self, record):
                seen.append([record.name, record.funcName, record.getMessage(), record.exc_text is not None])
        logging.getLogger().addHandler(Keep())
        log.debug("below the level")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
        root = logging.getLogger()
        print(json.dumps({
            "before": before,
            "level": logging.getLevelName(root.level),
            "streams": [getattr(h, "stream", None) is sys.__stderr__ for h in root.handlers],
            "seen": seen,
        }))
        """
    )
    assert got["before"] is False
    assert got["level"] == "INFO"
    assert got["streams"] == [True, False]  # ours on stderr, then the test's own
    assert got["seen"] == [["sidecar.example", "<module>", "it failed", True]]
    lines = stderr.splitlines()
    assert lines[0].endswith("INFO    sidecar.example: first record"), stderr
    assert "ValueError: boom" in stderr and "below the level" not in stderr and "dropped" not in stderr


def test_without_an_early_record_finish_setup_installs_the_handler_once() -> None:
    got, stderr = _run(
        """
        import json, logging, sys
        from sidecar.logging_setup import EarlyLogger, defer_setup, finish_setup
        defer_setup("WARNING")
        finish_setup()
        finish_setup()  # nothing deferred any more: no second handler
        logging.getLogger("sidecar.late").warning("a plain logger's record")
        EarlyLogger("sidecar.early").info("below the level")
        print(json.dumps({"handlers": len(logging.getLogger().handlers)}))
        """
    )
    assert got == {"handlers": 1}
    assert stderr.strip().endswith("WARNING sidecar.late: a plain logger's record"), stderr
    assert "below the level" not in stderr


def test_the_level_names_are_loggings_own_numbers() -> None:
    import logging

    from sidecar.logging_setup import LEVELS

    assert LEVELS == {name: logging.getLevelName(name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}


def test_an_unknown_deferred_level_is_refused_at_once() -> None:
    import pytest

    from sidecar import logging_setup

    with pytest.raises(ValueError, match="log level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        logging_setup.defer_setup("verbose")
    assert logging_setup._deferred_level is None  # nothing deferred: records go as usual
