"""Whatever bytes a document holds, indexing it ends with a status and a reason, never as
an internal error.

Files of every kind the sidecar reads (the HTML, CSV and PDF samples of
fixtures/documents/, a Markdown, a JSON and a code file) are mutated at the byte level:
spans replaced by other bytes (NUL, invalid UTF-8, markup, quotes, deep brackets), cut
anywhere, repeated. Each is added by path from an allowed root of the sidecar (in
process). What must hold: the document leaves ``pending``/``indexing``; an ``error`` has a
code that names the document's fault (``empty``, ``binary``, ``corrupt``...), never
``internal``; search answers; no traceback is logged. The draws are fixed
(``derandomize``): a failure replays.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutation import fixed_draws
from kb_helpers import wait_indexed
from sidecar_proc import ROOT, spawn_sidecar

pytestmark = pytest.mark.anyio

DOCUMENTS = ROOT / "fixtures" / "documents"
FILES = 12
EXAMPLES = 3
SAMPLES: dict[str, bytes] = {
    "sample.html": (DOCUMENTS / "sample.html").read_bytes(),
    "sample.csv": (DOCUMENTS / "sample.csv").read_bytes(),
    "sample.pdf": (DOCUMENTS / "sample.pdf").read_bytes(),
    "notes.md": "# Title\n\nSome *text* with `code`.\n\n## Part\n\n```python\nprint(1)\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
                .encode(),
    "data.json": b'{"name": "printer", "modes": ["duplex", "simplex"], "tray": {"size": "A4", "sheets": 250}}',
    "main.py": b"def main():\n    \"\"\"Print the tray size.\"\"\"\n    print('A4')\n\n\nclass Tray:\n    pass\n",
}
PIECES = [b"\x00", b"\xff\xfe", b"\xc3", b"<", b"</", b"<div hidden>", b'"', b"\n", b"\r\n", b",", b"[" * 300, b"{" * 300,
          b"<" * 300, b"%PDF-1.4", b"obj", b"endstream", b"stream\n", b"\xef\xbb\xbf", "漢字".encode(), b"# " * 50]


@st.composite
def mutated_files(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(SAMPLES)))
    data = bytearray(SAMPLES[name])
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["replace", "cut", "repeat", "insert"]))
        start = draw(st.integers(0, len(data)))
        end = min(len(data), start + draw(st.integers(0, 64)))
        if edit == "replace":
            data[start:end] = draw(st.sampled_from(PIECES)) or draw(st.binary(max_size=32))
        elif edit == "cut":
            del data[start:]
        elif edit == "repeat":
            data[start:start] = data[start:end] * draw(st.integers(1, 50))
        else:
            data[start:start] = draw(st.binary(min_size=1, max_size=32))
    return name, bytes(data)


@fixed_draws(EXAMPLES)
@given(files=st.lists(mutated_files(), min_size=FILES, max_size=FILES))
async def test_any_document_bytes_end_with_a_status_and_a_reason(
    tmp_path_factory: pytest.TempPathFactory, files: list[tuple[str, bytes]]
) -> None:
    data = tmp_path_factory.mktemp("data")
    root = Path(data).parent / f"{Path(data).name}-docs"
    root.mkdir()
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        await proc.call("kb:settings:update", {"allowedRoots": [str(root)]})
        kb = await proc.call("kb:create", {"name": "Docs"})
        for n, (name, content) in enumerate(files):
            path = root / f"{n}-{name}"
            path.write_bytes(content)
            added = await proc.call("kb:document:add", {"kbId": kb["id"], "path": str(path)})
            doc = await wait_indexed(proc, added["document"]["id"], timeout=60)
            assert doc["status"] in ("ready", "error"), doc
            assert doc["status"] == "ready" or (doc["errorCode"] and doc["errorCode"] != "internal"), (doc, name, content[:300])
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "printer tray"}, timeout=30)
        assert isinstance(found["hits"], list)
        await proc.close(timeout=60)
    proc.assert_no_traceback()
