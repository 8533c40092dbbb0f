"""The one confinement rule (sidecar/confine.py), on a real directory tree."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sidecar.confine import PathRefused, inside, open_nofollow, resolve_in


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("inside")
    (tmp_path / "outside.txt").write_text("secret")
    os.symlink(tmp_path / "outside.txt", root / "out-link")
    os.symlink(tmp_path, root / "dir-link")
    os.symlink(root / "sub", root / "in-link")
    (tmp_path / "rootx").mkdir()  # a sibling whose name starts like the root
    return root


def test_relative_paths_resolve_inside_and_follow_inner_links(tree: Path) -> None:
    assert resolve_in(tree, "sub/f.txt", relative=True) == (tree / "sub" / "f.txt").resolve()
    assert resolve_in(tree, "in-link/f.txt", relative=True) == (tree / "sub" / "f.txt").resolve()
    assert resolve_in(tree, "", relative=True) == tree.resolve()
    assert resolve_in(tree, "sub/new.txt", relative=True) == (tree / "sub" / "new.txt").resolve()


@pytest.mark.parametrize(
    "path, why",
    [
        ("/etc/passwd", "absolute"),
        ("C:\\Windows", "absolute"),
        ("\\\\server\\share", "absolute"),
        ("sub/../sub/f.txt", "'..'"),
        ("out-link", "leads outside"),
        ("dir-link/outside.txt", "leads outside"),
        ("a\x00b", "NUL"),
        ("x" * 5000, "too long"),
        ("d/" + "y" * 300, "longer than 255"),
    ],
)
def test_a_model_path_that_breaks_the_rule_is_refused(tree: Path, path: str, why: str) -> None:
    with pytest.raises(PathRefused) as err:
        resolve_in(tree, path, relative=True, what="the workspace")
    assert why in str(err.value)


def test_absolute_paths_are_accepted_only_inside(tree: Path) -> None:
    assert resolve_in(tree, str(tree / "sub" / "f.txt"), relative=False) == (tree / "sub" / "f.txt").resolve()
    for bad in (str(tree.parent / "outside.txt"), f"{tree}/../outside.txt", str(tree / "out-link"), str(tree) + "x/f"):
        with pytest.raises(PathRefused, match="leads outside"):
            resolve_in(tree, bad, relative=False)
    with pytest.raises(PathRefused, match="must be a string"):
        resolve_in(tree, 42, relative=False)


def test_inside_is_the_containment_check_alone(tree: Path) -> None:
    assert inside(tree, tree / "sub" / "f.txt") == (tree / "sub" / "f.txt").resolve()
    assert inside(tree, tree / "out-link") is None
    assert inside(tree, tree.parent / "rootx" / "f") is None


def test_open_nofollow_never_goes_through_a_symlink_or_blocks_on_a_fifo(tree: Path) -> None:
    with pytest.raises(OSError) as err:
        open_nofollow(tree / "out-link")
    assert err.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        open_nofollow(tree / "out-link", write=True)
    assert (tree.parent / "outside.txt").read_text() == "secret"
    os.mkfifo(tree / "fifo")
    os.close(open_nofollow(tree / "fifo"))  # returns at once: no writer needed
    fd = open_nofollow(tree / "sub" / "new.txt", write=True)
    os.write(fd, b"a")
    os.close(fd)
    fd = open_nofollow(tree / "sub" / "new.txt", write=True, append=True)
    os.write(fd, b"b")
    os.close(fd)
    assert (tree / "sub" / "new.txt").read_text() == "ab"
