"""Citations of assistant replies: the table ``message_citations`` (migration ``m_citations``).

Owns:
- the rows of a reply's citations: one per marker, with the chunk's snapshot (document id and
  name, heading path, offsets, page, score, mode, text as it was sent), or a ``dangling``
  marker the reply used that points at no sent chunk; written by the reply's driver in the
  transaction of its row (``Citations.save`` as a lifecycle StoreWrite) and replaced whole
  each time;
- reading them onto messages (``CitationRows.attach``: MessageRepo.get/query/tree, export), with
  the state of the cited document computed at read time: ``documentDeleted`` when the
  document (or its base) is gone, ``documentChanged`` when the document is still there but
  the cited chunk is not (re-indexed without that text in that section: a chunk id covers
  its heading path and text, sidecar/store/kb_records.py) or carries another heading
  path, and the document's text no longer holds the cited text at the cited offsets in a
  chunk of the cited section or of a section around it (a document cut into other chunks,
  its text unchanged, keeps its citations: their offsets still point at what was cited);
  while the chunk is there, ``start``, ``end`` and
  ``page`` are the chunk's current ones (text inserted before it moves it), the rest is
  the snapshot;
- the bounds of a snapshot (``clip_heading``; the text: MAX_CITATION_TEXT_CHARS);
- copies: fork (the copied messages keep their citations) and import (validated first,
  ``check_import``).

Must stay true: a citation never refers to knowledge rows by foreign key, so deleting or
re-indexing a document or a base never touches a citation (its snapshot stays readable);
citations go with their message (ON DELETE CASCADE); reading a message without citations
costs one indexed probe of its session.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import apsw
import msgspec

from protocol.types import MAX_CITATIONS, MAX_CITATION_TEXT_CHARS, Citation, MessageV2
from sidecar.errors import InvalidParams
from sidecar.store.db import Database

__all__ = ["Citations", "CitationRows", "check_import", "clip_heading", "MAX_HEADING_CHARS", "MAX_HEADING_LEVELS"]

_heading = msgspec.json.Decoder(list[str])
_paths = msgspec.json.Decoder(list[list[str]])
_encode = msgspec.json.encode
_MODES = ("hybrid", "lexical")

MAX_HEADING_CHARS = 1000
MAX_HEADING_LEVELS = 64


def clip_heading(heading: Sequence[str]) -> list[str]:
    """A chunk's heading path as a citation keeps it."""
    return [h[:MAX_HEADING_CHARS] for h in heading[:MAX_HEADING_LEVELS]]


_SELECT = (
    "SELECT c.message_id, c.marker, c.chunk_id, c.kb_id, c.document_id, c.document_name, c.heading,"
    " c.char_start, c.char_end, c.page, c.score, c.mode, c.text, c.dangling,"
    " d.id IS NOT NULL, k.heading, k.char_start, k.char_end, k.page,"
    # only for a citation whose chunk is gone, while the document still holds its text there:
    # the heading paths of the chunks around those offsets now
    " CASE WHEN k.id IS NULL AND length(c.text) > 0"
    " AND substr(d.body, c.char_start + 1, length(c.text)) = c.text"
    " THEN (SELECT json_group_array(json(o.heading)) FROM kb_chunks o WHERE o.document_id = c.document_id"
    " AND o.char_start <= c.char_start AND o.char_end >= c.char_end) END"
    " FROM message_citations c"
    " LEFT JOIN kb_documents d ON d.id = c.document_id"
    " LEFT JOIN kb_chunks k ON k.id = c.chunk_id AND k.document_id = c.document_id"
)


def _citation(row: tuple[Any, ...]) -> Citation:
    (message_id, marker, chunk_id, kb_id, document_id, document_name, heading, start, end, page, score, mode,
     text, dangling, document_there, chunk_heading, chunk_start, chunk_end, chunk_page, around) = row
    cited_heading = _heading.decode(heading) if heading else []
    deleted = document_id is not None and not document_there
    # the same id names the same heading path and text: it only differs for ids an older
    # version made (text only), whose chunk may now be another section's
    resolved = chunk_heading is not None and clip_heading(_heading.decode(chunk_heading)) == cited_heading
    if resolved:
        start, end, page = chunk_start, chunk_end, chunk_page
    elif around:
        # the document cut into other chunks (another chunk size or chunking rule), the cited
        # text where it was, in a chunk of its section or of one around it (merged sections
        # share their parent's path): its offsets still point at it
        resolved = any(
            cited_heading[: len(path)] == path for path in (clip_heading(h) for h in _paths.decode(around))
        )
    return Citation(
        message_id=message_id, marker=marker, chunk_id=chunk_id, kb_id=kb_id, document_id=document_id,
        document_name=document_name, heading=cited_heading, start=start, end=end,
        page=page, score=score, mode=mode if mode in _MODES else "lexical", text=text,
        document_deleted=deleted, document_changed=bool(document_id is not None and document_there and not resolved),
        dangling=bool(dangling),
    )


