"""Drive the real sidecar and speak NDJSON JSON-RPC to it, as Electron does: in process
(the default) or as a ``python -m sidecar`` subprocess. Shared by every end-to-end test.

    async with spawn_sidecar(tmp_path) as proc:
        info = await proc.call("sidecar:initialize", {})
        with pytest.raises(CallError) as err:
            await proc.call("nope")
        assert err.value.code == -32601
        event = await proc.next_notification("chat:stream")
        await proc.close()          # sidecar:shutdown, then asserts exit code 0
    proc.assert_all_jsonrpc()       # every stdout line was a JSON-RPC 2.0 message

Two ways to run it, one API (``SidecarProcess``):

- **in process** (the default): the real server (``sidecar.server.serve``: the same
  Server, App, peer and framing module) runs as a task of the test's event loop over a
  pair of in-memory byte streams (tests/sidecar_inprocess.py). Lines are still NDJSON
  bytes, split by the sidecar's own ``LineReader`` and written by its ``LineWriter``;
  the config is built by ``sidecar.config.build_config`` from the same arguments and
  environment a subprocess would get; the sidecar's log records go to ``stderr`` in the
  process's format. No interpreter to start and nothing to import again: an in-process
  sidecar is ready in a fraction of the time a process takes.
- **subprocess**: ``python -m sidecar --data-dir DATA_DIR ARGS...`` with pipes, for what
  only a process shows: exit codes and signals, stdio framing and fd guarding, a kill
  and the crash recovery after it, cold start, resource limits, the bundle, environment
  variables, and everything under tests/security/.

Which one runs, first rule that applies:
1. ``spawn_sidecar(..., subprocess=True/False)``;
2. a subprocess when the call itself needs one: ``command=``, ``waiting=``, an ``env=``
   entry that is not one of the sidecar's settings (``sidecar.config.ENV_VARS``; e.g. a
   provider key variable, HOME, PYTHONPATH), a secret key fd, or a command line the
   sidecar refuses (its exit code 2 is the behaviour);
3. ``CHAT_SIDECAR_TEST_SUBPROCESS=1`` in the environment: every sidecar is a subprocess
   (to check that a test passes both ways);
4. in a test of the suite (tests/conftest.py sets it per test): in process, except for a
   test marked ``@pytest.mark.sidecar_subprocess`` (on the test, or ``pytestmark`` for a
   module) and every test under tests/security/;
5. otherwise (benchmarks in tools/bench/, scripts) a subprocess, as they measure one.
In process, what only a process has (``pid``, ``process``, ``send_signal``,
``vm_hwm_kib``) raises ``NeedsSubprocess``: mark that test.

As subprocesses today: test_e2e_foundation.py and test_cold_start.py (marked modules);
test_supervision_e2e.py and test_tools_mcp_exit.py (``spawn_sidecar_under``: signals,
parent death, exit deadlines); test_bundle_smoke.py and the stray-output test (their own
``command``); the SIGKILL-then-restart tests (marked one by one: chat, replies, knowledge
bases, citations, sync, forwarded turns, the tool loop); the nesting tests near Python's
recursion limit in test_wire_bounds_e2e.py (the stack the server runs on is the
process's); the tests that give the sidecar environment variables (the OS keychain, the
ACP environment allow-list) or a key fd; the IM channel tests of connections, access and
routes (test_channels_telegram_e2e, test_channels_discord_slack_e2e, test_channels_access_e2e,
test_channels_routes_e2e: the host's own mode, a SIGKILL-then-restart, a remote agent killed
mid-turn); and tests/security/. Everything else runs in process.

Sound under pytest-xdist (``python3 dev.py test`` runs 2 workers): every server of a test
binds port 0 on loopback, data dirs are ``tmp_path`` (per worker), the shared scripted
providers (tests/scripted_server.py) are per process, and no test writes into the work
tree.

What must stay true, both ways: every wait is bounded (``timeout`` seconds, default 10);
output is always drained (the sidecar never blocks on a full pipe); the sidecar is
killed (in process: its task cancelled) when the ``async with`` block exits, whatever
happened in it; every stdout line is recorded raw in ``lines`` in arrival order; and when
the block exits without an exception, every line the sidecar sent is checked against
``protocol/generated/schema.json`` (tests/wire_contract.py) and a line outside the
contract fails the test, naming the line and the schema path.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

import sidecar_inprocess
from sidecar_inprocess import InProcessServer, NeedsSubprocess, in_process_config, in_process_env
from wire_contract import check_wire_contract

if TYPE_CHECKING:
    from sidecar.config import Config
    from sidecar.rpc.framing import SendStream

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT = 10.0
STDERR_KEEP = 256 * 1024
SUBPROCESS_ENV = "CHAT_SIDECAR_TEST_SUBPROCESS"
"""Set to 1: every ``spawn_sidecar`` starts a subprocess."""
DEFAULT_ENV = {
    "CHAT_SIDECAR_LOG_LEVEL": "INFO",
    "CHAT_SIDECAR_KEYCHAIN": "off",  # never the developer's own keychain
}
"""Set unless the environment or the test's ``env`` says otherwise."""

