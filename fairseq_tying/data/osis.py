"""Reading ``mod2imp`` dumps of SWORD Bible modules and cleaning their OSIS markup to plain text."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple


class Verse(NamedTuple):
    book: str
    chapter: int
    verse: int
    osis: str


_KEY = re.compile(r"^(?P<book>.+) (?P<chapter>\d+):(?P<verse>\d+)$")


def parse_imp(text: str) -> Iterator[Verse]:
    """Yield the verse entries of a ``mod2imp`` dump (``$$$Book C:V`` then its markup lines).

    Module/testament headings and book/chapter introductions (verse 0) are skipped.
    """
    key: str | None = None
    lines: list[str] = []

    def flush() -> Iterator[Verse]:
        if key is None:
            return
        m = _KEY.match(key)
        if m and int(m["verse"]) > 0:
            yield Verse(m["book"], int(m["chapter"]), int(m["verse"]), "\n".join(lines))

    for line in text.split("\n"):
        if line.startswith("$$$"):
            yield from flush()
            key, lines = line[3:].strip(), []
        else:
            lines.append(line)
    yield from flush()


# Footnotes, cross references and speaker labels are editorial, not translation: drop them.
_NOTE = re.compile(r"<note\b[^>]*/>|<note\b.*?</note>", re.S)
_SPEAKER = re.compile(r"<speaker\b.*?</speaker>", re.S)
# Everything after the end of Revelation (the English module appends a glossary there).
_BOOK_END = re.compile(r'<chapter eID="Rev\.22"/>.*', re.S)
# Psalm 119's Hebrew-letter headings: an English <title type="psalm"> and a Spanish inline prefix.
_PS119_TITLE = re.compile(r'<title\b[^>]*type="psalm"[^>]*>[^<]*</title>')
HEBREW_LETTERS_ES = (
    "ALEPH BETH GIMEL DALETH HE VAU ZAIN CHETH TETH JOD CAPH LAMED MEM NUN SAMECH AIN PE "
    "TZADDI COPH RESH SIN TAU"
).split()
_PS119_ES = re.compile(r"^\s*(?:" + "|".join(HEBREW_LETTERS_ES) + r")\.?\s+")
# Tags that separate words (lines, paragraphs, titles, ...) become a space; inline ones vanish.
_BLOCK_TAG = re.compile(r"</?(?:l|lg|lb|div|p|title|item|list|chapter|milestone|br)\b[^>]*>")
_TAG = re.compile(r"<[^>]*>")
# Word elements written with no space between them: a closing red-letter quotation followed by
# the next word, and the Spanish added words (<transChange>) next to a <w> element.
_GLUED = re.compile(r"</q>(?=<w\b|\w)|</transChange>(?=<w\b)")
# An added word right after a <w> element is a separate word, except an enclitic pronoun
# completing a verb ("envía" + "lo" = "envíalo"); these words before a pronoun are no verbs.
_W_THEN_ADDED = re.compile(r"(?P<prev>[^\s>]*)</w>(?=<transChange\b[^>]*>(?P<added>[^<]*)</)")
_CLITICS = {"lo", "la", "los", "las", "le", "les", "me", "te", "se", "nos", "os"}
_NOT_VERBS = {"y", "e", "o", "ó", "que", "no", "os", "como", "cuánto", "gentes", "ellos"}
_NOT_VERBS |= {"dios", "jehová", "josué"}

_NOTE_MARK = "\x00"
# A removed note leaves a space, except before punctuation that closes a word.
_MARK_BEFORE_PUNCT = re.compile(r"\s*\x00[\s\x00]*(?=[,.;:!?’”)\]])")
_ENTITIES = {"&lt;": "<", "&gt;": ">", "&quot;": '"', "&apos;": "'", "&amp;": "&"}


def _space_added_word(m: re.Match[str]) -> str:
    prev, added = m["prev"], m["added"]
    enclitic = added in _CLITICS and prev.lower() not in _NOT_VERBS
    return m[0] if enclitic else m[0] + " "


def clean_osis(osis: str, book: str = "", chapter: int = 0, verse: int = 0) -> str:
    """Plain text of one verse's OSIS markup (the verse's key selects the Psalm 119 rule)."""
    s = osis.replace("\n", " ")
    s = _BOOK_END.sub("", s)
    s = _NOTE.sub(_NOTE_MARK, s)
    s = _SPEAKER.sub(" ", s)
    if book == "Psalms" and chapter == 119 and verse % 8 == 1:
        s = _PS119_TITLE.sub(" ", s)
    s = _GLUED.sub("\\g<0> ", s)
    s = _W_THEN_ADDED.sub(_space_added_word, s)
    s = _BLOCK_TAG.sub(" ", s)
    s = _TAG.sub("", s)
    for entity, char in _ENTITIES.items():
        s = s.replace(entity, char)
    s = _MARK_BEFORE_PUNCT.sub("", s).replace(_NOTE_MARK, " ")
    s = " ".join(s.split())
    if book == "Psalms" and chapter == 119 and verse % 8 == 1:
        s = _PS119_ES.sub("", s)
    return s
