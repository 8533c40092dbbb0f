"""Command line: ``python -m sidecar [serve] [options]`` (console script ``chat-sidecar``).

``serve`` (the default) speaks JSON-RPC 2.0 over stdin/stdout until stdin closes,
``sidecar:shutdown``, SIGTERM or SIGINT, or its parent dies, then exits 0 within
``sidecar.supervision.SHUTDOWN_DEADLINE_S`` (children still running are killed). Exit codes: 0 clean stop,
1 failure while running or starting (logged to stderr), 2 bad command line or settings.

Kept light on imports: the server and its dependencies load only after the arguments
are parsed, so ``--help`` and start-up stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    from sidecar import __version__

    parser = argparse.ArgumentParser(
        prog="chat-sidecar",
        description="Local chat engine: JSON-RPC 2.0 (NDJSON) over stdin/stdout.",
    )
    parser.add_argument("command", nargs="?", default="serve", choices=["serve"], help="what to run (default: serve)")
    parser.add_argument(
        "--data-dir", help="data directory (env CHAT_SIDECAR_DATA_DIR; default: the platform's user data dir)"
    )
    parser.add_argument(
        "--log-level", help="DEBUG, INFO, WARNING, ERROR, CRITICAL (env CHAT_SIDECAR_LOG_LEVEL; default WARNING)"
    )
    parser.add_argument(
        "--max-line-bytes",
        type=int,
        help="reject input lines longer than this (env CHAT_SIDECAR_MAX_LINE_BYTES; default 16 MiB)",
    )
    parser.add_argument(
        "--secret-key-fd",
        type=int,
        help="read the secrets key (base64 of 32 bytes) from this inherited fd (env CHAT_SIDECAR_SECRET_KEY_FD)",
    )
    parser.add_argument(
        "--no-keychain",
        dest="keychain",
        action="store_false",
        default=None,
        help="keep the secrets key in a key file, never in the OS keychain (env CHAT_SIDECAR_KEYCHAIN=off)",
    )
    parser.add_argument("--bench", action="store_true", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"chat-sidecar {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from sidecar.config import build_config
    from sidecar.errors import SidecarError

    try:
        config = build_config(
            {"data_dir": args.data_dir, "log_level": args.log_level, "max_line_bytes": args.max_line_bytes,
             "bench": args.bench, "secret_key_fd": args.secret_key_fd, "keychain": args.keychain}
        )
    except SidecarError as exc:
        print(f"chat-sidecar: {exc.message}", file=sys.stderr)
        return 2
    return _serve_stdio(config)


def _serve_stdio(config: object) -> int:
    import logging

    import anyio

    from sidecar.rpc.stdio import take_stdio, uses_blocking_thread

    # fd 1 is guarded before anything else loads: a module (or a library it imports) that
    # prints at import time must not reach the wire.
    receive, send = take_stdio()

    from sidecar.config import Config
    from sidecar.errors import SidecarError
    from sidecar.logging_setup import setup_logging
    from sidecar.server import serve
    from sidecar.supervision import Supervisor

    assert isinstance(config, Config)
    setup_logging(config.log_level)
    log = logging.getLogger("sidecar")
    code = 0
    supervisor = Supervisor()
    try:
        anyio.run(lambda: serve(config, receive, send, handle_signals=True, supervisor=supervisor))
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
