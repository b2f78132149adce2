"""Length-based (Gale & Church 1993) alignment of two verse sequences of one book.

Both Bible modules number verses in KJV slots, but one of them fills some slots with its own
(Hebrew) verse numbering. Aligning the sequences by character length finds where the slots stop
matching: a 1-1 bead whose two verses carry the same key is a *confirmed* pair; every other
stretch between confirmed pairs is a misaligned group.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import accumulate

# Bead types (source verses, target verses) with prior probabilities. Gale & Church's priors
# (0.89 for 1-1) suit sentences; verses translate one to one far more often, and with their
# priors a 2-2 bead often beats two good 1-1 beads.
BEADS: dict[tuple[int, int], float] = {
    (1, 1): 0.99,
    (1, 0): 0.002,
    (0, 1): 0.002,
    (2, 1): 0.002,
    (1, 2): 0.002,
    (2, 2): 0.0005,
}
_PRIOR = {b: -math.log(p) for b, p in BEADS.items()}


@dataclass(frozen=True)
class Group:
    """Consecutive source and target verses that translate each other."""

    src_keys: tuple[Hashable, ...]
    tgt_keys: tuple[Hashable, ...]
    confirmed: bool  # one verse a side, same key, aligned 1-1
    z: float  # length mismatch of the group in standard deviations


def _norm_sf(z: float) -> float:
    """Two-sided tail probability of a standard normal, floored to stay loggable."""
    return max(math.erfc(abs(z) / math.sqrt(2.0)), 1e-300)


def length_z(ls: int, lt: int, ratio: float, var: float) -> float:
    """How many standard deviations target length ``lt`` is off what ``ls`` predicts."""
    mean = (ls + lt / ratio) / 2.0
    return (lt - ls * ratio) / math.sqrt(max(mean, 1.0) * var)


def _match_cost(ls: int, lt: int, ratio: float, var: float) -> float:
    if ls == 0 and lt == 0:
        return 0.0
    return -math.log(_norm_sf(length_z(ls, lt, ratio, var)))


def align_lengths(
    src: Sequence[int], tgt: Sequence[int], ratio: float, var: float, band: int = 12
) -> list[tuple[int, int]]:
    """Best bead sequence (as (n_src, n_tgt) steps) for two length sequences.

    The search is restricted to a band of ``band`` verses around the diagonal: the two modules
    never drift further apart than a few verses.
    """
    n, m = len(src), len(tgt)
    cs, ct = [0, *accumulate(src)], [0, *accumulate(tgt)]  # prefix sums: a bead's lengths
    cost: dict[tuple[int, int], float] = {(0, 0): 0.0}
    back: dict[tuple[int, int], tuple[int, int]] = {}
    slope = m / n if n else 0.0
    width = band + abs(n - m)
    for i in range(n + 1):
        centre = round(i * slope)
        for j in range(max(0, centre - width), min(m, centre + width) + 1):
            if (i, j) == (0, 0):
                continue
            best = _best_bead(i, j, cost, cs, ct, ratio, var)
            if best is not None:
                cost[(i, j)], back[(i, j)] = best
    if (n, m) not in back and (n, m) != (0, 0):
        raise ValueError(f"no alignment within a band of {width} verses")
    steps: list[tuple[int, int]] = []
    i, j = n, m
    while (i, j) != (0, 0):
        di, dj = back[(i, j)]
        steps.append((di, dj))
        i, j = i - di, j - dj
    return steps[::-1]


def _best_bead(i: int, j: int, cost: dict[tuple[int, int], float], cs: Sequence[int],
               ct: Sequence[int], ratio: float, var: float
               ) -> tuple[float, tuple[int, int]] | None:
    """The cheapest way to reach cell (i, j): its cost and the bead that ends there; None when
    no bead comes from a reached cell."""
    best: tuple[float, tuple[int, int]] | None = None
    for (di, dj), prior in _PRIOR.items():
        prev = cost.get((i - di, j - dj))
        if prev is None:
            continue
        c = prev + prior + _match_cost(cs[i] - cs[i - di], ct[j] - ct[j - dj], ratio, var)
        if best is None or c < best[0]:
            best = (c, (di, dj))
    return best


def align_book(
    src: Sequence[tuple[Hashable, str]],
    tgt: Sequence[tuple[Hashable, str]],
    ratio: float,
    var: float,
) -> list[Group]:
    """Align the (key, text) verses of one book into groups, one per bead."""
    steps = align_lengths([len(t) for _, t in src], [len(t) for _, t in tgt], ratio, var)
    groups: list[Group] = []
    i = j = 0
    for di, dj in steps:
        ks, kt = tuple(k for k, _ in src[i : i + di]), tuple(k for k, _ in tgt[j : j + dj])
        ls, lt = sum(len(t) for _, t in src[i : i + di]), sum(len(t) for _, t in tgt[j : j + dj])
        confirmed = (di, dj) == (1, 1) and ks == kt
        groups.append(Group(ks, kt, confirmed, length_z(ls, lt, ratio, var)))
        i, j = i + di, j + dj
    return groups


def length_stats(pairs: Sequence[tuple[str, str]]) -> tuple[float, float]:
    """Target/source character ratio and the per-character variance of the length difference."""
    total_s = sum(len(s) for s, _ in pairs)
    total_t = sum(len(t) for _, t in pairs)
    ratio = total_t / total_s
    var = sum((len(t) - len(s) * ratio) ** 2 for s, t in pairs) / sum(
        (len(s) + len(t) / ratio) / 2 for s, t in pairs
    )
    return ratio, var
