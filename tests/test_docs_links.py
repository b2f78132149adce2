"""Every relative link in the README and docs/ leads somewhere: its file exists and its
``#fragment`` is a heading of that file, under GitHub's rule for heading anchors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without its code blocks (a ``](…)`` inside one is not a link)."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, ``-1``,
    ``-2`` … after repeats."""
    seen: dict[str, int] = {}
    out = set()
    for title in re.findall(r"^#{1,6} (.+)$", _prose(text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_anchors_follow_githubs_rule():
    text = "# Results\n## On a GPU: P1 in fp16\n### Results\n```\n# not a heading\n```\n"
    assert anchors(text) == {"results", "on-a-gpu-p1-in-fp16", "results-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto: …
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no file {path})")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked.read_text()):
            broken.append(f"{target} (no heading #{fragment} in {linked.name})")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
