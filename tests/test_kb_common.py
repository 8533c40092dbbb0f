"""Lines most documents of a base repeat (sidecar/store/kb_common.py) are left out of its index
and of what is embedded, never out of the stored text that citations point into."""

from __future__ import annotations

from pathlib import Path

from kb_helpers import fill_base
from sidecar.retrieval.chunking import chunk_document
from sidecar.store import Store

HEADER = "Acme Widget Help"
FOOTER = "Copyright Acme Corporation, all rights reserved."
TOPICS = ["pumps", "valves", "gauges", "filters", "hoses", "clamps", "seals", "motors"]


def _page(topic: str, extra: str = "") -> str:
    return f"{HEADER}\n\nHow to fit the {topic} of the widget.{extra}\n\n{FOOTER}\n"


def test_lines_repeated_across_a_base_do_not_match_and_citations_keep_them(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.knowledge
        kb = repo.create_kb(name="kb", description="", embed=None, chunk_size=64, chunk_overlap=0)
        pages = [_page(t, " The lighthouse keeper wrote it." if t == "valves" else "") for t in TOPICS]
        fill_base(repo, kb.id, pages[:4])
        assert repo.lexical([kb.id], "Acme Corporation", 10)  # four documents: not common yet
        fill_base(repo, kb.id, pages[4:], first=4)  # the fifth makes both lines common: the first four rewritten too
        for query in ("Acme Corporation", "help", "Acme Help", "rights reserved"):
            assert repo.lexical([kb.id], query, 10) == [], query
        found = repo.lexical([kb.id], "lighthouse keeper", 10)  # a line of one document only
        assert len(found) == 1
        hit = repo.hits([found[0][0]])[found[0][0]]
        assert "valves" in hit.text and HEADER in hit.text  # the stored text keeps the header
        assert len(repo.lexical([kb.id], "widget", 10)) == len(TOPICS)  # a word of each page's own line
        for doc in repo.list_documents(kb.id, None, 50, 0):
            body = repo.document_body(doc.id)
            assert body is not None
            for chunk in repo.chunks(doc.id):
                assert body[chunk.start : chunk.end] == chunk.text  # offsets are the document's
        common = repo.common_lines(kb.id)
        assert len(common) == 2
        chunk = chunk_document("d", "markdown", pages[0], None, size=64, overlap=0, common=common)[0]
        assert HEADER in chunk.text and HEADER not in chunk.embed_text and FOOTER not in chunk.embed_text
        assert "pumps" in chunk.embed_text

        # documents deleted until fewer than five hold the lines: they are indexed again
        for doc in repo.list_documents(kb.id, None, 50, 0)[:4]:
            repo.delete_document(doc.id)
        assert len(repo.lexical([kb.id], "Acme Corporation", 10)) == 4
        assert repo.common_lines(kb.id) == frozenset()
    finally:
        store.close()


def test_a_line_shared_by_fewer_than_half_of_the_documents_stays_indexed(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.knowledge
        kb = repo.create_kb(name="kb", description="", embed=None, chunk_size=64, chunk_overlap=0)
        shared = [f"Tide tables for harbor {i}\n\nSee also the harbor master." for i in range(5)]
        other = [f"Notes on topic {i}\n\nNothing in common here {i}." for i in range(7)]
        fill_base(repo, kb.id, other + shared)  # 5 of 12: at least five, but under half
        assert len(repo.lexical([kb.id], "harbor master", 20)) == 5
        assert repo.common_lines(kb.id) == frozenset()
    finally:
        store.close()


def test_the_migration_counts_the_lines_of_documents_indexed_before_it(tmp_path: Path) -> None:
    import apsw

    from sidecar.store import kb_lexical

    store = Store(tmp_path)
    try:
        repo = store.knowledge
        kb = repo.create_kb(name="kb", description="", embed=None, chunk_size=64, chunk_overlap=0)
        fill_base(repo, kb.id, [_page(t) for t in TOPICS])
    finally:
        store.close()
    # the database as version 30 left it: no kb_lines, every line in the full-text rows
    conn = apsw.Connection(str(tmp_path / "chat.db"))
    conn.execute("DROP TABLE kb_lines")
    kb_lexical.rebuild_all(conn)
    conn.execute("PRAGMA user_version = 30")
    conn.close()
    store = Store(tmp_path)
    try:
        repo = store.knowledge
        assert repo.lexical([kb.id], "Acme Corporation", 10) == []
        assert len(repo.lexical([kb.id], "widget", 10)) == len(TOPICS)
        fill_base(repo, kb.id, [_page("levers")], first=len(TOPICS))  # counted on from there
        assert repo.lexical([kb.id], "Acme Corporation", 10) == []
        assert len(repo.lexical([kb.id], "levers", 10)) == 1
    finally:
        store.close()
