"""The verdict rules (``studies.verdicts``) and the claims table, on hand-made comparisons."""

from __future__ import annotations

import pytest

from fairseq_tying.studies.verdicts import SEEDS, bootstrap, counts
from fairseq_tying.studies.view_grid import claims_table


def comparison(*deltas: float, p: float) -> dict:
    """A ``compare`` result with the given per-seed differences and pooled p."""
    per_seed = {seed: d for seed, d in enumerate(deltas, start=1)}
    return {"delta_bleu": sum(deltas) / len(deltas), "p": p, "n_seeds": len(deltas),
            "per_seed_delta": per_seed, "per_seed_p": {s: p for s in per_seed},
            "delta_ci95": None}


@pytest.mark.parametrize("deltas, p, expects, expected", [
    ((0.5, 0.4, 0.6), 0.01, "gain", "supported"),
    ((-0.5, -0.4, -0.6), 0.01, "gain", "contradicted"),
    ((0.5, -0.1, 0.6), 0.01, "gain", "unresolved (seeds differ in sign)"),
    ((0.5, 0.4, 0.6), 0.2, "gain", "unresolved (p ≥ 0.05)"),  # the test set's noise
    ((2.0,), 0.001, "gain", f"unresolved (1 of {SEEDS} seeds)"),  # one seed decides nothing
    ((1.9, 1.5, 2.2), 0.001, "unchanged", "supported (better)"),
    ((-1.9, -1.5, -2.2), 0.001, "unchanged", "contradicted"),
    ((0.3, -0.2, 0.1), 0.4, "unchanged", "supported (p ≥ 0.05)"),
    ((-1.9, -1.5), 0.001, "unchanged", f"unresolved (2 of {SEEDS} seeds)"),
])
def test_verdicts_follow_the_rule(deltas, p, expects, expected):
    assert bootstrap(comparison(*deltas, p=p), expects) == expected


def test_a_difference_at_p_alpha_does_not_count():
    assert not counts(comparison(0.5, 0.4, 0.6, p=0.05))
    assert counts(comparison(0.5, 0.4, 0.6, p=0.049))


def test_the_table_lists_only_the_claims_the_study_has_cells_for():
    summary = {"three_way/dot": {"vs_untied": comparison(1.9, 1.5, 2.2, p=0.001)},
               "three_way/l2norm": {"vs_dot": comparison(-0.3, p=0.09)},
               "none/l2norm": {"vs_dot": comparison(0.5, 0.4, 0.6, p=0.01)}}
    lines = claims_table(summary).splitlines()[2:]
    assert len(lines) == 2
    assert "three-way tying keeps BLEU" in lines[0] and "supported (better)" in lines[0]
    assert "+1.87 (p = 0.001; [0.001, 0.001, 0.001])" in lines[0]
    assert "`l2norm` beats `dot` (three-way tying)" in lines[1] and "-0.30 (p = 0.090" in lines[1]
    assert claims_table({"none/dot": {}}) is None
