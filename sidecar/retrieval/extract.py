"""Document text for a knowledge base: what kind a document is and its plain text.

Owns ``detect_kind`` (from the name, the MIME-less content sniff for PDFs) and
``extract(kind, data)`` -> Extracted (the text chunk offsets refer to, and for PDFs the
offset where each page starts). Kinds:
- text, code, CSV: the decoded text as it is; JSON: the text, pretty-printed when it is
  minified (one huge line chunks badly), so the stored text is the pretty one;
- Markdown: as it is (the chunker reads its headings and code fences);
- HTML: the visible text through selectolax (the lexbor HTML5 parser: a maintained,
  spec-conformant parser; the stdlib ``html.parser`` is not HTML5 and mis-nests real
  pages), written as Markdown: ``h1``-``h6`` become ``#`` headings, ``pre`` a fenced code
  block, list items ``- ``, table cells ``|``; scripts, styles, navigation and forms are
  dropped, and so are hidden elements: the ``hidden`` attribute, ``aria-hidden="true"``,
  an inline ``display: none`` or ``visibility: hidden``, and the classes and ids the page's
  own ``<style>`` hides that way in a rule of the top level (one class or id per selector;
  rules inside ``@media`` and other at-rules are not read: a print-only rule hides nothing
  on screen); so are permalink anchors, a link to a place in the same page whose text is
  a sign or two and no word (Sphinx's and MkDocs' ``¶``, ``#``, ``§``, a zero-width space):
  without them a heading reads as its author wrote it;
- PDF: pypdf, page by page, pages separated by a blank line (their start offsets kept).
  Its text is bounded (``pdf_text_limit``: 8 characters per byte of the file, at least
  4 Mi and at most 64 Mi characters): a PDF's streams are compressed, and pages may share
  one, so a 92 KB file can hold 400 pages of 10 MB of text each; past the bound the
  document ends ``too_large`` at once, without reading further pages.

Must stay true: every failure is a DocumentError with a DocumentErrorCode (``empty``,
``binary``, ``corrupt``, ``encrypted``, ``no_text``, ``too_large``) and a message for the user, never
another exception; nothing here touches the file system or the network (the caller reads
the bytes, bounded by the size limit).
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import re
import unicodedata
from pathlib import PurePath

import msgspec

from sidecar import parts
from sidecar.errors import SidecarError

__all__ = ["Extracted", "DocumentError", "detect_kind", "extract", "extract_text", "decode_text", "check_text", "KINDS"]

log = logging.getLogger(__name__)

KINDS = ("text", "markdown", "code", "json", "csv", "html", "pdf")
_SUFFIX_KIND = {
    ".md": "markdown", ".markdown": "markdown", ".mdx": "markdown",
    ".html": "html", ".htm": "html", ".xhtml": "html",
    ".pdf": "pdf",
    ".json": "json", ".jsonl": "json", ".ndjson": "json",
    ".csv": "csv", ".tsv": "csv",
    ".txt": "text", ".text": "text", ".rst": "text", ".log": "text", ".adoc": "text", ".org": "text",
}
_CODE_SUFFIXES = {
    ".py", ".js", ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".java", ".kt", ".kts", ".c", ".h", ".cc",
    ".cpp", ".hpp", ".cs", ".go", ".rs", ".rb", ".php", ".swift", ".sh", ".bash", ".zsh", ".ps1",
    ".sql", ".r", ".lua", ".pl", ".scala", ".dart", ".vue", ".svelte", ".css", ".scss", ".less",
    ".xml", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".gradle", ".m", ".mm", ".ex", ".exs",
    ".erl", ".hs", ".ml", ".clj", ".jl", ".zig", ".nim", ".proto", ".graphql", ".tf", ".dockerfile",
}
_CONTROL_SHARE = 0.005
"""More control characters (or U+FFFD) than this share of the text: binary, not text."""


class Extracted(msgspec.Struct, kw_only=True):
    kind: str
    text: str
    pages: list[int] | None = None
    """PDFs: start offset of each page in ``text`` (page n starts at pages[n-1])."""


class DocumentError(SidecarError):
    """A document that cannot be indexed; ``reason`` is its DocumentErrorCode."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def detect_kind(name: str, head: bytes = b"") -> str:
    """The kind of a document from its name (suffix), or its first bytes for a PDF."""
    if head.startswith(b"%PDF-"):
        return "pdf"
    path = PurePath(name.lower())
    suffix = path.suffix
    if suffix in _SUFFIX_KIND:
        return _SUFFIX_KIND[suffix]
    if suffix in _CODE_SUFFIXES or path.name in ("dockerfile", "makefile"):
        return "code"
    stripped = head.lstrip()[:64].lower()
    if stripped.startswith((b"<!doctype html", b"<html")):
        return "html"
    return "text"


