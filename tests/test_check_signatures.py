"""tools/check_signatures.py: it finds every native binary of a folder by its first bytes
(not its name) and fails, naming them, when the verifier refuses any."""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_signatures", ROOT / "tools" / "check_signatures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def folder(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    (root / "_internal" / "pkg").mkdir(parents=True)
    (root / "chat-sidecar").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 32)
    (root / "_internal" / "pkg" / "bad.so").write_bytes(b"\xcf\xfa\xed\xfe" + b"\0" * 32)
    (root / "_internal" / "thing.pyd").write_bytes(b"MZ\x90\x00" + b"\0" * 32)
    (root / "_internal" / "module.pyc").write_bytes(b"\xa7\r\r\n" + b"\0" * 12)
    (root / "_internal" / "named.so.txt").write_text("not a binary, whatever its name", encoding="utf-8")
    os.symlink("pkg/bad.so", root / "_internal" / "link.so")
    return root


def test_lists_each_native_binary_once_by_its_magic(check: ModuleType, tmp_path: Path) -> None:
    root = folder(tmp_path)
    found = {path.relative_to(root).as_posix(): kind for path, kind in check.binaries([root])}
    assert found == {"chat-sidecar": "ELF", "_internal/pkg/bad.so": "Mach-O", "_internal/thing.pyd": "PE"}


def test_fails_naming_each_binary_the_verifier_refuses(check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = folder(tmp_path)
    script = "import sys; sys.exit(1 if sys.argv[1].endswith('bad.so') else 0)"
    verifier = f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} {{}}"
    assert check.main([str(root), "--verifier", verifier]) == 1
    out = capsys.readouterr()
    assert "UNSIGNED" in out.err and "bad.so" in out.err and "thing.pyd" not in out.err
    assert "1 of 3 binaries are not signed" in out.out
    everything = f"{shlex.quote(sys.executable)} -c pass {{}}"
    assert check.main([str(root), "--verifier", everything]) == 0
    assert "all 3 binaries are signed" in capsys.readouterr().out


def test_lists_the_binaries_of_a_built_bundle(check: ModuleType) -> None:
    given = os.environ.get("CHAT_SIDECAR_BUNDLE")
    if not given:
        pytest.skip("no bundle to list: set CHAT_SIDECAR_BUNDLE (.ci/run does)")
    bundle = (ROOT / given).resolve()
    names = {path.name for path, _ in check.binaries([bundle])}
    launcher = "chat-sidecar.exe" if os.name == "nt" else "chat-sidecar"
    assert launcher in names
    assert any(name.startswith(("libpython", "python3")) for name in names), sorted(names)