_in_process_default = False
"""Rule 4 above: tests/conftest.py sets it for each test (``set_in_process_default``)."""


def set_in_process_default(in_process: bool) -> None:
    global _in_process_default
    _in_process_default = in_process


class CallError(Exception):
    """The sidecar answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None, request_id: Any = None) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message
        self.data = data
        self.request_id = request_id


def jsonrpc_problem(msg: Any) -> str | None:
    """Why ``msg`` (a parsed stdout line) is not a valid JSON-RPC 2.0 message; None if it is.

    A line may be a response, a notification, a request (server -> client), or a batch
    (non-empty array) of responses.
    """
    if isinstance(msg, list):
        if not msg:
            return "empty batch"
        for item in msg:
            problem = jsonrpc_problem(item)
            if problem:
                return f"batch item: {problem}"
            if "method" in item:
                return "batch reply contains a request/notification"
        return None
    if not isinstance(msg, dict):
        return f"not an object: {type(msg).__name__}"
    if msg.get("jsonrpc") != "2.0":
        return f"jsonrpc is {msg.get('jsonrpc')!r}"
    if "method" in msg:
        if not isinstance(msg["method"], str):
            return "method is not a string"
        if "params" in msg and not isinstance(msg["params"], (dict, list)):
            return "params is not structured"
        if "id" in msg and not _valid_id(msg["id"]):
            return f"bad id {msg['id']!r}"
        extra = set(msg) - {"jsonrpc", "method", "params", "id"}
        return f"unexpected keys {sorted(extra)}" if extra else None
    if "id" not in msg:
        return "response without id"
    if not (_valid_id(msg["id"]) or msg["id"] is None):
        return f"bad id {msg['id']!r}"
    if ("result" in msg) == ("error" in msg):
        return "response must have exactly one of result/error"
    if "error" in msg:
        err = msg["error"]
        if not isinstance(err, dict):
            return "error is not an object"
        if not isinstance(err.get("code"), int) or isinstance(err.get("code"), bool):
            return "error.code is not an integer"
        if not isinstance(err.get("message"), str):
            return "error.message is not a string"
        extra = set(err) - {"code", "message", "data"}
        if extra:
            return f"unexpected error keys {sorted(extra)}"
    extra = set(msg) - {"jsonrpc", "id", "result", "error"}
    return f"unexpected keys {sorted(extra)}" if extra else None


def _valid_id(value: Any) -> bool:
    # JSON-RPC 2.0: a String or a Number (fractions are discouraged but allowed)
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def sidecar_command(data_dir: str | os.PathLike[str], *args: str) -> list[str]:
    return [sys.executable, "-m", "sidecar", "--data-dir", str(data_dir), *args]


class SidecarProcess:
    """A running sidecar, in process or a subprocess. Create it with ``spawn_sidecar``."""

    def __init__(
        self,
        stdin: SendStream,
        stdout: anyio.abc.ObjectReceiveStream[bytes] | anyio.abc.ByteReceiveStream,
        *,
        process: anyio.abc.Process | None = None,
        server: InProcessServer | None = None,
    ) -> None:
        self.stdin = stdin
        """Our end of the sidecar's stdin."""
        self.in_process = process is None
        self._process = process
        self._server = server
        self._stdout = stdout
        self.lines: list[bytes] = []
        """Every stdout line (without the newline), in arrival order."""
        self.messages: list[Any] = []
        """Every stdout line parsed with json (a line that is not JSON is recorded as _NotJson)."""
        self.sent = bytearray()
        """Every byte written to the sidecar's stdin, in order (its lines are the requests)."""
        self.stderr = bytearray()
        """The last STDERR_KEEP bytes of the sidecar's stderr (its log lines)."""
        self._next_id = 1
        self._changed = anyio.Event()
        self._stdout_closed = False
        self._cursors: dict[str, int] = {}

    # ---- sending ------------------------------------------------------------------

    async def send_line(self, line: bytes | str) -> None:
        """Write raw bytes as one line (a newline is added when missing)."""
        data = line.encode() if isinstance(line, str) else line
        if not data.endswith(b"\n"):
            data += b"\n"
        self.sent += data
        await self.stdin.send(data)

    async def send(self, message: Any) -> None:
        """Encode ``message`` (dicts, lists, msgspec Structs) as one compact JSON line."""
        await self.send_line(msgspec.json.encode(message))

    def new_id(self) -> int:
        request_id = self._next_id
        self._next_id += 1
        return request_id

    async def request(self, method: str, params: Any = None, *, request_id: Any = None) -> Any:
        """Send a request without waiting; returns its id (for ``response``)."""
        request_id = self.new_id() if request_id is None else request_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return request_id

    async def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)

    async def call(
        self,
        method: str,
        params: Any = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        result_type: Any = None,
    ) -> Any:
        """Request and wait for the answer: the result (decoded into ``result_type`` if
        given, else plain JSON values) or CallError with ``.code``."""
        request_id = await self.request(method, params)
        reply = await self.response(request_id, timeout=timeout)
        if "error" in reply:
            err = reply["error"]
            raise CallError(err.get("code"), err.get("message"), err.get("data"), request_id)
        if result_type is not None:
            return msgspec.convert(reply["result"], result_type)
        return reply["result"]

    # ---- receiving ----------------------------------------------------------------

    async def wait_for(
        self, predicate: Callable[[Any], bool], *, timeout: float = DEFAULT_TIMEOUT, start: int = 0
    ) -> tuple[int, Any]:
        """The first parsed stdout message at index >= ``start`` matching ``predicate``,
        with its index. Raises TimeoutError, or EOFError if stdout closed first."""
        with anyio.fail_after(timeout):
            index = start
            while True:
                while index < len(self.messages):
                    message = self.messages[index]
                    if not isinstance(message, _NotJson) and predicate(message):
                        return index, message
                    index += 1
                if self._stdout_closed:
                    raise EOFError(f"sidecar stdout closed; stderr tail:\n{self.stderr_text()[-4000:]}")
                await self._changed.wait()

    async def wait_stderr(self, text: str, *, count: int = 1, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Until ``text`` occurs ``count`` times in the stderr kept so far (log lines of the
        sidecar and, drained into them, of its children). Raises TimeoutError."""
        with anyio.fail_after(timeout):
            while self.stderr_text().count(text) < count:
                await self._changed.wait()

    async def response(self, request_id: Any, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """The (non-batch) response whose id is ``request_id``."""
        _, message = await self.wait_for(
            lambda m: isinstance(m, dict) and "method" not in m and m.get("id") == request_id
            and type(m.get("id")) is type(request_id),
            timeout=timeout,
        )
        return message

    async def next_matching(
        self, key: str, predicate: Callable[[Any], bool], *, timeout: float = DEFAULT_TIMEOUT
    ) -> Any:
        """The next message matching ``predicate`` after the last one returned for ``key``
        (each key is an independent cursor, so callers consume streams in order)."""
        index, message = await self.wait_for(predicate, timeout=timeout, start=self._cursors.get(key, 0))
        self._cursors[key] = index + 1
        return message

    async def next_notification(self, method: str, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """Params of the next notification ``method`` not returned before."""
        message = await self.next_matching(
            f"notification:{method}",
            lambda m: isinstance(m, dict) and m.get("method") == method and "id" not in m,
            timeout=timeout,
        )
        return message.get("params")

    async def next_null_id_reply(self, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """The next error reply with ``id: null`` (parse errors, invalid requests, oversized lines)."""
        return await self.next_matching(
            "null-id",
            lambda m: isinstance(m, dict) and "method" not in m and "id" in m and m["id"] is None,
            timeout=timeout,
        )

    async def next_batch_reply(self, timeout: float = DEFAULT_TIMEOUT) -> list[Any]:
        """The next array (batch) reply."""
        return await self.next_matching("batch", lambda m: isinstance(m, list), timeout=timeout)

    def notifications(self, method: str) -> list[Any]:
        """Params of every notification ``method`` received so far."""
        return [
            m.get("params") for m in self.messages
            if isinstance(m, dict) and m.get("method") == method and "id" not in m
        ]

    def assert_all_jsonrpc(self) -> None:
        """Every stdout line so far is one valid JSON-RPC 2.0 message (or batch of responses)."""
        for line, message in zip(self.lines, self.messages, strict=True):
            if isinstance(message, _NotJson):
                raise AssertionError(f"stdout line is not JSON: {line[:200]!r}")
            problem = jsonrpc_problem(message)
            if problem:
                raise AssertionError(f"stdout line is not JSON-RPC 2.0 ({problem}): {line[:200]!r}")

    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def assert_no_traceback(self) -> None:
        """Nothing the sidecar logged was a traceback (its context shown when one was)."""
        stderr = self.stderr_text()
        start = stderr.find("Traceback")
        assert start < 0, stderr[max(0, start - 800): start + 4000]

    # ---- lifecycle ----------------------------------------------------------------

    @property
    def process(self) -> anyio.abc.Process:
        """The subprocess (subprocess mode only)."""
        if self._process is None:
            raise NeedsSubprocess("proc.process")
        return self._process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once it has ended. In process: 0 when the server returned, 1 when
        it failed (the traceback is in ``stderr``), -9 when it was cancelled (killed)."""
        if self._server is not None:
            return self._server.returncode
        return self.process.returncode

    async def close_stdin(self) -> None:
        await self.stdin.aclose()

    def send_signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    async def wait_exit(self, timeout: float = DEFAULT_TIMEOUT) -> int:
        with anyio.fail_after(timeout):
            if self._server is not None:
                return await self._server.wait()
            return await self.process.wait()

    async def close(self, *, timeout: float = DEFAULT_TIMEOUT, expect_code: int = 0) -> None:
        """``sidecar:shutdown`` (answered ``{success: true}``), then the process exits with
        ``expect_code``; stdout is fully read before returning."""
        result = await self.call("sidecar:shutdown", timeout=timeout)
        assert result == {"success": True}, result
        await self.close_stdin()
        await self.assert_exit(expect_code, timeout=timeout)

    async def assert_exit(self, expect_code: int = 0, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        code = await self.wait_exit(timeout)
        with anyio.fail_after(timeout):
            while not self._stdout_closed:
                await self._changed.wait()
        assert code == expect_code, f"exit code {code}, expected {expect_code}; stderr:\n{self.stderr_text()[-4000:]}"

    def vm_hwm_kib(self) -> int | None:
        """Peak resident set size of the child (Linux /proc), or None elsewhere."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        for row in status.splitlines():
            if row.startswith("VmHWM:"):
                return int(row.split()[1])
        return None

    # ---- internals ----------------------------------------------------------------

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _read_stdout(self) -> None:
        buffer = bytearray()
        try:
            async for chunk in self._stdout:
                buffer += chunk
                if b"\n" not in chunk:
                    continue
                *complete, rest = buffer.split(b"\n")
                buffer = bytearray(rest)
                for line in complete:
                    self._record(bytes(line))
                self._wake()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            if buffer:
                self._record(bytes(buffer))  # a final line without newline is still recorded
            self._stdout_closed = True
            self._wake()

    def _record(self, line: bytes) -> None:
        self.lines.append(line)
        try:
            self.messages.append(json.loads(line))
        except ValueError:
            self.messages.append(_NotJson(line))

    def _add_stderr(self, chunk: bytes) -> None:
        """Keep ``chunk`` (on the event loop's thread)."""
        self.stderr += chunk
        if len(self.stderr) > STDERR_KEEP:
            del self.stderr[: len(self.stderr) - STDERR_KEEP]
        self._wake()

    async def _read_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        try:
            async for chunk in stream:
                self._add_stderr(chunk)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


class _NotJson:
    """Marker for a stdout line that did not parse as JSON."""

    def __init__(self, line: bytes) -> None:
        self.line = line

    def __repr__(self) -> str:
        return f"_NotJson({self.line[:80]!r})"


@asynccontextmanager
async def spawn_sidecar(
    data_dir: str | os.PathLike[str],
    *args: str,
    env: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
    waiting: bytes = b"",
    subprocess: bool | None = None,
) -> AsyncIterator[SidecarProcess]:
    """Start the sidecar with ``--data-dir DATA_DIR ARGS...`` and yield a SidecarProcess.

    ``env`` entries are added to the current environment. ``command``: the command line
    of a subprocess instead of ``python -m sidecar``. ``waiting``: bytes already in the
    child's stdin when it starts (as when a host writes its first requests right after
    the spawn). ``subprocess``: True/False chooses the mode; None: the rules of the module
    docstring. On exit the sidecar is killed if it is still running (tests that expect a
    clean exit call ``close()`` or ``assert_exit()`` inside the block); then, if the block
    raised nothing, its output is checked against the wire contract.
    """
    full_env = dict(os.environ)
    for key, value in DEFAULT_ENV.items():
        full_env.setdefault(key, value)
    if env:
        full_env.update(env)
    config = None
    if not _wants_subprocess(subprocess, env, command, waiting):
        config = in_process_config(data_dir, args, full_env)
    opened: Any
    if config is not None:
        opened = run_in_process(config)
    else:
        cmd = list(command) if command is not None else sidecar_command(data_dir, *args)
        opened = _run_subprocess(cmd, full_env, waiting)
    async with opened as proc:
        yield proc
    check_wire_contract(proc)


def _wants_subprocess(
    chosen: bool | None, env: Mapping[str, str] | None, command: Sequence[str] | None, waiting: bytes
) -> bool:
    if chosen is not None:
        return chosen
    if command is not None or waiting or not in_process_env(env or {}):
        return True
    return os.environ.get(SUBPROCESS_ENV, "") not in ("", "0") or not _in_process_default


@asynccontextmanager
async def _run_subprocess(cmd: list[str], env: dict[str, str], waiting: bytes) -> AsyncIterator[SidecarProcess]:
    stdin: SendStream | None = None
    if waiting:
        read_end, write_end = os.pipe()
        os.write(write_end, waiting)  # smaller than a pipe's buffer
        try:
            process = await anyio.open_process(cmd, env=env, cwd=ROOT, stdin=read_end)
        finally:
            os.close(read_end)
        from sidecar.rpc.stdio import FdSendStream

        stdin = FdSendStream(write_end)
    else:
        process = await anyio.open_process(cmd, env=env, cwd=ROOT)
    assert process.stdout is not None
    proc_stdin = stdin if stdin is not None else process.stdin
    assert proc_stdin is not None
    proc = SidecarProcess(proc_stdin, process.stdout, process=process)
    proc.sent += waiting
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(proc._read_stdout)
            tg.start_soon(proc._read_stderr)
            try:
                yield proc
            finally:
                with anyio.CancelScope(shield=True):
                    if process.returncode is None:
                        try:
                            process.kill()
                        except ProcessLookupError:
                            pass
                    with anyio.move_on_after(DEFAULT_TIMEOUT):
                        await process.wait()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if stdin is not None:
                await stdin.aclose()
            await process.aclose()


@asynccontextmanager
async def run_in_process(config: Config) -> AsyncIterator[SidecarProcess]:
    if sidecar_inprocess.busy():
        raise NeedsSubprocess("a second sidecar while one runs in process")
    (stdin, stdout), (server_receive, server_send) = InProcessServer.streams()
    proc: SidecarProcess
    server = InProcessServer(config, lambda data: proc._add_stderr(data))
    proc = SidecarProcess(stdin, stdout, server=server)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(proc._read_stdout)
            tg.start_soon(server.run, server_receive, server_send)
            try:
                yield proc
            finally:
                with anyio.CancelScope(shield=True):
                    server.kill()
                    await server.wait()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for stream in (stdin, stdout, server_receive, server_send):
                await stream.aclose()


__all__ = [
    "CallError",
    "NeedsSubprocess",
    "SidecarProcess",
    "jsonrpc_problem",
    "set_in_process_default",
    "sidecar_command",
    "spawn_sidecar",
]