def _control_count(text: str) -> int:
    allowed = "\t\n\r\f\v"
    return sum(1 for ch in text if (ch < " " and ch not in allowed) or ch == "\x7f" or ch == "\ufffd")


def check_text(text: str, what: str = "the document") -> str:
    """``text`` if it is text (DocumentError ``binary`` for NULs or too many control
    characters, ``empty`` for nothing but whitespace)."""
    if "\x00" in text:
        raise DocumentError("binary", f"{what} is not text (it contains NUL characters)")
    sample = text if len(text) <= 1_000_000 else text[:500_000] + text[-500_000:]
    if sample and _control_count(sample) > max(2, len(sample) * _CONTROL_SHARE):
        raise DocumentError("binary", f"{what} is not text (too many control or undecodable characters)")
    if not text.strip():
        raise DocumentError("empty", f"{what} is empty")
    return text


def decode_text(data: bytes, what: str = "the document") -> str:
    """Bytes as text: UTF-8 (BOM optional) or UTF-16 with a BOM; legacy Chinese files
    (GB18030) when they are not UTF-8; DocumentError ``binary`` otherwise."""
    if not data:
        raise DocumentError("empty", f"{what} is empty (0 bytes)")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return check_text(data.decode("utf-16"), what)
        except UnicodeDecodeError:
            raise DocumentError("binary", f"{what} is not valid UTF-16 text") from None
    if b"\x00" in data[:65536]:
        raise DocumentError("binary", f"{what} is not text (it contains NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        try:
            text = data.decode("gb18030")
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
    return check_text(text, what)


def extract(kind: str, data: bytes, what: str = "the document") -> Extracted:
    """The text of a document of ``kind`` (see the module docstring)."""
    if not data:
        raise DocumentError("empty", f"{what} is empty (0 bytes)")
    if kind == "pdf":
        return _pdf(data, what)
    if kind == "html":
        return Extracted(kind="html", text=check_text(html_text(_decode_html(data, what)), what))
    text = decode_text(data, what)
    if kind == "json":
        text = _json_text(text)
    return Extracted(kind=kind, text=text)


def extract_text(kind: str, text: str, what: str = "the document") -> Extracted:
    """``extract`` for a document given as text (``kb:document:add {name, text}``)."""
    check_text(text, what)
    if kind == "html":
        return Extracted(kind="html", text=check_text(html_text(text), what))
    if kind == "pdf":
        raise DocumentError("corrupt", f"{what} was given as text; a PDF must be added as a file")
    if kind == "json":
        text = _json_text(text)
    return Extracted(kind=kind, text=text)



def _json_text(text: str) -> str:
    if "\n" in text.strip() or len(text) < 200:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text  # not JSON after all: chunked as text
    return json.dumps(value, ensure_ascii=False, indent=1)


# ---- PDF ----------------------------------------------------------------------------


def _pdf(data: bytes, what: str) -> Extracted:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PyPdfError
    except ImportError as exc:  # a dependency, so only a broken install
        raise DocumentError("internal", f"PDF support is missing: {exc}") from exc
    if not data.lstrip()[:1024].startswith(b"%PDF-") and b"%PDF-" not in data[:1024]:
        raise DocumentError("corrupt", f"{what} is not a PDF (no %PDF header)")
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            try:
                if not reader.decrypt(""):
                    raise DocumentError("encrypted", f"{what} is a password-protected PDF")
            except DocumentError:
                raise
            except Exception as exc:
                raise DocumentError("encrypted", f"{what} is an encrypted PDF that cannot be opened ({exc})") from None
        pages: list[int] = []
        parts: list[str] = []
        offset = 0
        limit = pdf_text_limit(len(data))
        for page in reader.pages:
            text = _clean_pdf_text(page.extract_text() or "")
            if parts:
                parts.append("\n\n")
                offset += 2
            pages.append(offset)
            parts.append(text)
            offset += len(text)
            if offset > limit:
                raise DocumentError(
                    "too_large", f"{what} holds more than {limit:,} characters of text"
                    f" ({offset:,} in its first {len(pages)} page(s) of {len(data):,} bytes)",
                )
    except DocumentError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, AssertionError,
            RecursionError, OSError, ZeroDivisionError) as exc:
        # pypdf reports broken files through many exception types
        raise DocumentError("corrupt", f"{what} is not a readable PDF ({type(exc).__name__}: {exc})") from None
    if not pages:
        raise DocumentError("corrupt", f"{what} is a PDF without pages")
    text = "".join(parts)
    if not text.strip():
        raise DocumentError("no_text", f"{what} has no text layer (a scan?): its {len(pages)} page(s) cannot be read")
    return Extracted(kind="pdf", text=text, pages=pages)


