"""The start-up's early answers: the leading requests a host wrote before the event loop.

A desktop host spawns the sidecar and writes its first requests at once: the handshake and
the reads of its first screen. They are usually waiting in the pipe by the time the
command line is parsed. ``answer_waiting`` answers them there, synchronously, before
asyncio, the server and the services are imported (about half of the time to those
answers), and hands the server what it opened and the LineReader it read with
(``ColdStart``): the server's peer reads on from that reader, so every line is split once,
by the framing module the server uses (sidecar/rpc/framing.py).

It answers, in order, the leading requests of the waiting input that are
- ``sidecar:initialize``, answered by sidecar/handshake.py after the secrets key is settled
  on the store (the host's ``secretKey``, or the sidecar's own key), as the server does;
- a method of ``sidecar.bindings.EARLY``, answered by its blocking handler on the store
  (sidecar/engine/session_reads.py, what the App's SessionService runs too).
The store is opened here (``sidecar.store_open.open_store``, the App's way) when its schema
is current and no key comes on a file descriptor (both are left to the App: a migration may
take long, and runs where signals and the parent's death are served; the key can be read
only once). It stops at the first other line. What must stay true:
- an answer given here is the one the server would give at that moment, and only a success:
  anything else (params that do not decode, an error of the store, a version mismatch, an
  empty, partial or oversized line, a batch, a notification, another method) stops it, and
  that line and everything after it reach the server as they came, in order;
- nothing here waits for input, and nothing here imports what HEAVY_MODULES names.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

import msgspec

from protocol import PROTOCOL_VERSION
from protocol.lifecycle import InitializeParams
from sidecar import datadir
from sidecar.bindings import EARLY, INITIALIZE
from sidecar.config import Config
from sidecar.errors import SidecarError
from sidecar.handshake import check_version, initialize_result
from sidecar.logging_setup import EarlyLogger
from sidecar.secrets.box import secrets_info
from sidecar.rpc.dispatch import Handler
from sidecar.rpc.framing import LineReader
from sidecar.rpc.messages import Envelope, OutResult, classify, encode, envelope_decoder
from sidecar.rpc.stdio import FdReceiveStream, FdSendStream

if TYPE_CHECKING:
    from sidecar.store.store import Store

logger = EarlyLogger(__name__)

HEAVY_MODULES = (
    "sidecar.providers", "sidecar.pipeline", "sidecar.tools", "sidecar.acp", "sidecar.retrieval",
    "sidecar.channels", "sidecar.compat", "sidecar.sync", "sidecar.engine.chat", "sidecar.tools.mcp_client", "jsonschema",
    "jinja2", "pypdf", "numpy", "tiktoken", "httpx2", "uvicorn", "selectolax", "markdown_it",
    "Crypto", "cryptography",  # AES-GCM: only when a value is sealed or opened
)
"""What the first answers must not import (``sidecar:bench:modules`` reports which are loaded)."""


def loaded_heavy_modules() -> list[str]:
    return sorted(m for m in HEAVY_MODULES if m in sys.modules)


class EarlySignals:
    """SIGTERM and SIGINT that come before the event loop serves them: recorded (instead
    of killing the process or raising KeyboardInterrupt mid-import), and acted on by the
    server as soon as its own handlers are in place, so the exit is the same clean one
    whenever the signal comes. POSIX only (elsewhere the host stops us by stdin or
    ``sidecar:shutdown``)."""

    def __init__(self) -> None:
        self.received: int | None = None

    def install(self) -> None:
        if os.name != "posix":
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signum


class ColdStart:
    """What the early answers did, for the server to carry on from. (Not a dataclass:
    ``dataclasses`` and the classes it makes would cost the first answers ~1.5 ms.)"""

    def __init__(self, signals: EarlySignals | None = None, reader: LineReader | None = None) -> None:
        self.signals = signals if signals is not None else EarlySignals()
        self.reader = reader
        """The reader of the input, holding what was read and not answered (None: nothing read)."""
        self.answered: list[str] = []
        """The methods answered, in order."""
        self.store: Store | None = None
        """The store, opened and recovered (``open_store``); the App owns it from ``open_app`` on."""
        self.modules_at_first_read: list[str] | None = None
        """``loaded_heavy_modules()`` when the first store method was answered."""

    @property
    def store_read(self) -> bool:
        """A store method was answered: the other services are wanted now."""
        return any(method in EARLY for method in self.answered)


def answer_waiting(
    config: Config, receive: FdReceiveStream, send: FdSendStream, signals: EarlySignals
) -> ColdStart:
    """Answer the leading requests of what is waiting on ``receive`` (see the module doc)."""
    reader = LineReader(receive, config.max_line_bytes)
    cold = ColdStart(signals=signals, reader=reader)
    reader.feed_waiting()
    while (line := reader.next_ready()) is not None:
        try:
            answer = _answer(config, line, cold) if isinstance(line, bytes) and line else None
        except Exception:  # a bug here must not cost the start: the server answers it instead
            logger.exception("an early answer failed on a waiting request; the server answers it")
            answer = None
        if answer is None:
            reader.put_back(line)
            break
        try:
            send.write_now(answer)
        except OSError as exc:  # the reader is gone: the server finds the output broken too
            logger.info("an early answer could not be written: %s", exc)
            break
    if cold.answered:
        logger.info("answered before the event loop: %s", ", ".join(cold.answered))
    return cold


def _answer(config: Config, line: bytes, cold: ColdStart) -> bytes | None:
    try:
        incoming = classify(envelope_decoder.decode(line))
    except (msgspec.DecodeError, RecursionError):
        return None
    envelope = incoming.envelope
    if incoming.kind != "request":
        return None
    if envelope.method == INITIALIZE:
        return _initialize(config, envelope, cold)
    if isinstance(envelope.method, str) and envelope.method in EARLY:
        return _read(config, envelope, envelope.method, cold)
    return None


def _initialize(config: Config, envelope: Envelope, cold: ColdStart) -> bytes | None:
    try:
        params = Handler.for_params(InitializeParams).decode_params(envelope.params)
    except SidecarError:
        return None
    if params.protocol_version not in (None, PROTOCOL_VERSION):
        return None
    host_key = None
    if params.secret_key is not None:
        from sidecar.secrets.keys import parse_key

        try:
            host_key = parse_key(params.secret_key)
        except ValueError:  # the server says why
            return None
    try:  # the answer names the data dir: it exists by then, as when the server answers
        datadir.make_dirs(config.data_dir)
    except OSError:  # the server reports it
        return None
    store = _store(config, cold)
    if store is None:
        return None
    try:
        secrets = secrets_info(store.secrets.settle(host_key))
    except SidecarError:
        return None
    check_version(params)
    answer = encode(OutResult(id=envelope.id, result=initialize_result(config, secrets)))
    cold.answered.append(INITIALIZE)
    return answer


def _read(config: Config, envelope: Envelope, method: str, cold: ColdStart) -> bytes | None:
    from sidecar.engine import session_reads

    try:
        params = Handler.for_params(session_reads.SPECS[method].params).decode_params(envelope.params)
        store = _store(config, cold)
        if store is None:
            return None
        result = session_reads.HANDLERS[EARLY[method]](store, params)
    except SidecarError:
        return None
    answer = encode(OutResult(id=envelope.id, result=result))
    if not cold.store_read:
        cold.modules_at_first_read = loaded_heavy_modules()
    cold.answered.append(method)
    return answer


def _store(config: Config, cold: ColdStart) -> Store | None:
    if cold.store is not None:
        return cold.store
    if config.secret_key_fd is not None:
        return None
    from sidecar.store_open import open_store

    try:
        cold.store = open_store(config, migrate=False)
    except Exception as exc:  # the App opens it, or reports why it cannot
        # (a migration to run, a lock held, a file it cannot read)
        logger.debug("the store is left to the App: %s", exc)
        return None
    return cold.store
