"""Every relative link in README.md and docs/*.md points to a file that exists (and a heading in it).

A link's ``#anchor`` is checked against the headings of the Markdown file it points to, as
GitHub makes anchors from them: lower case, punctuation dropped, spaces turned into hyphens.
Links to web pages (``https://...``) are not followed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
PAGES = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(path: Path) -> list[str]:
    """The page's lines outside fenced code blocks, where a ``[x](y)`` is text, not a link."""
    lines, in_block = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_block = not in_block
        elif not in_block:
            lines.append(line)
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(path):
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            base = anchor(match.group(1))
            name, number = base, 0
            while name in found:  # repeated headings get -1, -2, ...
                number += 1
                name = f"{base}-{number}"
            found.add(name)
    return found


def relative_links(path: Path) -> list[str]:
    links = []
    for line in prose(path):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        links += [target for target in LINK.findall(line) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]
    return links


CASES = [
    pytest.param(page, target, id=f"{page.relative_to(REPOSITORY)}->{target}")
    for page in PAGES
    for target in relative_links(page)
]


def test_the_pages_have_relative_links():
    assert len(CASES) > 20
    assert {page.name for page in PAGES} >= {"README.md", "measurement.md", "ci.md", "development.md"}


@pytest.mark.parametrize(("page", "target"), CASES)
def test_a_relative_link_points_to_an_existing_file_and_heading(page: Path, target: str):
    file_part, _, fragment = target.partition("#")
    linked = (page.parent / file_part).resolve() if file_part else page
    assert linked.exists(), f"{page.relative_to(REPOSITORY)}: link to a missing file: {target}"
    if fragment and linked.suffix == ".md":
        assert fragment in anchors(linked), (
            f"{page.relative_to(REPOSITORY)}: no heading makes #{fragment} in {linked.relative_to(REPOSITORY)}; "
            f"its anchors: {sorted(anchors(linked))}"
        )


def test_anchors_are_made_as_github_makes_them():
    assert anchor("`tox -e memory-gate` and its baseline") == "tox--e-memory-gate-and-its-baseline"
    assert anchor("3. Big batch") == "3-big-batch"
    assert anchor('Isolation: no more bare `Killed`') == "isolation-no-more-bare-killed"