PDF_CHARS_PER_BYTE = 8
PDF_TEXT_MIN = 4 * 1024 * 1024
PDF_TEXT_MAX = 64 * 1024 * 1024


def pdf_text_limit(size: int) -> int:
    """The most characters of text a PDF of ``size`` bytes may give."""
    return min(max(PDF_CHARS_PER_BYTE * size, PDF_TEXT_MIN), PDF_TEXT_MAX)


def _clean_pdf_text(text: str) -> str:
    # pypdf keeps form feeds and NULs of some fonts; they are not text
    text = text.replace("\x00", "").replace("\x0c", "\n")
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


# ---- HTML ---------------------------------------------------------------------------

_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_\-]+)""", re.IGNORECASE)


def _decode_html(data: bytes, what: str) -> str:
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8):].decode("utf-8", errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    found = _CHARSET.search(data[:4096])
    if found:
        try:
            return data.decode(found.group(1).decode("ascii"), errors="replace")
        except LookupError:
            pass
    if b"\x00" in data[:65536]:
        raise DocumentError("binary", f"{what} is not HTML text (it contains NUL bytes)")
    return data.decode("cp1252", errors="replace")


_DROP = frozenset({
    "script", "style", "noscript", "template", "head", "svg", "math", "iframe", "object", "embed",
    "canvas", "nav", "aside", "form", "button", "select", "textarea", "dialog",
})
_DROP_ROLES = frozenset({"navigation", "search", "complementary", "banner", "contentinfo"})
_BLOCK = frozenset({
    "p", "div", "section", "article", "main", "header", "footer", "blockquote", "ul", "ol", "dl", "dt",
    "dd", "table", "thead", "tbody", "tfoot", "tr", "figure", "figcaption", "address", "details",
    "summary", "fieldset", "hr", "body", "html", "caption", "center",
})
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")


def html_text(markup: str) -> str:
    """The visible text of an HTML document as Markdown-like text (see the module docstring)."""
    parts.require("html")
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(markup)
    root = tree.body or tree.root
    if root is None:
        return ""
    title_node = tree.css_first("title")
    title = _SPACES.sub(" ", title_node.text() if title_node is not None else "").strip()
    hidden = _hidden_selectors(" ".join(n.text() or "" for n in tree.css("style")))
    out = _walk(root, drop=True, hidden=hidden)
    if not out.strip():  # a page that is all navigation: keep what there is
        out = _walk(root, drop=False)
    text = _tidy(out)
    if title and not re.match(r"#\s", text) and title not in text[:500]:
        text = f"# {title}\n\n{text}" if text else title
    return text


_HIDING = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
_SIMPLE_SELECTOR = re.compile(r"^([.#])(-?[A-Za-z_][\w-]*)$")


def _hidden_selectors(css: str) -> frozenset[str]:
    """``.class`` and ``#id`` selectors that top-level rules of ``css`` hide (display: none,
    visibility: hidden). Comments are removed; an at-rule's block is skipped whole."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
    found: set[str] = set()
    pos, depth, start = 0, 0, 0
    prelude = ""
    while pos < len(css):
        char = css[pos]
        if char == "{":
            if depth == 0:
                prelude = css[start:pos].strip()
                start = pos + 1
            depth += 1
        elif char == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                if not prelude.startswith("@") and _HIDING.search(css[start:pos]):
                    for selector in prelude.split(","):
                        m = _SIMPLE_SELECTOR.match(selector.strip())
                        if m:
                            found.add(m.group(0))
                start = pos + 1
        elif char == ";" and depth == 0:
            start = pos + 1  # a statement at-rule (@import ...;) ends here
        pos += 1
    return frozenset(found)


