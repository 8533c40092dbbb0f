"""The generated parts of docs/ (tools/gen_docs.py: docs/methods.md, the command-line table of
docs/configuration.md) match the code, and every method and notification of the contract is
described on its page (so a new method cannot go undocumented)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from protocol import METHODS, NOTIFICATIONS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "tools" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_pages_are_current(gen_docs: ModuleType) -> None:
    stale = [str(path.relative_to(ROOT)) for path in gen_docs.stale()]
    assert stale == [], f"{stale} are stale: run `python3 dev.py gen`"
    assert gen_docs.main(["--check"]) == 0


def test_every_method_and_notification_is_listed_with_its_page(gen_docs: ModuleType) -> None:
    page = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    for name in [*METHODS, *NOTIFICATIONS]:
        row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        assert row.endswith(f"({gen_docs.area(name)}) |"), row


def test_every_method_and_notification_is_described_on_its_page(gen_docs: ModuleType) -> None:
    assert gen_docs.undocumented() == []


def test_a_name_without_a_page_or_description_is_reported(gen_docs: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="no docs/ page for 'nothing:here'"):
        gen_docs.area("nothing:here")
    monkeypatch.setitem(gen_docs.AREAS, "chat:send", "acp.md")
    assert gen_docs.undocumented() == ["chat:send (docs/acp.md)"]
