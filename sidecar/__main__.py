"""Command line: ``python -m sidecar [serve] [options]`` (console script ``chat-sidecar``).

``serve`` (the default) speaks JSON-RPC 2.0 over stdin/stdout until stdin closes,
``sidecar:shutdown``, SIGTERM or SIGINT, or its parent dies, then exits 0 within
``sidecar.supervision.SHUTDOWN_DEADLINE_S`` (children still running are killed). Exit codes: 0 clean stop,
1 failure while running or starting (logged to stderr), 2 bad command line or settings.

Kept light on imports: the server and its dependencies load only after the arguments
are parsed, so ``--help`` and start-up stay fast.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import argparse


class Option(NamedTuple):
    flag: str
    dest: str
    kind: type[str] | type[int] | bool
    """``str``/``int``: takes a value; ``True``/``False``: a switch storing that value."""
    help: str | None
    """None: hidden from ``--help``."""


OPTIONS = (
    Option("--data-dir", "data_dir", str,
           "data directory (env CHAT_SIDECAR_DATA_DIR; default: the platform's user data dir)"),
    Option("--log-level", "log_level", str,
           "DEBUG, INFO, WARNING, ERROR, CRITICAL (env CHAT_SIDECAR_LOG_LEVEL; default WARNING)"),
    Option("--max-line-bytes", "max_line_bytes", int,
           "reject input lines longer than this (env CHAT_SIDECAR_MAX_LINE_BYTES; default 16 MiB)"),
    Option("--secret-key-fd", "secret_key_fd", int,
           "read the secrets key (base64 of 32 bytes) from this inherited fd (env CHAT_SIDECAR_SECRET_KEY_FD)"),
    Option("--no-keychain", "keychain", False,
           "keep the secrets key in a key file, never in the OS keychain (env CHAT_SIDECAR_KEYCHAIN=off)"),
    Option("--bench", "bench", True, None),
    Option("--test-clock", "test_clock_ms", int,
           "tests only: the task scheduler's clock stands at this time (ms since the epoch) and moves only by "
           "sidecar:test:clock (env CHAT_SIDECAR_TEST_CLOCK)"),
)
"""The command line's options: ``_parser`` (help, errors) and ``_quick_parse`` read this one table."""
COMMANDS = ("serve",)


def _parser() -> argparse.ArgumentParser:
    import argparse

    from sidecar import __version__

    parser = argparse.ArgumentParser(
        prog="chat-sidecar",
        description="Local chat engine: JSON-RPC 2.0 (NDJSON) over stdin/stdout.",
    )
    parser.add_argument("command", nargs="?", default="serve", choices=COMMANDS, help="what to run (default: serve)")
    for option in OPTIONS:
        shown = option.help if option.help is not None else argparse.SUPPRESS
        if isinstance(option.kind, bool):
            action = "store_true" if option.kind else "store_false"
            parser.add_argument(option.flag, dest=option.dest, action=action, default=None, help=shown)
        else:
            parser.add_argument(option.flag, dest=option.dest, type=option.kind, help=shown)
    parser.add_argument("--version", action="version", version=f"chat-sidecar {__version__}")
    return parser


def _quick_parse(argv: Sequence[str]) -> dict[str, Any] | None:
    """The options of an ordinary command line, without importing argparse (several ms of
    every start); None for anything else (help, version, a mistake), which ``_parser``
    then handles with its messages."""
    by_flag = {option.flag: option for option in OPTIONS}
    values: dict[str, Any] = {option.dest: None for option in OPTIONS}
    commands = 0
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg in COMMANDS and commands == 0:
            commands = 1
            continue
        flag, has_value, value = arg.partition("=")
        option = by_flag.get(flag)
        if option is None:
            return None
        if isinstance(option.kind, bool):
            if has_value:
                return None
            values[option.dest] = option.kind
            continue
        if not has_value:
            if i == len(argv) or argv[i].startswith("-"):
                return None  # argparse's own rules (and message) for a missing value
            value = argv[i]
            i += 1
        if option.kind is int:
            try:
                values[option.dest] = int(value)
            except ValueError:
                return None
        else:
            values[option.dest] = value
    return values


def main(argv: Sequence[str] | None = None) -> int:
    gc.disable()  # until the first answers are written (_serve_stdio says why)
    try:
        return _start(argv)
    finally:
        gc.enable()  # whatever way the start ends (_serve_stdio enables it much earlier)


def _start(argv: Sequence[str] | None) -> int:
    args = sys.argv[1:] if argv is None else argv
    overrides = _quick_parse(args)
    if overrides is None:
        parsed = _parser().parse_args(args)
        overrides = {option.dest: getattr(parsed, option.dest) for option in OPTIONS}
    from sidecar.config import build_config
    from sidecar.errors import SidecarError

    try:
        config = build_config(overrides)
    except SidecarError as exc:
        print(f"chat-sidecar: {exc.message}", file=sys.stderr)
        return 2
    return _serve_stdio(config)


def _serve_stdio(config: object) -> int:
    import anyio

    from sidecar.rpc.stdio import take_stdio, uses_blocking_thread

    # fd 1 is guarded before anything else loads: a module (or a library it imports) that
    # prints at import time must not reach the wire.
    receive, send = take_stdio()

    from sidecar.coldstart import EarlySignals, answer_waiting
    from sidecar.config import Config
    from sidecar.errors import SidecarError
    from sidecar.logging_setup import defer_setup, finish_setup

    signals = EarlySignals()
    signals.install()  # from now on a stop signal always ends in the clean exit
    assert isinstance(config, Config)
    defer_setup(config.log_level)  # logging loads after the first answers (unless they log)
    # The first requests, when already waiting, are answered before the event loop and
    # the server load.
    cold = answer_waiting(config, receive, send, signals)
    finish_setup()
    # The cyclic collector was off since main(): what the start-up made up to here lives on
    # (modules, classes, the store), so its collections found next to nothing and cost the
    # first answers ~3 ms. The server freezes what it holds later (sidecar/heap.py).
    gc.enable()

    import logging

    from sidecar.children.env import hide_from_children
    from sidecar.server import serve
    from sidecar.supervision import Supervisor, adopt_orphans

    hide_from_children()  # before the first child: none can read our environment in /proc
    adopt_orphans()  # and none leaves a descendant behind by leaving its process group

    log = logging.getLogger("sidecar")
    code = 0
    supervisor = Supervisor()
    try:
        anyio.run(
            lambda: serve(config, receive, send, handle_signals=True, supervisor=supervisor, cold=cold)
        )
    except Exception as exc:
        leaves = _leaf_exceptions(exc)
        if all(isinstance(leaf, SidecarError) for leaf in leaves):
            for leaf in leaves:  # an expected failure (e.g. unusable data dir): the message says it all
                log.error("%s", leaf)
        else:
            log.exception("the server failed")
        code = 1
    # The deadline stays armed through interpreter exit (a stuck thread cannot hold us),
    # and children still alive are killed now.
    supervisor.exit_code = code
    supervisor.begin_shutdown()
    supervisor.finish()
    if uses_blocking_thread():
        # A worker thread may be blocked reading stdin forever; the output is written.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)
    return code


def _leaf_exceptions(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaf_exceptions(inner)]
    return [exc]


if __name__ == "__main__":
    sys.exit(main())
