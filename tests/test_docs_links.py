"""README.md and docs/ hold together: every relative link resolves (the file exists, and an
``#anchor`` names a heading of it as GitHub renders it), README links every page of docs/,
and README stays a front page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE = re.compile(r"`[^`\n]*`")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def broken(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            found.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            found.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return found


def test_every_relative_link_resolves() -> None:
    found = [problem for path in DOCUMENTS for problem in broken(path)]
    assert not found, "\n".join(found)


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## Data, logs and `secrets`\n", encoding="utf-8")
    page.write_text(
        "# Page\n[a](other.md#data-logs-and-secrets) [b](#page) [c](missing.md) [d](other.md#nope)\n"
        "`[e](in-code.md)` [f](https://example.com/x)\n```\n[g](in-fence.md)\n```\n",
        encoding="utf-8",
    )
    assert broken(page, tmp_path) == ["page.md: missing.md (no such file)", "page.md: other.md#nope (no such heading)"]


def test_the_readme_is_a_front_page_linking_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 260, "README.md is the front page: the reference goes to docs/"
    linked = {target.partition("#")[0] for target in links(ROOT / "README.md")}
    unlinked = [p.name for p in DOCUMENTS[1:] if f"docs/{p.name}" not in linked]
    assert not unlinked, f"README's contents do not link {unlinked}"
