"""The layers hold, and the contracts that state them change only with a recorded reason.

``lint-imports`` (import-linter, pyproject.toml ``[tool.importlinter]``) checks the import
graph of sidecar/ and protocol/ against the contracts. The contracts themselves are pinned:
tests/import_contracts.lock ends with the sha256 of the ``[tool.importlinter]`` table and
the reason it last changed (``<sha256>  <reason>``, one line per change, newest last). A
change to the contracts that does not append such a line fails here, so loosening a layer
is a reviewed decision with its reason in the diff, never a silent edit. Whatever the note,
no contract may carry exceptions (``ignore_imports``) or leave out the imports made for
type checking.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "tests" / "import_contracts.lock"


def _contracts() -> dict[str, Any]:
    table: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return table


def contracts_digest(table: dict[str, Any]) -> str:
    """The sha256 of the table as data (key order and TOML layout do not matter)."""
    return hashlib.sha256(json.dumps(table, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _lock_entries() -> list[tuple[str, str]]:
    entries = []
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        digest, _, reason = line.partition("  ")
        entries.append((digest.strip(), reason.strip()))
    return entries


def test_the_layers_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run(
        [str(lint), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_a_change_to_the_contracts_is_recorded_with_its_reason() -> None:
    entries = _lock_entries()
    assert entries, f"{LOCK.name} records no contracts"
    for digest, reason in entries:
        assert len(digest) == 64 and all(c in "0123456789abcdef" for c in digest), f"not a sha256: {digest!r}"
        assert len(reason.split()) >= 3, f"{LOCK.name}: the change {digest[:12]} needs a reason line"
    current = contracts_digest(_contracts())
    assert entries[-1][0] == current, (
        "pyproject.toml [tool.importlinter] changed without a note: append the line\n"
        f"{current}  <why the contracts changed>\nto {LOCK.relative_to(ROOT)}"
    )


def test_no_contract_has_exceptions() -> None:
    table = _contracts()
    assert not table.get("exclude_type_checking_imports", False), "imports for type checking are imports too"
    contracts = table["contracts"]
    for contract in contracts:
        assert not contract.get("ignore_imports"), f"{contract['id']} has ignore_imports"
    layers = next(c for c in contracts if c["id"] == "layers")
    assert layers["exhaustive"] is True and layers["containers"] == ["sidecar"]
    assert {c["type"] for c in contracts} >= {"layers", "forbidden", "acyclic_siblings"}
    protocol = next(c for c in contracts if c["id"] == "protocol-alone")
    assert protocol["source_modules"] == ["protocol"] and protocol["forbidden_modules"] == ["sidecar"]


NAME_WIDTH = 72
"""lint-imports reports ``<name> KEPT`` / ``<name> BROKEN`` in 80 columns and wraps what is
longer: a wrapped name leaves its tail alone on a line beside the status, which reads as a
contract of its own."""


def test_every_contract_name_fits_on_one_report_line() -> None:
    long = [c["name"] for c in _contracts()["contracts"] if len(c["name"]) > NAME_WIDTH]
    assert not long, f"contract names over {NAME_WIDTH} characters (the rest goes in a comment): {long}"
