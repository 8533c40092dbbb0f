"""Process configuration: one ``Config`` Struct built from the CLI, the environment and defaults.

Owns the precedence rule (command-line flag > environment variable > default) and the
validation of every setting, so the rest of the process receives a finished, valid
``Config`` and never reads ``os.environ`` itself.

To add a setting: add a field with a default to ``Config``, an entry to ``ENV_VARS`` if it
has an environment variable, and a flag in ``sidecar/__main__.py``; ``build_config`` picks
it up through ``overrides``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgspec

from sidecar.errors import InvalidParams
from sidecar.logging_setup import LEVELS

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
"""The one definition of the default line limit (rpc framing and the attachment size use it)."""
MIN_MAX_LINE_BYTES = 1024
"""Smaller limits would reject ordinary requests (an initialize alone is ~100 bytes)."""

LOG_LEVELS = tuple(LEVELS)
DEFAULT_LOG_LEVEL = "WARNING"
"""Quiet by default: a desktop app keeps the sidecar's stderr in its own log, where
problems (WARNING and up) matter; INFO (lifecycle, one line per step) and DEBUG are asked for."""

ENV_VARS: dict[str, str] = {
    "data_dir": "CHAT_SIDECAR_DATA_DIR",
    "log_level": "CHAT_SIDECAR_LOG_LEVEL",
    "max_line_bytes": "CHAT_SIDECAR_MAX_LINE_BYTES",
    "secret_key_fd": "CHAT_SIDECAR_SECRET_KEY_FD",
    "keychain": "CHAT_SIDECAR_KEYCHAIN",
    "warmup_ms": "CHAT_SIDECAR_WARMUP_MS",
    "test_clock_ms": "CHAT_SIDECAR_TEST_CLOCK",
}
"""Config field -> environment variable that sets it."""


class Config(msgspec.Struct, kw_only=True, frozen=True):
    """Everything the process was told at start-up (frozen)."""

    data_dir: str
    """Absolute path of the data directory (database, logs, stored attachments)."""
    log_level: str = DEFAULT_LOG_LEVEL
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """Input lines longer than this are discarded and answered with MESSAGE_TOO_LARGE."""
    bench: bool = False
    """Enables the hidden ``sidecar:bench:notify`` method (benchmarks only)."""
    secret_key_fd: int | None = None
    """An inherited file descriptor to read the host's secrets key from (base64 of 32 bytes),
    instead of passing it in ``sidecar:initialize {secretKey}``."""
    warmup_ms: int = 250
    """Once the store is open, the other services (providers, pipeline, tools, ACP, MCP...)
    load at the first request that needs them, after the first store answers, or after
    this idle delay, whichever comes first."""
    keychain: bool = True
    """Without a host key, keep the secrets key in the OS keychain (``keyring``) when one
    works; False: only the key file in the data dir."""
    test_clock_ms: int | None = None
    """Tests only: the task scheduler's clock starts at this time (ms since the epoch) and
    moves only when ``sidecar:test:clock`` sets it (a method that exists only then)."""


def default_data_dir() -> str:
    # platformdirs is imported here, not at module level: only the no-flag, no-env path needs it.
    import platformdirs

    return platformdirs.user_data_dir("chat-sidecar", appauthor=False)


def build_config(overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Resolve every field: ``overrides`` (CLI) > ``env`` > default. An override that is
    ``None`` or ``""`` counts as not given, like an empty environment variable (so
    ``--data-dir ""`` is the default dir, not the current directory).

    Raises InvalidParams with a message naming the setting and its source when a value is bad.
    """
    env = os.environ if env is None else env
    given = {k: v for k, v in (overrides or {}).items() if v is not None and v != ""}
    values: dict[str, Any] = {}
    for field in msgspec.structs.fields(Config):
        name = field.name
        if name in given:
            values[name] = given[name]
        elif name in ENV_VARS and env.get(ENV_VARS[name], "") != "":
            values[name] = _from_env(name, env[ENV_VARS[name]])
    if "data_dir" not in values:
        values["data_dir"] = default_data_dir()
    values["data_dir"] = os.path.abspath(os.path.expanduser(str(values["data_dir"])))
    level = str(values.get("log_level", DEFAULT_LOG_LEVEL)).upper()
    if level not in LOG_LEVELS:
        raise InvalidParams(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    values["log_level"] = level
    fd = values.get("secret_key_fd")
    if fd is not None and (not isinstance(fd, int) or isinstance(fd, bool) or fd < 0):
        raise InvalidParams(f"secret key fd must be a file descriptor number, got {fd!r}")
    max_line = values.get("max_line_bytes", DEFAULT_MAX_LINE_BYTES)
    if not isinstance(max_line, int) or isinstance(max_line, bool) or max_line < MIN_MAX_LINE_BYTES:
        raise InvalidParams(f"max line bytes must be an integer >= {MIN_MAX_LINE_BYTES}, got {max_line!r}")
    try:
        return msgspec.convert(values, Config)
    except msgspec.ValidationError as exc:
        raise InvalidParams(f"invalid configuration: {exc}") from exc


def _from_env(name: str, raw: str) -> Any:
    if name == "keychain":
        lowered = raw.strip().lower()
        if lowered not in ("0", "1", "true", "false", "on", "off", "yes", "no"):
            raise InvalidParams(f"{ENV_VARS[name]} must be on or off, got {raw!r}")
        return lowered in ("1", "true", "on", "yes")
    if name in ("max_line_bytes", "secret_key_fd", "warmup_ms", "test_clock_ms"):
        try:
            return int(raw)
        except ValueError:
            raise InvalidParams(f"{ENV_VARS[name]} must be an integer, got {raw!r}") from None
    return raw

