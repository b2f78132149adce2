"""Generated blocks in hand-written Markdown: the text between ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->`` is a tool's (a study's tables, the demo's figures, the benchmarks'
summaries), the rest of the file its author's. ``replace_block`` rewrites one block and keeps
the rest as written (atomically, ``atomic.write_text``); ``block_text`` reads one back."""

from __future__ import annotations

import os
from pathlib import Path

from fairseq_tying.common.atomic import write_text


def markers(block: str) -> tuple[str, str]:
    """The Markdown comments around the generated part ``block`` of a hand-written report."""
    return f"<!-- {block}:begin -->", f"<!-- {block}:end -->"


def block_text(text: str, block: str) -> str:
    """The lines between ``text``'s markers of ``block``, as ``replace_block`` writes them (its
    text without trailing blanks, and a newline)."""
    begin, end = markers(block)
    if begin not in text or end not in text.split(begin, 1)[1]:
        raise ValueError(f"no marked block {block!r}: expected {begin} ... {end}")
    return text.split(begin, 1)[1].split(end, 1)[0].removeprefix("\n")


def replace_block(report: str | os.PathLike, block: str, text: str, new_file: str = "") -> Path:
    """Replace the text between ``report``'s markers of ``block`` with ``text``, the rest of the
    report as written; the block is appended when the markers are missing (to ``new_file``
    when the report does not exist)."""
    report = Path(report)
    begin, end = markers(block)
    old = report.read_text(encoding="utf-8") if report.exists() else new_file
    marked = f"{begin}\n{text.rstrip()}\n{end}"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + marked + rest.split(end, 1)[1]
    else:
        new = old.rstrip() + "\n\n" + marked + "\n"
    return write_text(report, new)
