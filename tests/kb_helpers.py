"""Shared steps of the knowledge-base tests: the loopback embeddings server, a provider on
it, documents (a PDF with real pages), and waiting for indexing to end."""

from __future__ import annotations

import sys
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2

from fixtures.documents.make_pdf import pdf_file
from sidecar_proc import SidecarProcess

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "fixtures" / "embedding_server.py"
DIMS = 16


def concept(i: int, dims: int = DIMS) -> list[float]:
    """A unit vector along axis ``i`` (a "concept" rules can share)."""
    return [1.0 if j == i else 0.0 for j in range(dims)]


class EmbeddingServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.root = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.root}/v1"

    async def config(self, **fields: Any) -> None:
        async with httpx2.AsyncClient() as client:
            (await client.post(f"{self.root}/_config", json=fields)).raise_for_status()

    async def stats(self) -> dict[str, Any]:
        async with httpx2.AsyncClient() as client:
            r = await client.get(f"{self.root}/_stats")
            r.raise_for_status()
            return r.json()

    async def requests(self) -> list[dict[str, Any]]:
        async with httpx2.AsyncClient() as client:
            r = await client.get(f"{self.root}/_requests")
            r.raise_for_status()
            return r.json()


@asynccontextmanager
async def embedding_server() -> AsyncIterator[EmbeddingServer]:
    process = await anyio.open_process([sys.executable, str(SERVER), "--port", "0"])
    try:
        assert process.stdout is not None
        with anyio.fail_after(10):
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(64)
        yield EmbeddingServer(int(line.split()[1]))
    finally:
        with anyio.CancelScope(shield=True):
            process.kill()
            with anyio.move_on_after(5):
                await process.wait()
            await process.aclose()


async def embedding_provider(proc: SidecarProcess, server: EmbeddingServer, *, kind: str = "openai-compat",
                             name: str = "Embeddings") -> dict[str, Any]:
    base = server.base_url if kind == "openai-compat" else server.root
    return await proc.call("provider:upsert", {
        "name": name, "type": kind, "baseUrl": base, "apiKey": "sk-embed-SECRET",
        "models": [{"id": "embed-1", "contextWindow": 8192}, {"id": "embed-2"}],
    })


async def wait_indexed(proc: SidecarProcess, doc_id: str, timeout: float = 30) -> dict[str, Any]:
    """The document once it is no longer pending/indexing (bounded polling of kb:document:get)."""
    with anyio.fail_after(timeout):
        while True:
            detail = await proc.call("kb:document:get", {"id": doc_id})
            if detail["document"]["status"] not in ("pending", "indexing"):
                return detail["document"]
            await anyio.sleep(0.05)


async def progress_end(proc: SidecarProcess, token: str, timeout: float = 30) -> list[dict[str, Any]]:
    """Every sidecar:progress of ``token`` up to its ``end`` (which has done == total)."""
    _, last = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "sidecar:progress"
        and m["params"]["token"] == token and m["params"]["kind"] == "end",
        timeout=timeout,
    )
    assert last["params"]["done"] == last["params"]["total"], last
    return [p for p in proc.notifications("sidecar:progress") if p["token"] == token]


def pdf_bytes(pages: list[list[str]]) -> bytes:
    """A PDF with one page per entry, each with a text layer of those lines (stdlib only)."""
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b""]
    kids = []
    font = 3 + 2 * len(pages)
    for number, lines in enumerate(pages):
        page_obj, content_obj = 3 + 2 * number, 4 + 2 * number
        kids.append(f"{page_obj} 0 R".encode())
        text = "BT /F1 12 Tf 72 720 Td " + " 0 -16 Td ".join(f"({line}) Tj" for line in lines) + " ET"
        stream = text.encode("latin-1")
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R"
            b" /Resources << /Font << /F1 %d 0 R >> >> >>" % (content_obj, font)
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects[1] = b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % len(pages)
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    return pdf_file(objects)


def pdf_bomb(pages: int, megabytes: float) -> bytes:
    """A small PDF whose ``pages`` pages all show one Flate stream that inflates to
    ``megabytes`` MB of text: its text is hundreds of times its size."""
    unit = b"Lorem ipsum dolor sit amet consectetur "
    shown = b"BT /F1 12 Tf 72 720 Td (" + unit * int(megabytes * 1e6 / len(unit)) + b") Tj ET"
    stream = zlib.compress(shown, 9)
    kids = b" ".join(b"%d 0 R" % (6 + i) for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages,
        b"<< >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
                b" /Resources << /Font << /F1 5 0 R >> >> >>"] * pages
    return pdf_file(objects)


def fill_base(repo: Any, kb_id: str, texts: list[str], first: int = 0) -> None:
    """Index each of ``texts`` as a text document of the base (no vectors), through the
    product's write path (KnowledgeRepo.write_index); numbered from ``first``."""
    from sidecar.retrieval.chunking import chunk_document

    for n, text in enumerate(texts, first):
        doc, _ = repo.add_document(kb_id=kb_id, name=f"{n}.txt", kind="text", source="text", path=None,
                                   size_bytes=len(text), content_hash=f"{kb_id}{n}", body=text)
        claimed = repo.claim(doc.id)
        assert claimed is not None
        repo.write_index(claimed, body=text, pages=None, kind="text",
                         chunks=chunk_document(doc.id, "text", text, None, size=64, overlap=0), model=None, dims=None)
