"""Citations in-process: the marker check of a finished reply (forms normalized, code and
links untouched, numbers out of range ignored), the ledger's cap and restore, the citation
rows with the cited document's state computed at read (deleted, changed, moved), and the
import checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.sessions import CreateSessionOptions
from protocol.types import MAX_CITATIONS, Citation
from sidecar.errors import InvalidParams
from sidecar.retrieval.chunking import chunk_document
from sidecar.retrieval.citations import CitationLedger, citation_of
from sidecar.retrieval.markers import normalize
from sidecar.retrieval.results import RetrievedChunk
from sidecar.store import Store
from sidecar.store.citations import check_import
from sidecar.store.knowledge import ChunkHit


def test_marker_forms_are_normalized_and_code_and_links_are_not() -> None:
    scan = normalize("A [3, 5] b [3,5] c 【3】 d [3][5] e [1、2] f ［4］ g [6 ; 7] h [2, 2]")
    assert scan.text == "A [3][5] b [3][5] c [3] d [3][5] e [1][2] f [4] g [6][7] h [2]"
    assert scan.numbers == [3, 5, 1, 2, 4, 6, 7]
    text = "x `[1, 2]` y [1](http://a) z\n[2]: http://b\n```py\nl = [1, 2]\n```\n[2024] [0] [^1] ok"
    untouched = normalize(text)
    assert untouched.text == text and untouched.numbers == []
    unclosed = normalize("see [1, 2]\n```\n[3, 4]")  # an unclosed fence runs to the end
    assert unclosed.text == "see [1][2]\n```\n[3, 4]" and unclosed.numbers == [1, 2]


def _hit(i: int, text: str = "t", heading: list[str] | None = None) -> RetrievedChunk:
    chunk = ChunkHit(rowid=i, id=f"d:{i}", kb_id="k", document_id="d", document_name="n" * 5000, ordinal=i,
                     heading=heading or [], start=0, end=len(text), page=None, tokens=1, text=text)
    return RetrievedChunk(chunk=chunk, score=0.5, mode="hybrid")


def test_the_ledger_keeps_to_the_wire_bounds() -> None:
    record = citation_of(1, _hit(1, "x" * 200_000, ["h" * 5000] * 100))
    # what a reply stores must come back through an import's decoding: clipped to the bounds
    import msgspec

    again = msgspec.json.decode(msgspec.json.encode(record), type=Citation)
    assert len(again.text) == 100_000 and len(again.heading) == 64 and len(again.heading[0]) == 1000
    assert len(again.document_name or "") == 1000
    ledger = CitationLedger()
    cited = ledger.cite([_hit(i) for i in range(MAX_CITATIONS + 5)])
    assert len(cited) == MAX_CITATIONS and max(c.marker for c in cited) == MAX_CITATIONS
    assert ledger.cite([_hit(5000)]) == []  # no marker left: not shown
    restored = CitationLedger([*ledger.records[:3], Citation(marker=9, dangling=True)])
    assert [c.marker for c in restored.cite([_hit(2), _hit(7000)])] == [3, 4]  # dangling ones are no sources


def _reply_with(store: Store, citations: list[Citation]) -> tuple[str, str]:
    sid = store.sessions.create(CreateSessionOptions(title="s")).id
    user = store.messages.append(sid, role="user", text_content="q")
    reply = store.messages.append(sid, role="assistant", parent_id=user.id, text_content="a [1][2]")
    store.citations.save(reply.id, sid, citations)
    return sid, reply.id


def test_citation_state_is_computed_when_read(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.knowledge
        kb = repo.create_kb(name="k", description="", embed=None, chunk_size=64, chunk_overlap=0)
        first, second = ("First paragraph about lanterns. " * 8).strip(), ("Second paragraph about water. " * 8).strip()
        text = f"{first}\n\n{second}"
        doc, _ = repo.add_document(kb_id=kb.id, name="a.md", kind="markdown", source="text", path=None,
                                   size_bytes=len(text), content_hash="h1", body=text)
        claimed = repo.claim(doc.id)
        assert claimed is not None
        chunks = chunk_document(doc.id, "markdown", text, None, size=64, overlap=0)
        assert len(chunks) == 2
        repo.write_index(claimed, body=text, pages=None, kind="markdown", chunks=chunks, model=None, dims=None)
        hits = repo.hits([h.rowid for h in repo.hits(list(range(1, 10))).values()])
        cited = [citation_of(i + 1, RetrievedChunk(chunk=h, score=1.0, mode="lexical"))
                 for i, h in enumerate(sorted(hits.values(), key=lambda h: h.ordinal))]
        sid, mid = _reply_with(store, [*cited, Citation(marker=3, dangling=True)])
        got = store.messages.get(mid).citations
        assert got is not None and [c.marker for c in got] == [1, 2, 3]
        assert not any(c.document_deleted or c.document_changed for c in got) and got[2].dangling
        assert got[0].text == cited[0].text and got[0].message_id == mid
        # the document re-indexed: the first chunk's text stays, the second changes
        changed = f"{first}\n\n{second.replace('water', 'oil')}"
        claimed = repo.request_reindex(doc.id)
        claimed = repo.claim(doc.id)
        assert claimed is not None
        repo.write_index(claimed, body=changed, pages=None, kind="markdown", model=None, dims=None,
                         chunks=chunk_document(doc.id, "markdown", changed, None, size=64, overlap=0))
        got = store.messages.query(sid)[-1].citations
        assert got is not None and [c.document_changed for c in got] == [False, True, False]
        # moved: the same text in the same section at other offsets is the same chunk, where it is now
        moved = ("An introduction that is a chunk of its own. " * 6).strip() + "\n\n" + changed
        moved_chunks = chunk_document(doc.id, "markdown", moved, None, size=64, overlap=0)
        assert any(c.id == cited[0].chunk_id and c.start != cited[0].start for c in moved_chunks)  # same text, moved
        claimed = repo.request_reindex(doc.id)
        claimed = repo.claim(doc.id)
        assert claimed is not None
        repo.write_index(claimed, body=moved, pages=None, kind="markdown", model=None, dims=None,
                         chunks=chunk_document(doc.id, "markdown", moved, None, size=64, overlap=0))
        got = store.messages.get(mid).citations or []
        assert [c.document_changed for c in got] == [False, True, False]
        now = next(c for c in moved_chunks if c.id == cited[0].chunk_id)
        assert (got[0].start, got[0].end) == (now.start, now.end) != (cited[0].start, cited[0].end)
        assert (got[1].start, got[1].end) == (cited[1].start, cited[1].end)  # gone: the snapshot
        repo.delete_kb(kb.id)
        got = store.messages.get(mid).citations
        assert got is not None and [c.document_deleted for c in got] == [True, True, False]
        assert got[1].text == cited[1].text  # the snapshot is still there
        store.messages.delete_branch(mid)
        assert store.citations.of_message(mid) == []  # citations go with their message
    finally:
        store.close()


def test_import_checks_citations() -> None:
    from protocol.types import MessageV2

    good = Citation(marker=1, chunk_id="d:1", document_id="d", text="t")

    def reply(*citations: Citation, role: str = "assistant") -> list[MessageV2]:
        return [MessageV2(id="m", session_id="s", role=role, created_at=1, updated_at=1,  # type: ignore[arg-type]
                          citations=list(citations))]

    check_import(reply(good, Citation(marker=2, dangling=True)))
    for bad in (
        reply(good, good),
        reply(good, role="user"),
        reply(Citation(marker=1, text="no chunk")),
        reply(Citation(marker=0, chunk_id="d:1", document_id="d")),
        reply(Citation(marker=1, chunk_id="d:1", document_id="d", message_id="other")),
        reply(Citation(marker=1, chunk_id="d:1", document_id="d", mode="psychic")),  # type: ignore[arg-type]
        reply(*[Citation(marker=i, dangling=True) for i in range(1, MAX_CITATIONS + 2)]),
    ):
        with pytest.raises(InvalidParams):
            check_import(bad)


def test_citations_stay_resolvable_when_a_base_is_cut_into_other_chunks(tmp_path: Path) -> None:
    # a document indexed in small chunks, each cited; then cut again in chunks of another
    # size (the small sections merged): no citation is "changed", each still points at its text
    store = Store(tmp_path)
    try:
        repo = store.knowledge
        kb = repo.create_kb(name="k", description="", embed=None, chunk_size=64, chunk_overlap=0)
        text = "# Guide\n\n" + "".join(
            f"## Step {i}\n\n" + " ".join([f"Turn the valve number {i} a quarter."] * (2 + i % 5)) + "\n\n"
            for i in range(12)
        )
        doc, _ = repo.add_document(kb_id=kb.id, name="g.md", kind="markdown", source="text", path=None,
                                   size_bytes=len(text), content_hash="g", body=text)

        def index(size: int) -> list[str]:
            claimed = repo.claim(doc.id)
            assert claimed is not None
            chunks = chunk_document(doc.id, "markdown", text, None, size=size, overlap=0)
            repo.write_index(claimed, body=text, pages=None, kind="markdown", chunks=chunks, model=None, dims=None)
            return [c.id for c in chunks]

        small = index(64)
        hits = repo.hits([h.rowid for h in repo.hits(list(range(1, 100))).values()])
        cited = [citation_of(i + 1, RetrievedChunk(chunk=h, score=1.0, mode="lexical"))
                 for i, h in enumerate(sorted(hits.values(), key=lambda h: h.ordinal))]
        assert len(cited) == len(small) > 6
        _, mid = _reply_with(store, cited)
        repo.request_reindex(doc.id)
        large = index(512)
        assert len(large) < len(small) / 2 and not set(large) & set(small)  # other chunks, other ids
        got = store.messages.get(mid).citations or []
        assert len(got) == len(cited) and not any(c.document_changed or c.document_deleted for c in got)
        for c, before in zip(got, cited):
            assert c.start is not None and c.end is not None and text[c.start : c.end] == before.text == c.text
        # the text under a citation edited: that one is changed, the others are not
        edited = text.replace("valve number 3 a", "knobs number 3 a")  # same length: nothing moves
        repo.request_reindex(doc.id)
        claimed = repo.claim(doc.id)
        assert claimed is not None
        repo.write_index(claimed, body=edited, pages=None, kind="markdown", model=None, dims=None,
                         chunks=chunk_document(doc.id, "markdown", edited, None, size=512, overlap=0))
        got = store.messages.get(mid).citations or []
        assert [c.document_changed for c in got] == ["valve number 3 a" in c.text for c in cited]
    finally:
        store.close()
