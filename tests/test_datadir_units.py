"""sidecar.datadir.make_dirs on its own: the directories it creates (the path and each
missing parent) are 0700 whatever the umask, what exists is left as it is, and the spellings
a data dir comes in (relative, with "..", a trailing separator, through a symlink) end in
the same directory os.makedirs would make."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.datadir import DIR_MODE, make_dirs

pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX modes")


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_path_and_every_missing_parent_are_made_private(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    make_dirs(target)
    assert target.is_dir()
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [DIR_MODE] * 3


def test_what_exists_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "wide").mkdir(mode=0o755)
    os.chmod(tmp_path / "wide", 0o755)
    make_dirs(tmp_path / "wide")
    make_dirs(str(tmp_path / "wide" / "new"))
    assert mode(tmp_path / "wide") == 0o755
    assert mode(tmp_path / "wide" / "new") == DIR_MODE


def test_other_spellings_of_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_dirs("rel/one/")
    make_dirs("x/../y/z")
    make_dirs("dot/.")
    assert (tmp_path / "rel" / "one").is_dir() and mode(tmp_path / "rel" / "one") == DIR_MODE
    assert (tmp_path / "x").is_dir() and (tmp_path / "y" / "z").is_dir()
    assert (tmp_path / "dot").is_dir() and mode(tmp_path / "dot") == DIR_MODE
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    make_dirs(tmp_path / "link" / "inside")
    assert (tmp_path / "real" / "inside").is_dir()


def test_a_file_in_the_way_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        make_dirs(tmp_path / "file")
    with pytest.raises(OSError):
        make_dirs(tmp_path / "file" / "below")
    assert (tmp_path / "file").read_text() == "x"
