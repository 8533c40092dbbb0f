from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sidecar_proc
import wire_contract

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
