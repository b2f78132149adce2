"""Undo the Spanish module's typographic drop capitals ("Y ACONTECIÓ en los días ...").

The RV1909 module writes the first word(s) of a chapter, and of a psalm after its superscription,
in capitals. Left alone they are rare tokens that the English side never mirrors. The first word
of a sentence gets an initial capital; the other words of the run take the casing they most often
have elsewhere in the text ("E HIRAM rey" -> "E Hiram rey", "A LOS" -> "A los").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

_LETTERS = re.compile(r"[^\W\d_]+")
_SENTENCE_END = (".", ":", ";", "?", "!")


def _core(token: str) -> str:
    return "".join(_LETTERS.findall(token))


def _is_caps(token: str) -> bool:
    core = _core(token)
    return bool(core) and core.isupper()


def word_case_counts(texts: Iterable[str]) -> Counter:
    """Counts of each word form (letters only) over a text, the truecasing statistics."""
    return Counter(w for t in texts for w in _LETTERS.findall(t))


def _recase(token: str, initial: bool, counts: Counter) -> str:
    core = _core(token)
    if initial:
        new = core[0] + core[1:].lower()
    else:
        lower, title = core.lower(), core[0] + core[1:].lower()
        new = title if counts[title] > counts[lower] else lower
    return token.replace(core, new, 1)


def undo_drop_caps(text: str, verse: int, psalm: bool, counts: Counter) -> str:
    """Recase the capitalised run opening a verse (or following a psalm superscription).

    Outside verse 1 a run is only recased when a lower-case word follows it (inscriptions such
    as "MENE, MENE, TEKEL" stay as written).
    """
    tokens = text.split(" ")
    start = None
    for i, tok in enumerate(tokens):
        if not (_is_caps(tok) and len(_core(tok)) >= 2):
            continue
        j = i - 1 if i > 0 and len(_core(tokens[i - 1])) == 1 and _is_caps(tokens[i - 1]) else i
        after_title = psalm and verse == 1 and j > 0 and tokens[j - 1].endswith(_SENTENCE_END)
        if j == 0 or after_title:  # ("Y"|"A" ...) CAPS at a verse or psalm-text start
            start = i
        break
    if start is None:
        return text
    end = start
    while end < len(tokens) and _is_caps(tokens[end]):
        end += 1
    if verse != 1:
        follower = _core(tokens[end]) if end < len(tokens) else ""
        if not follower or not follower[0].islower():
            return text
    for i in range(start, end):
        initial = i == 0 or tokens[i - 1].endswith(_SENTENCE_END)
        tokens[i] = _recase(tokens[i], initial, counts)
    return " ".join(tokens)
