"""The held-out sentences' closest training sentences by shared word 4-grams
(fairseq_tying/data/overlap.py), against a brute-force count over every pair."""

from __future__ import annotations

import random
import string

import pytest

from fairseq_tying.data import overlap


def _grams_by_hand(text: str) -> set[tuple[str, ...]]:
    """Another tokenizer for the same rule: punctuation to spaces, lower case, split."""
    ws = text.translate(str.maketrans(string.punctuation + "“”’", " " * 35)).lower().split()
    return {tuple(ws[i:i + 4]) for i in range(len(ws) - 3)} if len(ws) >= 4 else {tuple(ws)}


def _brute_force(heldout: list[str], train: list[str]) -> list[tuple[int | None, float]]:
    """Every held-out sentence against every training sentence (the O(N·M) loop)."""
    out = []
    for h in heldout:
        gs = _grams_by_hand(h)
        shared = [len(gs & _grams_by_hand(t)) for t in train]
        best = max(shared)
        out.append((shared.index(best) if best else None, best / len(gs)))
    return out


def _found(heldout: list[str], train: list[str]) -> list[overlap.Closest]:
    return overlap.closest(heldout, overlap.index(train))


TRAIN = ["In the beginning God created the heavens and the earth.",
         "For you always have the poor with you; but you don't always have me.",
         "Ram became the father of Amminadab. Amminadab became the father of Nahshon.",
         "Jesus wept!"]


def test_a_planted_near_duplicate_is_found_with_its_fraction():
    # 15 words ("don't" is two), 12 distinct 4-grams: the last 9, from "have the poor with"
    # on, are TRAIN[1]'s, the first 3 ("truly you will have" ...) are not
    planted = "Truly you will have the poor with you, but you don't always have me."
    found = _found([planted], TRAIN)[0]
    assert (found.train, found.shared, found.total) == (1, 9, 12)
    assert found.fraction == pytest.approx(0.75)
    assert [(found.train, found.fraction)] == _brute_force([planted], TRAIN)
    assert not found.short


def test_a_sentence_of_fewer_than_four_words_is_compared_whole():
    same, other = _found(["JESUS WEPT.", "Jesus slept."], TRAIN)
    assert same.short and (same.train, same.fraction) == (3, 1.0)
    assert other.short and (other.train, other.shared, other.fraction) == (None, 0, 0.0)
    # its words inside a longer training sentence are not a repeat of it
    assert _found(["In the beginning"], TRAIN)[0].fraction == 0.0


def test_the_index_finds_what_every_pair_compared_finds():
    rng = random.Random(3)
    vocab = ["and", "the", "lord", "said", "to", "him", "go", "up", "now"]
    train = [" ".join(rng.choices(vocab, k=rng.randint(2, 12))) for _ in range(60)]
    heldout = [" ".join(rng.choices(vocab, k=rng.randint(2, 12))) for _ in range(40)]
    heldout += [train[5] + " now", train[17]]  # planted: one longer, one the same
    found = _found(heldout, train)
    expected = _brute_force(heldout, train)
    assert [(c.train if c.shared else None, c.fraction) for c in found] == \
        [(t, pytest.approx(f)) for t, f in expected]
    assert found[-1].fraction == 1.0 and train[found[-1].train] == train[17]


def test_the_summary_counts_each_threshold_and_ranks_the_closest():
    heldout = ["For you always have the poor with you, but you don't always have me.",
               "Amminadab became the father of Nahshon and of no one else at all",
               "Something else entirely, said nobody ever before."]
    found = _found(heldout, TRAIN)
    s = overlap.summary(found, ["h0", "h1", "h2"], [f"t{i}" for i in range(4)], heldout, TRAIN,
                        top=2, width=20)
    assert s["sentences"] == 3 and s["short"] == 0
    assert s["at_least"] == {"0.5": 1, "0.8": 1}  # h1 shares 3 of its 10 4-grams with t2
    assert [(c["heldout_id"], c["train_id"]) for c in s["closest"]] == [("h0", "t1"),
                                                                          ("h1", "t2")]
    assert s["closest"][1]["fraction"] == 0.3
    assert len(s["closest"][0]["heldout"]) == 20 and s["closest"][0]["heldout"].endswith("…")
