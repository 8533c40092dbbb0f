"""Whatever path, line and limit an agent sends to ``fs/read_text_file`` or
``fs/write_text_file``, the answer is the file's text, a write inside the working
directory, or a SidecarError (a JSON-RPC error for the agent): never another exception,
and nothing outside the directory is read or written.

Paths are drawn relative, absolute inside and outside the root, with ``..``, NUL, a
symlink out, a directory, very long; line and limit are any integer or none.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.acp.fs import read_text_file, write_text_file
from sidecar.errors import SidecarError


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fs")
    work = base / "work"
    (work / "d").mkdir(parents=True)
    (work / "a.txt").write_text("one\ntwo\nthree\n")
    (base / "outside.txt").write_text("secret\n")
    os.symlink(base / "outside.txt", work / "link")
    return work


def paths(root: Path) -> st.SearchStrategy[str]:
    inside = str(root)
    return st.one_of(
        st.text(max_size=30),
        st.text(max_size=30).map(lambda t: f"{inside}/{t}"),
        st.text(max_size=20).map(lambda t: f"{inside}/d/{t}"),
        st.sampled_from([
            "a.txt", f"{inside}/a.txt", f"{inside}/d", f"{inside}/link", f"{inside}/../outside.txt", f"{inside}/d/../../outside.txt",
            f"{inside}/a.txt\x00b", inside, "", ".", "..", "/etc/passwd", f"{inside}/" + "a" * 5000, f"{inside}/a.txt/",
        ]),
    )


counts = st.one_of(st.none(), st.integers(), st.sampled_from([0, -1, 1, 2**63, 10**30]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), line=counts, limit=counts, write=st.booleans(), content=st.text(max_size=20))
def test_any_fs_request_is_an_answer_or_a_typed_error_and_stays_inside(
    root: Path, data: st.DataObject, line: int | None, limit: int | None, write: bool, content: str
) -> None:
    path = data.draw(paths(root))

    async def request() -> None:
        try:
            if write:
                await write_text_file(str(root), path, content)
            else:
                text = await read_text_file(str(root), path, line, limit)
                assert isinstance(text, str) and "secret" not in text
        except SidecarError:
            pass

    anyio.run(request)
    assert (root.parent / "outside.txt").read_text() == "secret\n"
    assert sorted(p.name for p in root.parent.iterdir()) == ["outside.txt", "work"]
