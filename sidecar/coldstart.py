"""The cold start: the first answers, given before the event loop exists.

A desktop host spawns the sidecar and writes its first requests at once: the handshake and
the session list of its first screen. They are usually waiting in the pipe by the time the
command line is parsed. ``answer_waiting`` answers them there, synchronously, before
asyncio, the server and the services are imported (about half of the time to those
answers), and hands what it opened to the server (``ColdStart``).

It answers, in order, the leading requests of the waiting input that are
- ``sidecar:initialize``, answered by sidecar/handshake.py; with ``secretKey`` the key is
  first settled on the store opened here (``SecretsService.settle``'s repository call);
- ``chat:session:list``, read from the store (``SessionRepo.query``, what the App's
  SessionService answers it with).
The store is opened here when its schema is current and no key comes on a file descriptor
(both are left to the App: a migration may take long, and runs where signals and the
parent's death are served; the key can be read only once). It stops at the first other
line. What must stay true:
- an answer given here is the one the server would give at that moment, and only a success:
  anything else (params that do not decode, an error of the store, a version mismatch, a
  partial or oversized line, a batch, a notification, another method) stops it, and that
  line and everything after it reach the server byte for byte, in order;
- nothing here waits for input, and nothing here imports what HEAVY_MODULES names.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from protocol import PROTOCOL_VERSION
from protocol.lifecycle import InitializeParams, SecretsInfo
from protocol.sessions import SessionFilter
from sidecar.bindings import INITIALIZE
from sidecar import datadir
from sidecar.config import Config
from sidecar.errors import SidecarError
from sidecar.handshake import BOUND_METHODS, check_version, initialize_result
from sidecar.rpc.dispatch import Handler
from sidecar.rpc.messages import Envelope, OutResult, classify, encode, envelope_decoder
from sidecar.rpc.stdio import FdReceiveStream, FdSendStream

if TYPE_CHECKING:
    from sidecar.store.store import Store

logger = logging.getLogger(__name__)

SESSION_LIST = "chat:session:list"
SESSION_LIST_PARAMS = SessionFilter
"""Its params type (``protocol.METHODS`` has the same: tests/test_cold_start.py), named
directly so that the first list imports no other domain of the protocol."""

HEAVY_MODULES = (
    "sidecar.providers", "sidecar.pipeline", "sidecar.tools", "sidecar.acp", "sidecar.retrieval",
    "sidecar.channels", "sidecar.compat", "sidecar.sync", "sidecar.engine.chat", "mcp", "jsonschema",
    "jinja2", "pypdf", "numpy", "tiktoken", "httpx2", "uvicorn", "selectolax", "markdown_it",
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


@dataclass
class ColdStart:
    """What the cold start did, for the server to carry on from."""

    signals: EarlySignals = field(default_factory=EarlySignals)
    answered: list[str] = field(default_factory=list)
    """The methods answered, in order."""
    store: Store | None = None
    """The store, opened and recovered (``open_store``); the App owns it from ``open_app`` on."""
    modules_at_first_read: list[str] | None = None
    """``loaded_heavy_modules()`` when the first store method was answered."""

    @property
    def initialized(self) -> bool:
        """The handshake was answered."""
        return INITIALIZE in self.answered

    @property
    def store_read(self) -> bool:
        """A store method was answered: the other services are wanted now."""
        return SESSION_LIST in self.answered


def answer_waiting(
    config: Config, receive: FdReceiveStream, send: FdSendStream, signals: EarlySignals
) -> ColdStart:
    """Answer the leading requests of what is waiting on ``receive`` (see the module doc);
    whatever was read and not answered is put back."""
    cold = ColdStart(signals=signals)
    waiting = receive.read_waiting()
    start = 0
    while (end := waiting.find(b"\n", start)) >= 0:
        line = waiting[start:end]
        try:
            answer = _answer(config, line, cold) if 0 < len(line) <= config.max_line_bytes else None
        except Exception:  # a bug here must not cost the start: the server answers it instead
            logger.exception("the cold start failed on a waiting request; the server answers it")
            answer = None
        if answer is None:
            break
        start = end + 1
        try:
            send.write_now(answer)
        except OSError as exc:  # the reader is gone: the server finds the output broken too
            logger.info("an answer of the cold start could not be written: %s", exc)
            break
    receive.unread(waiting[start:])
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
    if envelope.method == SESSION_LIST:
        return _session_list(config, envelope, cold)
    return None


def _initialize(config: Config, envelope: Envelope, cold: ColdStart) -> bytes | None:
    try:
        params = Handler.for_params(InitializeParams).decode_params(envelope.params)
    except SidecarError:
        return None
    if params.protocol_version not in (None, PROTOCOL_VERSION):
        return None
    try:  # the answer names the data dir: it exists by then, as when the App answers
        datadir.make_dirs(config.data_dir)
    except OSError:  # the App reports it
        return None
    secrets = None
    if params.secret_key is not None:
        # the host's key is applied to the store before the answer, which reports it
        secrets = _settle(config, params.secret_key, cold)
        if secrets is None:
            return None
    # without a key, it is settled once the App has the store (``secrets`` null, as in any
    # handshake answered before the store is open)
    check_version(params)
    answer = encode(OutResult(id=envelope.id, result=initialize_result(config, BOUND_METHODS, secrets)))
    cold.answered.append(INITIALIZE)
    return answer


def _settle(config: Config, secret_key: str, cold: ColdStart) -> SecretsInfo | None:
    """``SecretsService.settle`` with the host's key, on the store opened here; None when
    it cannot be done here (a key that does not parse, a store left to the App)."""
    from sidecar.engine.secrets import secrets_info
    from sidecar.secrets.keys import parse_key

    try:
        host_key = parse_key(secret_key)
    except ValueError:  # the server says why
        return None
    store = cold.store or _open_store(config, cold)
    if store is None:
        return None
    try:
        return secrets_info(store.secrets.settle(host_key))
    except SidecarError:
        return None


def _session_list(config: Config, envelope: Envelope, cold: ColdStart) -> bytes | None:
    try:
        params = Handler.for_params(SESSION_LIST_PARAMS).decode_params(envelope.params)
        store = cold.store or _open_store(config, cold)
        if store is None:
            return None
        result = store.sessions.query(params)
    except SidecarError:
        return None
    answer = encode(OutResult(id=envelope.id, result=result))
    if not cold.store_read:
        cold.modules_at_first_read = loaded_heavy_modules()
    cold.answered.append(SESSION_LIST)
    return answer


def _open_store(config: Config, cold: ColdStart) -> Store | None:
    if config.secret_key_fd is not None:
        return None
    from pathlib import Path

    from sidecar.secrets.box import SecretBox
    from sidecar.store.store import open_store

    data_dir = Path(config.data_dir)
    try:
        cold.store = open_store(
            data_dir, secrets=SecretBox(data_dir, use_keychain=config.keychain), migrate_schema=False
        )
    except Exception as exc:  # the App opens it, or reports why it cannot
        # (a migration to run, a lock held, a file it cannot read)
        logger.debug("the store is left to the App: %s", exc)
        return None
    return cold.store