def _is_hidden(attributes: dict[str, str | None], hidden: frozenset[str]) -> bool:
    if "hidden" in attributes or (attributes.get("aria-hidden") or "").strip().lower() == "true":
        return True
    style = attributes.get("style")
    if style and _HIDING.search(style):
        return True
    if hidden:
        if "#" + (attributes.get("id") or "") in hidden:
            return True
        return any("." + name in hidden for name in (attributes.get("class") or "").split())
    return False


def _is_permalink(node: object, attributes: dict[str, str | None]) -> bool:
    """A link to a fragment of this page whose text is one or two signs, no letter or digit
    (a footnote's ``<a href="#fn1">1</a>`` is kept)."""
    if not (attributes.get("href") or "").startswith("#"):
        return False
    text = (node.text(deep=True) or "").strip()  # type: ignore[attr-defined]
    return 0 < len(text) <= 2 and not any(char.isalnum() for char in text)


def _walk(root: object, *, drop: bool, hidden: frozenset[str] = frozenset()) -> str:
    """Depth-first over the tree with an explicit stack (deeply nested pages are legal)."""
    parts: list[str] = []
    stack: list[tuple[object, bool]] = [(root, False)]
    inline: list[str] = []
    prefix_stack: list[str] = []

    def flush(sep: str = "\n\n") -> None:
        text = _SPACES.sub(" ", "".join(inline)).strip()
        inline.clear()
        if text:
            parts.append(text)
        if parts and parts[-1] != sep and not parts[-1].endswith("\n"):
            parts.append(sep)

    while stack:
        node, closing = stack.pop()
        tag = node.tag  # type: ignore[attr-defined]
        if closing:
            if tag in _HEADINGS:
                text = _SPACES.sub(" ", "".join(inline)).strip()
                inline.clear()
                if text:
                    parts.append("\n\n" + "#" * _HEADINGS[tag] + " " + text + "\n\n")
            elif tag in ("td", "th"):
                inline.append(" | ")
            elif tag == "li":
                flush("\n")
                prefix_stack.pop()
            elif tag in _BLOCK:
                flush()
            continue
        if tag == "-text":
            inline.append((node.text_content or "").replace("\n", " "))  # type: ignore[attr-defined]
            continue
        if tag in ("-comment", "!doctype"):
            continue
        if drop:
            attributes = node.attributes  # type: ignore[attr-defined]
            if tag in _DROP or (attributes.get("role") or "") in _DROP_ROLES or _is_hidden(attributes, hidden):
                continue
            if tag == "a" and _is_permalink(node, attributes):
                continue
        if tag == "pre":
            flush()
            code = (node.text(deep=True) or "").strip("\n")  # type: ignore[attr-defined]
            if code.strip():
                parts.append("```\n" + code + "\n```\n\n")
            continue
        if tag == "br":
            inline.append("\n")
            continue
        if tag in _HEADINGS:
            flush()
        elif tag == "li":
            flush("\n")
            prefix_stack.append("- ")
            inline.append("- ")
        elif tag in _BLOCK:
            flush()
        stack.append((node, True))
        children = list(node.iter(include_text=True))  # type: ignore[attr-defined]
        for child in reversed(children):
            stack.append((child, False))
    flush()
    return "".join(parts)


def _tidy(text: str) -> str:
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return unicodedata.normalize("NFC", text).strip()
