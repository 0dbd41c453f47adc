"""Every relative link in the README and docs/ leads somewhere: the file (or folder) exists, and a
``#section`` names a heading of that page as GitHub renders its anchors. The README is the front
page and the rest lives in docs/ pages by task, so a page moved or a heading reworded must not
leave a link dead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]

#: ``[text](target)`` and ``![alt](target)``; a target ends at the first space (a title follows)
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def prose_lines(text: str, blank_code: bool = True) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, with inline code spans blanked out (unless
    ``blank_code`` is false): a link written as an example inside code is not a link."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        lines.append((number, _CODE_SPAN.sub(lambda m: " " * len(m.group()), line) if blank_code else line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(page.read_text(), blank_code=False):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    return [(number, m.group(1)) for number, line in prose_lines(page.read_text()) for m in _LINK.finditer(line)]


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)  # http:, https:, mailto:


def broken(page: Path, root: Path = REPO_ROOT) -> list[str]:
    """What is wrong with the page's relative links, one line each (none: all resolve)."""
    problems = []
    for number, target in links(page):
        if not relative(target):
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif not dest.is_relative_to(root.resolve()):
            problems.append(f"{where}: outside the repository")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{where}: {dest.name} has no heading with that anchor")
    return problems


def test_the_docs_are_there():
    names = {page.name for page in PAGES}
    assert {"README.md", "usage.md", "runner.md", "checking.md", "what-is-patched.md"} <= names
    assert {"cuda-to-cpu.md", "bigdl-nano.md", "performance.md", "development.md", "architecture.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page):
    assert not broken(page), "\n".join(broken(page))


def test_the_readme_links_every_docs_page():
    linked = {(REPO_ROOT / target.partition("#")[0]).resolve() for _, target in links(REPO_ROOT / "README.md")}
    missing = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_readme_is_a_front_page():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 250, f"the README has {len(lines)} lines: move detail into a docs/ page"


def test_the_checker_finds_what_it_should(tmp_path):
    """The checker itself: a dead file, a dead anchor and a link in code are told apart from
    good links, with GitHub's anchors for punctuation and repeated headings."""
    (tmp_path / "other.md").write_text("# Title\n\n## Checking that it learns (`--verify`)\n\n## A\n\n## A\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#checking-that-it-learns---verify) [ok](other.md#a-1) [ok](#local)\n"
        "## Local\n"
        "[dead](missing.md) [dead anchor](other.md#nothing) `[in code](missing.md)`\n"
        "```\n[in a block](missing.md)\n```\n"
        "[web](https://example.com/x.md)\n"
    )
    assert anchors(tmp_path / "other.md") == {"title", "checking-that-it-learns---verify", "a", "a-1"}
    found = [(number, target) for number, target in links(page) if relative(target)]
    assert found == [
        (1, "other.md#checking-that-it-learns---verify"),
        (1, "other.md#a-1"),
        (1, "#local"),
        (3, "missing.md"),
        (3, "other.md#nothing"),
    ]
    assert broken(page, tmp_path) == [
        "page.md:3: missing.md: no such file",
        "page.md:3: other.md#nothing: other.md has no heading with that anchor",
    ]
