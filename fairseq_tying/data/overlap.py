"""How much of a held-out sentence a training sentence repeats: shared word 4-grams.

Held-out books keep a verse out of training, but not its parallel passage in another book (John
12:8 repeats Matthew 26:11). For each held-out sentence this finds the training sentence that
holds the largest fraction of its distinct word 4-grams, through an inverted index of the
training 4-grams (each held-out sentence meets only the training sentences sharing a 4-gram with
it, not all of them). :data:`METHOD` says how words are cut and what a short sentence gets.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

N = 4  # word n-grams: long enough that a shared one is rarely a stock phrase
THRESHOLDS = (0.5, 0.8)
WORD = re.compile(r"\w+")
METHOD = ("Words: the maximal runs of letters and digits (regular expression \\w+) of the "
          "lower-cased text; punctuation and whitespace only separate them. A held-out "
          f"sentence's fraction: its distinct word {N}-grams found in the one training sentence "
          "holding most of them, over all its distinct ones. A sentence of fewer than "
          f"{N} words has no {N}-gram and is compared whole: 1 when a training sentence has "
          "the same words, else 0.")
Gram = tuple[str, ...]


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def grams(text: str, n: int = N) -> set[Gram]:
    """The distinct word n-grams of ``text``; a text of fewer than ``n`` words is its one
    gram, its whole word sequence (so it matches only a training text of the same words)."""
    ws = words(text)
    if len(ws) < n:
        return {tuple(ws)}
    return {tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)}


@dataclass(frozen=True)
class Closest:
    """A held-out sentence and the training sentence sharing most of its n-grams."""

    heldout: int  # index into the held-out sentences
    train: int | None  # index into the training sentences; None: no gram shared
    shared: int  # distinct grams of the held-out sentence found in that training sentence
    total: int  # distinct grams of the held-out sentence
    short: bool  # fewer than N words: compared whole

    @property
    def fraction(self) -> float:
        return self.shared / self.total


def index(train: Sequence[str], n: int = N) -> dict[Gram, list[int]]:
    """gram -> the training sentences holding it, each once, in order."""
    postings: dict[Gram, list[int]] = defaultdict(list)
    for i, text in enumerate(train):
        for g in grams(text, n):
            postings[g].append(i)
    return postings


def closest(heldout: Sequence[str], postings: dict[Gram, list[int]],
            n: int = N) -> list[Closest]:
    """For each held-out sentence, the training sentence sharing the largest fraction of its
    distinct n-grams (ties: the earliest training sentence); ``postings``: the training
    sentences' :func:`index`, built once for every held-out split."""
    found = []
    for h, text in enumerate(heldout):
        gs = grams(text, n)
        hits = Counter(i for g in gs for i in postings.get(g, ()))
        # most shared grams first, then the earliest line: one answer whatever the dict order
        best = min(hits.items(), key=lambda kv: (-kv[1], kv[0]), default=(None, 0))
        found.append(Closest(h, best[0], best[1], len(gs), len(words(text)) < n))
    return found


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def summary(found: Sequence[Closest], heldout_ids: Sequence[str], train_ids: Sequence[str],
            heldout: Sequence[str], train: Sequence[str], top: int = 10,
            width: int = 120) -> dict:
    """The counts at each threshold and the ``top`` closest pairs (ids, fraction, texts cut
    to ``width`` characters)."""
    ranked = sorted(found, key=lambda c: (-c.fraction, c.heldout))
    return {
        "sentences": len(found),
        "short": sum(c.short for c in found),
        "at_least": {str(t): sum(c.fraction >= t for c in found) for t in THRESHOLDS},
        "closest": [{"heldout_id": heldout_ids[c.heldout],
                     "train_id": train_ids[c.train] if c.train is not None else None,
                     "fraction": round(c.fraction, 4), "shared": c.shared, "total": c.total,
                     "heldout": _clip(heldout[c.heldout], width),
                     "train": _clip(train[c.train], width) if c.train is not None else None}
                    for c in ranked[:top]],
    }