class CitationRows:
    """Table helpers on a connection (inside the caller's transaction)."""

    @staticmethod
    def replace(conn: apsw.Connection, message_id: str, session_id: str, citations: Sequence[Citation]) -> None:
        conn.execute("DELETE FROM message_citations WHERE message_id = ?", (message_id,))
        CitationRows.insert(conn, message_id, session_id, citations)

    @staticmethod
    def insert(conn: apsw.Connection, message_id: str, session_id: str, citations: Iterable[Citation]) -> None:
        conn.executemany(
            "INSERT OR REPLACE INTO message_citations(message_id, marker, session_id, chunk_id, kb_id, document_id,"
            " document_name, heading, char_start, char_end, page, score, mode, text, dangling)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (message_id, c.marker, session_id, c.chunk_id, c.kb_id, c.document_id, c.document_name,
                 _encode(c.heading).decode(), c.start, c.end, c.page, float(c.score), c.mode, c.text,
                 1 if c.dangling else 0)
                for c in citations
            ],
        )

    @staticmethod
    def of_session(conn: apsw.Connection, session_id: str) -> dict[str, list[Citation]]:
        """Every citation of a session's messages, by message id, in marker order."""
        out: dict[str, list[Citation]] = {}
        for row in conn.execute(
            _SELECT + " WHERE c.session_id = ? ORDER BY c.message_id, c.marker", (session_id,)
        ):
            out.setdefault(row[0], []).append(_citation(row))
        return out

    @staticmethod
    def of_message(conn: apsw.Connection, message_id: str) -> list[Citation]:
        return [
            _citation(row)
            for row in conn.execute(_SELECT + " WHERE c.message_id = ? ORDER BY c.marker", (message_id,))
        ]

    @staticmethod
    def attach(conn: apsw.Connection, messages: list[MessageV2]) -> list[MessageV2]:
        """``messages`` (of one or more sessions) with their stored citations."""
        sessions = {m.session_id for m in messages if m.role == "assistant"}
        if not sessions:
            return messages
        found: dict[str, list[Citation]] = {}
        for session_id in sessions:
            found.update(CitationRows.of_session(conn, session_id))
        if not found:
            return messages
        return [
            msgspec.structs.replace(m, citations=found[m.id]) if m.id in found else m
            for m in messages
        ]

    @staticmethod
    def copy(conn: apsw.Connection, id_map: dict[str, str], session_id: str, source_session_id: str) -> None:
        """The citations of copied messages (fork): ``id_map`` old -> new message id."""
        found = CitationRows.of_session(conn, source_session_id)
        for old, new in id_map.items():
            if old in found:
                CitationRows.insert(conn, new, session_id, found[old])


def check_import(messages: Sequence[MessageV2]) -> None:
    """The citations of an import, checked before anything is written (InvalidParams naming
    the field): only on assistant messages, at most MAX_CITATIONS each, markers unique, a
    non-dangling citation names its chunk and document, snapshot texts bounded."""
    for i, m in enumerate(messages):
        if not m.citations:
            continue
        where = f"messages[{i}].citations"
        if m.role != "assistant":
            raise InvalidParams(f"{where}: only assistant messages have citations")
        if len(m.citations) > MAX_CITATIONS:
            raise InvalidParams(f"{where}: at most {MAX_CITATIONS} citations per message")
        markers: set[int] = set()
        for j, c in enumerate(m.citations):
            at = f"{where}[{j}]"
            if not isinstance(c, Citation):
                raise InvalidParams(f"{at} must be a Citation object")
            if isinstance(c.marker, bool) or not isinstance(c.marker, int) or not 1 <= c.marker <= MAX_CITATIONS:
                raise InvalidParams(f"{at}.marker must be 1..{MAX_CITATIONS}")
            if c.marker in markers:
                raise InvalidParams(f"{at}.marker {c.marker} appears twice")
            markers.add(c.marker)
            if c.message_id is not None and c.message_id != m.id:
                raise InvalidParams(f"{at}.messageId {c.message_id!r} is not the message's id {m.id!r}")
            if c.mode not in _MODES:
                raise InvalidParams(f"{at}.mode must be hybrid or lexical")
            if not c.dangling and not (c.chunk_id and c.document_id):
                raise InvalidParams(f"{at}: a citation that is not dangling names its chunkId and documentId")
            if len(c.text) > MAX_CITATION_TEXT_CHARS:
                raise InvalidParams(f"{at}.text is longer than {MAX_CITATION_TEXT_CHARS} characters")
            if not isinstance(c.score, (int, float)) or c.score != c.score:
                raise InvalidParams(f"{at}.score must be a number")


class Citations:
    """The ``Store.citations`` repository: one transaction per call (or the caller's)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def save(self, message_id: str, session_id: str, citations: Sequence[Citation]) -> None:
        """Replace a reply's citations (the lifecycle calls it inside the row's transaction)."""
        with self._db.write() as conn:
            CitationRows.replace(conn, message_id, session_id, citations)

    def of_message(self, message_id: str) -> list[Citation]:
        with self._db.read() as conn:
            return CitationRows.of_message(conn, message_id)
