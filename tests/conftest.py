from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sidecar_proc
import wire_contract

SECURITY = Path(__file__).resolve().parent / "security"
"""Every sidecar of a test under tests/security/ is a subprocess (tests/sidecar_proc.py)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _sidecar_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """How this test's ``spawn_sidecar`` runs the sidecar (see tests/sidecar_proc.py), and
    which test the wire-contract check reports."""
    marked = request.node.get_closest_marker("sidecar_subprocess") is not None
    sidecar_proc.mark_subprocess(marked or SECURITY in Path(request.node.path).resolve().parents)
    wire_contract.set_current_test(request.node.nodeid)
    yield
    sidecar_proc.mark_subprocess(False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not wire_contract.SEEN_KNOWN:
        return
    terminalreporter.section("known wire-contract drifts (expected to fail, not fixed yet)")
    for test, known, line in wire_contract.SEEN_KNOWN:
        terminalreporter.write_line(f"{test}: {known.where} at {known.json_path} = {known.value!r}: {known.reason}")
        terminalreporter.write_line(f"    line: {line}")
