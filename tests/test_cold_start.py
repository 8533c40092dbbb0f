"""Cold start over the subprocess: the handshake and the first session list are answered
from the store alone; providers, pipeline, tools, ACP, MCP, jsonschema, jinja2, pypdf...
load afterwards (or when first needed), and every method still works."""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from sidecar_proc import SidecarProcess, spawn_sidecar

from protocol.errors import ErrorCode

pytestmark = [pytest.mark.anyio, pytest.mark.sidecar_subprocess]  # the cold start before the event loop, the modules a fresh process loads


async def test_the_first_answers_import_no_heavy_module(tmp_path: Path) -> None:
    # no idle warm-up during the test: only the first answers may trigger the loading
    async with spawn_sidecar(tmp_path / "data", "--bench", env={"CHAT_SIDECAR_WARMUP_MS": "600000"}) as proc:
        init_id = await proc.request("sidecar:initialize", {})
        list_id = await proc.request("chat:session:list", {})
        assert "result" in await proc.response(init_id)
        assert (await proc.response(list_id))["result"] == {"sessions": [], "total": 0}
        modules = await proc.call("sidecar:bench:modules", {})
        assert modules["atFirstAnswer"] == [], modules
        # the rest loads in the background, and a method that needs it waits for it
        assert await proc.call("provider:list", {}) == []
        with anyio.fail_after(20):
            while "sidecar.providers" not in (await proc.call("sidecar:bench:modules", {}))["now"]:
                await anyio.sleep(0.05)
        await proc.close()


