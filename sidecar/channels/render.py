"""Markdown -> the lines of one IM dialect (with the context the splitter needs).

Owns: parsing a reply's Markdown (markdown-it-py, CommonMark plus tables and strikethrough,
raw HTML kept as text) and writing every block and inline construct the way the Dialect
says (dialects.py). The result is a list of ``split.Line``: code fences carry their opener
and closer, tables their header rows, links and code spans are atoms; images that the
dialect cannot show inline become separate media items; links of the footnote dialect and
Markdown footnotes (``[^id]`` with ``[^id]: text`` definitions) become numbered notes at the
end ("citations as footnotes").

Must stay true: every fence the output opens is closed (an unterminated fence in the input is
closed at the end); a code line that would close the fence early is indented so it cannot;
a text line that would open a fence starts with a zero-width space; only http(s) and mailto
links and http(s) images are written as links or sent as media (anything else is text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sidecar.channels.dialects import Dialect, telegram_escape_url
from sidecar.channels.split import Fence, Line, Role, Table

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.tree import SyntaxTreeNode

__all__ = ["Media", "Rendered", "render_markdown", "extract_footnotes"]

MAX_DEPTH = 8
"""Deeper nesting (lists in quotes in lists...) is written without further indentation."""
_ATOM_MAX = 200
_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_FENCE_ONLY = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*$")
_FN_DEF = re.compile(r"^ {0,3}\[\^([^\]\s]{1,40})\]:[ \t]*(.*)$")
_FN_REF = re.compile(r"\[\^([^\]\s]{1,40})\]")
_LANG = re.compile(r"^[A-Za-z0-9_+#.-]{1,20}$")
_SAFE_LINK = ("http://", "https://", "mailto:")
_SAFE_IMAGE = ("http://", "https://")


@dataclass(slots=True)
class Media:
    url: str
    alt: str | None = None


@dataclass(slots=True)
class Rendered:
    lines: list[Line] = field(default_factory=list)
    media: list[Media] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    # Every link and image is parsed as one (markdown-it would leave javascript:, file: and
    # data: ones as literal text, which a platform's own Markdown renderer could still turn
    # into a link); _link and _image decide what is safe to write.
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    return md


def extract_footnotes(text: str) -> tuple[str, dict[str, str]]:
    """Markdown footnote definitions (outside code fences) taken out of ``text``."""
    out: list[str] = []
    notes: dict[str, str] = {}
    fence: str | None = None
    current: str | None = None
    for raw in text.split("\n"):
        m = _FENCE_LINE.match(raw)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and _FENCE_ONLY.match(raw):
                fence = None
            out.append(raw)
            continue
        if m:
            fence = m.group(1)
            current = None
            out.append(raw)
            continue
        d = _FN_DEF.match(raw)
        if d:
            current = d.group(1)
            notes.setdefault(current, d.group(2).strip())
            continue
        if current is not None and raw.startswith("    ") and raw.strip():
            notes[current] = (notes[current] + " " + raw.strip()).strip()
            continue
        current = None
        out.append(raw)
    return "\n".join(out), notes


def render_markdown(text: str, dialect: Dialect) -> Rendered:
    from markdown_it.tree import SyntaxTreeNode

    body, definitions = extract_footnotes(text)
    tree = SyntaxTreeNode(_parser().parse(body))
    renderer = _Renderer(dialect, definitions)
    lines = renderer.blocks(tree.children, depth=0)
    if renderer.result.notes:
        lines.append(Line("", Role.BLANK))
        for number, note in enumerate(renderer.result.notes, 1):
            lines.append(Line(dialect.escape(f"[{number}] ") + dialect.escape(note)))
    renderer.result.lines = lines
    return renderer.result


class _Renderer:
    def __init__(self, dialect: Dialect, definitions: dict[str, str]) -> None:
        self.d = dialect
        self.definitions = definitions
        self.numbers: dict[str, int] = {}
        self.result = Rendered()
        self.quotes = 0
        """Blockquotes being rendered around the current block."""
        self.items = 0
        """List items being rendered around the current block."""

    # ---- notes ----------------------------------------------------------------------

    def _note(self, key: str, text: str) -> int:
        if key not in self.numbers:
            self.result.notes.append(text)
            self.numbers[key] = len(self.result.notes)
        return self.numbers[key]

    def _refs(self, text: str) -> str:
        if not self.definitions or "[^" not in text:
            return text

        def number(m: re.Match[str]) -> str:
            key = m.group(1)
            if key not in self.definitions:
                return m.group(0)
            return f"[{self._note('fn:' + key, self.definitions[key])}]"

        return _FN_REF.sub(number, text)

    # ---- blocks ---------------------------------------------------------------------

    def blocks(self, nodes: list[SyntaxTreeNode], depth: int, separator: str | None = "") -> list[Line]:
        """Blocks one after the other, with a blank line between them (``separator``: the
        line between blocks inside a container; None: none, as in a tight list item)."""
        out: list[Line] = []
        for node in nodes:
            lines = self.block(node, depth)
            if not lines:
                continue
            if out and separator is not None:
                out.append(Line(separator, Role.TEXT) if separator.strip() else Line("", Role.BLANK))
            out.extend(lines)
        return out

    def block(self, node: SyntaxTreeNode, depth: int) -> list[Line]:
        kind = node.type
        if kind == "paragraph":
            return self._text_lines(*self.inline_of(node))
        if kind == "heading":
            text, atoms = self.inline_of(node)
            text = text.replace("\n", " ")
            level = min(int(node.tag[1:]) if node.tag[1:].isdigit() else 1, self.d.max_heading)
            if self.d.heading == "hashes":
                prefix = "#" * level + " "
                return [Line(prefix + text, atoms=_shift(atoms, len(prefix)))]
            if self.d.heading == "bold" and self.d.bold is not None and text.strip():
                bold = self.d.wrap(self.d.bold, text)
                return self._text_lines(bold, ((0, len(bold)),) if len(bold) < _ATOM_MAX else ())
            return self._text_lines(text, atoms)
        if kind in ("bullet_list", "ordered_list"):
            return self._list(node, depth)
        if kind == "blockquote":
            self.quotes += 1
            try:
                inner = self.blocks(node.children, depth + 1, separator=">" if self.d.nested_quotes else "")
            finally:
                self.quotes -= 1
            if depth >= MAX_DEPTH or ((self.quotes or self.items) and not self.d.nested_quotes):
                # where quotes cannot nest, a quote marker is only read at the start of a
                # line: a quote in a quote is one level, a quote in a list item plain text
                return inner
            return _prefixed(inner, "> ", "> ")
        if kind in ("fence", "code_block"):
            return self._fence(node.content, node.info if kind == "fence" else "")
        if kind == "table":
            return self._table(node)
        if kind == "hr":
            return [Line(self.d.hr)]
        if kind == "html_block":
            return self._text_lines(self.d.escape(node.content.rstrip("\n")), ())
        if node.children:
            return self.blocks(node.children, depth)
        content = getattr(node, "content", "") or ""
        return self._text_lines(self.d.escape(content), ()) if content else []

    def _text_lines(self, text: str, atoms: tuple[tuple[int, int], ...]) -> list[Line]:
        if not text.strip():
            return []
        out: list[Line] = []
        start = 0
        for part in text.split("\n"):
            end = start + len(part)
            line_atoms = tuple((max(s, start) - start, min(e, end) - start) for s, e in atoms if s < end and e > start)
            if _FENCE_LINE.match(part):
                part = "\u200b" + part  # not a fence opener in any renderer
                line_atoms = _shift(line_atoms, 1)
            out.append(Line(part, Role.TEXT, atoms=line_atoms))
            start = end + 1
        return out

    def _list(self, node: SyntaxTreeNode, depth: int) -> list[Line]:
        out: list[Line] = []
        ordered = node.type == "ordered_list"
        try:
            number = int(node.attrs.get("start", 1)) if ordered else 1
        except (TypeError, ValueError):
            number = 1
        for item in node.children:
            marker = self.d.escape(f"{number}. ") if ordered else self.d.bullet
            number += 1
            self.items += 1
            try:
                inner = self.blocks(item.children, depth + 1, separator=None)
            finally:
                self.items -= 1
            if not inner:
                inner = [Line("")]
            if depth < MAX_DEPTH:
                inner = _prefixed(inner, marker, " " * len(marker))
            else:
                inner = _prefixed(inner, marker, "")
            out.extend(inner)
        return out

    def _fence(self, content: str, info: str) -> list[Line]:
        code = content[:-1] if content.endswith("\n") else content
        body = code.split("\n") if code else []
        longest = 0
        for line in body:
            m = _FENCE_ONLY.match(line)
            if m and m.group(1)[0] == "`":
                longest = max(longest, len(m.group(1)))
        size = max(3, longest + 1)
        if self.d.fixed_fence:  # backticks in the code are escaped: they cannot close it
            size = 3
        elif size > 8:  # a pathological code line: indent it instead of growing the marker
            size = 3
            body = ["    " + line if _FENCE_ONLY.match(line) else line for line in body]
        lang = info.strip().split(" ")[0] if info else ""
        if not self.d.fence_language or not _LANG.match(lang):
            lang = ""
        fence = Fence(opener="`" * size + lang, closer="`" * size)
        lines = [Line(fence.opener, Role.FENCE_OPEN, fence=fence)]
        lines.extend(Line(self.d.escape_code(line), Role.FENCE_BODY, fence=fence) for line in body)
        lines.append(Line(fence.closer, Role.FENCE_CLOSE, fence=fence))
        return lines

    def _table(self, node: SyntaxTreeNode) -> list[Line]:
        rows: list[list[str]] = []
        head_rows = 0
        for section in node.children:
            for tr in section.children:
                cells = []
                for cell in tr.children:
                    text, _ = self.inline_of(cell)
                    cells.append(text.replace("\n", " ").strip())
                rows.append(cells)
                if section.type == "thead":
                    head_rows += 1
        if not rows:
            return []
        header, body = rows[: max(head_rows, 1)], rows[max(head_rows, 1):]
        if self.d.table == "markdown":
            def row(cells: list[str]) -> str:
                return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

            head_lines = [row(r) for r in header] + ["| " + " | ".join("---" for _ in header[0]) + " |"]
            body_lines = [row(r) for r in body]
        else:
            bar = self.d.escape(" | ")
            head_lines = [bar.join(self.d.wrap(self.d.bold, c) for c in r) for r in header]
            body_lines = [bar.join(r) for r in body]
        table = Table(header=tuple(head_lines))
        lines = [Line(h, Role.TABLE_HEAD, table=table) for h in head_lines]
        lines.extend(Line(b, Role.TABLE_ROW, table=table) for b in body_lines)
        return lines

    # ---- inline ---------------------------------------------------------------------

    def inline_of(self, node: SyntaxTreeNode) -> tuple[str, tuple[tuple[int, int], ...]]:
        buf = _Buf()
        for child in node.children:
            if child.type == "inline":
                self._inline(child.children, buf)
            else:
                self._inline([child], buf)
        return buf.text(), tuple(buf.atoms)

    def _inline(self, nodes: list[SyntaxTreeNode], buf: _Buf) -> None:
        for node in nodes:
            kind = node.type
            if kind in ("text", "text_special"):
                buf.add(self.d.escape(self._refs(node.content)))
            elif kind in ("softbreak", "hardbreak"):
                buf.add("\n")
            elif kind == "code_inline":
                code = self.d.escape_code(node.content)
                buf.add(self.d.wrap(self.d.code, code) if self.d.code else code, atom=True)
            elif kind in ("strong", "em", "s"):
                inner = _Buf()
                self._inline(node.children, inner)
                style = {"strong": self.d.bold, "em": self.d.italic, "s": self.d.strike}[kind]
                text = self.d.wrap(style, inner.text())
                if len(text) < _ATOM_MAX:
                    buf.add(text, atom=True)
                else:
                    offset = len(style[0]) if style and text != inner.text() else 0
                    buf.add_with_atoms(text, inner.atoms, offset)
            elif kind == "link":
                self._link(node, buf)
            elif kind == "image":
                self._image(node, buf)
            elif node.children:
                self._inline(node.children, buf)
            else:
                buf.add(self.d.escape(getattr(node, "content", "") or ""))

    def _link(self, node: SyntaxTreeNode, buf: _Buf) -> None:
        href = str(node.attrs.get("href", ""))
        inner = _Buf()
        self._inline(node.children, inner)
        text = inner.text()
        plain = _plain(node)
        safe = href.lower().startswith(_SAFE_LINK)
        if not safe:
            buf.add(text)
            return
        same = plain.strip() in (href, href.removeprefix("mailto:")) or node.markup == "autolink"
        if self.d.link == "slack":
            url = href.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C")
            buf.add(f"<{url}>" if same else f"<{url}|{text.replace('|', '¦')}>", atom=True)
        elif self.d.link == "markdown":
            label = text.replace("]", "\\]")
            buf.add(href if same else f"[{label}]({href.replace(')', '%29').replace(' ', '%20')})", atom=True)
        elif self.d.link == "telegram":  # the label is escaped text already
            url = telegram_escape_url(href.replace(" ", "%20"))
            buf.add(self.d.escape(href) if same else f"[{text}]({url})", atom=True)
        else:
            if same:
                buf.add(href, atom=True)
            else:
                buf.add(text + self.d.escape(f" [{self._note('url:' + href, href)}]"))

    def _image(self, node: SyntaxTreeNode, buf: _Buf) -> None:
        src = str(node.attrs.get("src", ""))
        alt = _plain(node).strip()
        if not src.lower().startswith(_SAFE_IMAGE):
            if alt:
                buf.add(self.d.escape(alt))
            return
        if self.d.image == "inline":
            buf.add(f"![{alt.replace(']', '')}]({src.replace(')', '%29').replace(' ', '%20')})", atom=True)
            return
        self.result.media.append(Media(url=src, alt=alt or None))
        if alt:
            buf.add(self.d.escape(alt))


class _Buf:
    __slots__ = ("parts", "length", "atoms")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.atoms: list[tuple[int, int]] = []

    def add(self, text: str, *, atom: bool = False) -> None:
        if not text:
            return
        if atom and "\n" not in text:
            self.atoms.append((self.length, self.length + len(text)))
        self.parts.append(text)
        self.length += len(text)

    def add_with_atoms(self, text: str, atoms: list[tuple[int, int]], offset: int) -> None:
        base = self.length + offset
        self.atoms.extend((s + base, e + base) for s, e in atoms)
        self.parts.append(text)
        self.length += len(text)

    def text(self) -> str:
        return "".join(self.parts)


def _plain(node: Any) -> str:
    if node.type in ("text", "code_inline", "text_special"):
        return str(node.content)
    if node.type in ("softbreak", "hardbreak"):
        return " "
    return "".join(_plain(c) for c in node.children)


def _shift(atoms: tuple[tuple[int, int], ...], by: int) -> tuple[tuple[int, int], ...]:
    return tuple((s + by, e + by) for s, e in atoms)


def _prefixed(lines: list[Line], first: str, rest: str) -> list[Line]:
    """``lines`` inside a container: the first line gets ``first``, the others ``rest``;
    fences and tables get copies whose opener/closer/header carry ``rest``."""
    fences: dict[int, Fence] = {}
    tables: dict[int, Table] = {}
    out: list[Line] = []
    for index, line in enumerate(lines):
        prefix = first if index == 0 else rest
        fence = line.fence
        if fence is not None:
            fence = fences.setdefault(id(line.fence), Fence(rest + fence.opener, rest + fence.closer))
        table = line.table
        if table is not None:
            table = tables.setdefault(id(line.table), Table(tuple(rest + h for h in table.header)))
        if line.role == Role.BLANK:
            text = prefix.rstrip()
            out.append(Line(text, Role.TEXT if text else Role.BLANK))
            continue
        out.append(Line(prefix + line.text, line.role, fence, table, _shift(line.atoms, len(prefix))))
    return out
