from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import sidecar_proc
import wire_contract

PYCACHE = Path(tempfile.gettempdir()) / f"chat-sidecar-tests-pycache-{os.getuid() if hasattr(os, 'getuid') else 0}"
"""Where the Python processes the tests start (sidecars, scripted peers) keep their bytecode.
A machine with PYTHONDONTWRITEBYTECODE would have every ``python -m sidecar`` of the suite
compile sidecar/ and protocol/ again (about half its start-up); their bytecode goes here
instead, out of the work tree (PYTHONPYCACHEPREFIX), checked against the sources as always.
This process and its workers are already running: they only pass it on."""
if "PYTHONPYCACHEPREFIX" not in os.environ:
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

COMPILE_CACHE_ENV = "GEN_PROTOCOL_COMPILE_CACHE"
"""tools/gen_protocol.py keeps the compiled client there by a hash of its inputs: the tests
that compare the committed client.js/.d.ts with the compiler's output (also through
``gen_protocol.py --check`` in a subprocess) compile it once per run. One directory per run:
made by the first process of the run that loads this file (xdist's workers inherit it),
removed by that process at its end."""
_own_compile_cache: str | None = None
if COMPILE_CACHE_ENV not in os.environ:
    _own_compile_cache = os.environ[COMPILE_CACHE_ENV] = tempfile.mkdtemp(prefix="chat-sidecar-tsc-")

SECURITY = Path(__file__).resolve().parent / "security"
"""Every sidecar of a test under tests/security/ is a subprocess (tests/sidecar_proc.py)."""
DRIFT_PROPERTY = "known wire-contract drift"
_drifts_seen: list[tuple[str, str]] = []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _sidecar_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """How this test's ``spawn_sidecar`` runs the sidecar (see tests/sidecar_proc.py), and
    the known contract drifts its traffic showed (listed at the end of the run)."""
    marked = request.node.get_closest_marker("sidecar_subprocess") is not None
    sidecar_proc.set_in_process_default(not (marked or SECURITY in Path(request.node.path).resolve().parents))
    seen = len(wire_contract.SEEN_KNOWN)
    yield
    sidecar_proc.set_in_process_default(False)
    for known, line in wire_contract.SEEN_KNOWN[seen:]:
        text = f"{known.where} at {known.json_path} = {known.value!r}: {known.reason}\n    line: {line}"
        request.node.user_properties.append((DRIFT_PROPERTY, text))


LONG_FIRST = (
    "test_ts_client.py",
    "test_tools_mcp_exit.py",
    "test_supervision_e2e.py",
    "test_channels_routes_e2e.py",
    "test_channels_telegram_e2e.py",
    "test_channels_discord_slack_e2e.py",
    "test_channels_access_e2e.py",
    "test_cold_start.py",
    "test_e2e_foundation.py",
    "test_chat_e2e.py",
    "test_tool_loop_e2e.py",
    "test_kb_embedding_down_e2e.py",
    "test_secrets_e2e.py",
    "test_protocol_generated.py",
)
"""Files whose tests take longest (their sidecar subprocesses, tsc and Node, waits on the
platform fakes), run first; tests/security/ right behind them. xdist hands the tests out
in this order, so the run ends with short tests on both workers instead of one long test
keeping one worker busy while the other idles. Order only: every test still runs."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}

    def weight(item: pytest.Item) -> int:
        path = Path(item.path)
        if path.name in rank:
            return rank[path.name]
        return len(rank) if SECURITY in path.resolve().parents else len(rank) + 1

    items.sort(key=weight)  # stable: within a file, and among the rest, the collected order


def pytest_unconfigure(config: pytest.Config) -> None:
    if _own_compile_cache is not None:
        shutil.rmtree(_own_compile_cache, ignore_errors=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # user_properties travel with the report, also from xdist's workers
    if report.when == "teardown":
        _drifts_seen.extend((report.nodeid, value) for name, value in report.user_properties if name == DRIFT_PROPERTY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _drifts_seen:
        return
    terminalreporter.section("known wire-contract drifts (expected to fail, not fixed yet)")
    for test, text in _drifts_seen:
        terminalreporter.write_line(f"{test}: {text}")