async def test_an_idle_client_gets_the_services_loaded_without_asking(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data", "--bench", env={"CHAT_SIDECAR_WARMUP_MS": "50"}) as proc:
        await proc.call("sidecar:initialize", {})
        with anyio.fail_after(20):
            while "sidecar.engine.chat" not in (await proc.call("sidecar:bench:modules", {}))["now"]:
                await anyio.sleep(0.05)
        await proc.close()


async def test_shutdown_before_the_services_loaded_is_quick_and_clean(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data", "--bench", env={"CHAT_SIDECAR_WARMUP_MS": "600000"}) as proc:
        await proc.call("sidecar:initialize", {})
        assert (await proc.call("sidecar:bench:modules", {}))["now"] == []  # nothing asked for them
        await proc.call("sidecar:shutdown", {})
        await proc.close_stdin()
        assert await proc.wait_exit(timeout=10) == 0


# ---- the first answers, given before the event loop (sidecar/coldstart.py) ----------

EARLY_LOG = "answered before the event loop: "


def test_every_early_method_is_answered_by_the_handler_its_service_runs() -> None:
    import inspect

    from protocol import METHODS
    from sidecar.bindings import BINDINGS, EARLY
    from sidecar.engine import session_reads
    from sidecar.engine.sessions import SessionService

    for method, name in EARLY.items():
        assert session_reads.SPECS[method] is METHODS[method] and name in session_reads.HANDLERS
        service, _, func = BINDINGS[method].partition(".")
        assert service == "sessions", method
        assert f"reads.{name}(" in inspect.getsource(getattr(SessionService, func)), method


def _lines(*messages: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def _request(request_id: str, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def _early(proc: SidecarProcess) -> str | None:
    """What the cold start says it answered, or None."""
    for line in proc.stderr_text().splitlines():
        if EARLY_LOG in line:
            return line.split(EARLY_LOG, 1)[1].strip()
    return None


async def _data_dir_with_a_session(tmp_path: Path) -> tuple[Path, str]:
    data = tmp_path / "data"
    async with spawn_sidecar(data) as proc:
        created = await proc.call("chat:session:create", {"title": "first screen"})
        await proc.close()
    return data, created["id"]


async def test_waiting_handshake_and_list_are_answered_as_the_server_answers_them(tmp_path: Path) -> None:
    data, session_id = await _data_dir_with_a_session(tmp_path)
    waiting = _lines(_request("w1", "sidecar:initialize", {}), _request("w2", "chat:session:list", {"limit": 5}))
    env = {"CHAT_SIDECAR_WARMUP_MS": "600000"}
    async with spawn_sidecar(data, "--bench", waiting=waiting, env=env) as proc:
        early_init = (await proc.response("w1"))["result"]
        early_list = (await proc.response("w2"))["result"]
        assert [s["id"] for s in early_list["sessions"]] == [session_id]
        # the same requests, now answered by the server (the list first: the store is the App's then)
        assert early_list == await proc.call("chat:session:list", {"limit": 5})
        init = await proc.call("sidecar:initialize", {})
        assert init["secrets"]["state"] == "ready"  # settled on the store before either answer
        assert early_init == init  # the handshake's answer is the same whenever it is given
        assert _early(proc) == "sidecar:initialize, chat:session:list"
        # nothing heavy was imported for them, and a first read wants the services at once
        modules = await proc.call("sidecar:bench:modules", {})
        assert modules["atFirstAnswer"] == [], modules
        with anyio.fail_after(20):
            while "sidecar.engine.chat" not in (await proc.call("sidecar:bench:modules", {}))["now"]:
                await anyio.sleep(0.05)
        assert await proc.call("provider:list", {}) == []
        await proc.close()


async def test_a_leading_request_of_another_method_leaves_everything_to_the_server(tmp_path: Path) -> None:
    data, first = await _data_dir_with_a_session(tmp_path)
    waiting = _lines(
        _request("w1", "chat:session:create", {"title": "second"}),
        _request("w2", "sidecar:initialize", {}),
        _request("w3", "chat:session:list", {}),
    )
    async with spawn_sidecar(data, waiting=waiting) as proc:
        assert (await proc.response("w1"))["result"]["title"] == "second"
        assert "result" in await proc.response("w2")
        assert first in {s["id"] for s in (await proc.response("w3"))["result"]["sessions"]}
        await proc.close()
    assert _early(proc) is None


async def test_what_is_not_a_plain_success_stops_the_cold_start_there(tmp_path: Path) -> None:
    data, session_id = await _data_dir_with_a_session(tmp_path)
    waiting = _lines(
        _request("w1", "sidecar:initialize", {"clientInfo": {"name": "host", "version": "1"}}),
        _request("w2", "chat:session:list", {"limit": -1}),  # refused: the server says why
        _request("w3", "chat:session:list", {}),
        _request("w4", "sidecar:initialize", {"protocolVersion": 99}),
    ) + b'{"jsonrpc":"2.0","id":"w5","method":"chat:session:li'  # not whole yet
    async with spawn_sidecar(data, waiting=waiting) as proc:
        assert "result" in await proc.response("w1")
        assert (await proc.response("w2"))["error"]["code"] == ErrorCode.INVALID_PARAMS
        assert [s["id"] for s in (await proc.response("w3"))["result"]["sessions"]] == [session_id]
        refused = (await proc.response("w4"))["error"]
        assert refused["code"] == ErrorCode.BAD_STATE and refused["data"] == {"expected": 1, "got": 99}
        await proc.send_line(b'st","params":{}}')
        assert [s["id"] for s in (await proc.response("w5"))["result"]["sessions"]] == [session_id]
        await proc.close()
    assert _early(proc) == "sidecar:initialize"


async def test_a_store_that_needs_its_schema_is_opened_by_the_app(tmp_path: Path) -> None:
    data = tmp_path / "fresh"  # no database yet: its migrations run in the event loop
    waiting = _lines(_request("w1", "sidecar:initialize", {}), _request("w2", "chat:session:list", {}))
    async with spawn_sidecar(data, waiting=waiting) as proc:
        info = (await proc.response("w1"))["result"]
        assert info["dataDir"] == str(data) and data.is_dir()  # it exists when it is named
        assert (await proc.response("w2"))["result"] == {"sessions": [], "total": 0}
        await proc.close()
    assert _early(proc) is None  # the handshake reports the secrets: it waits for the App's store


async def test_a_handshake_with_a_secret_key_settles_it_on_the_store_first(tmp_path: Path) -> None:
    data, _ = await _data_dir_with_a_session(tmp_path)
    key = base64.b64encode(b"K" * 32).decode()
    async with spawn_sidecar(data) as proc:  # a secret sealed with the sidecar's own key
        await proc.call("provider:upsert", {"name": "p", "type": "openai-compat",
                                            "baseUrl": "http://127.0.0.1:9/v1", "apiKey": "sk-SEALED"})
        await proc.close()
    waiting = _lines(_request("w1", "sidecar:initialize", {"secretKey": key}), _request("w2", "chat:session:list", {}))
    async with spawn_sidecar(data, waiting=waiting) as proc:
        secrets = (await proc.response("w1"))["result"]["secrets"]
        assert secrets == {"state": "ready", "source": "host", "locked": 0}  # re-sealed with it
        assert (await proc.response("w2"))["result"]["total"] == 1
        assert (await proc.call("sidecar:initialize", {"secretKey": key}))["secrets"] == secrets
        assert [p["hasApiKey"] for p in await proc.call("provider:list", {})] == [True]
        await proc.close()
    assert _early(proc) == "sidecar:initialize, chat:session:list"
    # the next start with the same key: nothing locked; without it: the host's values are locked
    async with spawn_sidecar(data, waiting=waiting) as proc:
        assert (await proc.response("w1"))["result"]["secrets"]["locked"] == 0
        await proc.close()
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        assert [p["secretsLocked"] for p in await proc.call("provider:list", {})] == [True]
        await proc.close()


async def test_a_secret_key_that_does_not_parse_is_refused_by_the_server(tmp_path: Path) -> None:
    data, _ = await _data_dir_with_a_session(tmp_path)
    waiting = _lines(_request("w1", "sidecar:initialize", {"secretKey": "not a key"}),
                     _request("w2", "chat:session:list", {}))
    async with spawn_sidecar(data, waiting=waiting) as proc:
        error = (await proc.response("w1"))["error"]
        assert error["code"] == ErrorCode.INVALID_PARAMS and "secretKey" in error["message"]
        assert (await proc.response("w2"))["result"]["total"] == 1
        await proc.close()
    assert _early(proc) is None


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_right_after_an_early_answer_is_a_clean_exit(tmp_path: Path, sig: signal.Signals) -> None:
    data, _ = await _data_dir_with_a_session(tmp_path)
    waiting = _lines(_request("w1", "sidecar:initialize", {}), _request("w2", "chat:session:list", {}))
    async with spawn_sidecar(data, waiting=waiting) as proc:
        await proc.response("w2")
        proc.send_signal(sig)  # the server's own handlers may not be in place yet
        await proc.assert_exit(0)
    assert "stopping" in proc.stderr_text()
    assert _early(proc) == "sidecar:initialize, chat:session:list"


LIGHT_PATH = ("pathlib", "hashlib", "dataclasses", "logging", "anyio.abc._streams")
"""What the handshake's early answer does without (each a millisecond or more of it): only
a sealed value's key id needs hashlib, only a keychain lookup needs pathlib, only a record
needs logging (sidecar/logging_setup.py), and only the event loop's streams need anyio's
stream ABCs."""

_ANSWER_ONE = """
import json, os, sys
from sidecar.coldstart import EarlySignals, answer_waiting
from sidecar.config import build_config
from sidecar.logging_setup import defer_setup
from sidecar.rpc.stdio import FdReceiveStream, FdSendStream
defer_setup("WARNING")  # as the process does
line, data_dir = sys.argv[1].encode(), sys.argv[2]
r, w = os.pipe()
os.write(w, line)
os.close(w)
out = os.open(os.devnull, os.O_WRONLY)
loaded = []
class Send(FdSendStream):
    def write_now(self, item):
        loaded.extend(m for m in json.loads(sys.argv[3]) if m in sys.modules and m not in loaded)
        super().write_now(item)
cold = answer_waiting(build_config({"data_dir": data_dir, "keychain": False}), FdReceiveStream(r),
                      Send(out), EarlySignals())
print(json.dumps({"answered": cold.answered, "loaded": sorted(loaded)}))
"""
"""Which of LIGHT_PATH were loaded when the answer was written (what comes after, such as the
log line naming the early answers, is not on its way)."""


async def test_the_early_handshake_stays_light(tmp_path: Path) -> None:
    data, _ = await _data_dir_with_a_session(tmp_path)
    line = _lines(_request("1", "sidecar:initialize", {})).decode()
    # untraced: coverage's start-up hook (COVERAGE_PROCESS_START) would import them itself
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_PROCESS_")}
    got = await anyio.run_process(
        [sys.executable, "-c", _ANSWER_ONE, line, str(data), json.dumps(LIGHT_PATH)],
        cwd=Path(__file__).resolve().parents[1], env=env,
    )
    assert json.loads(got.stdout) == {"answered": ["sidecar:initialize"], "loaded": []}
