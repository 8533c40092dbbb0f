"""No Python module of the project (the sidecar, its protocol, tools, tests, fixtures and
examples) is over 650 lines.

A module has one job; one that outgrows the limit is split by responsibility (a package
whose modules each own a part), never trimmed to fit. The count is the module's lines as
an editor shows them.
"""

from __future__ import annotations

from pathlib import Path

LIMIT = 650
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sidecar", "protocol", "tools", "tests", "fixtures", "examples")


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
                  if "node_modules" not in path.parts)


def test_no_module_is_over_the_limit() -> None:
    modules = _modules()
    assert len(modules) > 100, f"found only {len(modules)} modules under {PACKAGES}: is ROOT {ROOT} right?"
    over = {}
    for path in modules:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > LIMIT:
            over[str(path.relative_to(ROOT))] = lines
    assert not over, f"modules over {LIMIT} lines (split them by responsibility): " + ", ".join(
        f"{name} ({lines})" for name, lines in sorted(over.items(), key=lambda item: -item[1])
    )
