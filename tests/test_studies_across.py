"""``studies.statistics.across``: a claim's Δ on two data sets and its change, by Welch's
interval."""

from __future__ import annotations

from dataclasses import replace

import pytest
from scipy import stats

from fairseq_tying.studies.statistics import across
from fairseq_tying.studies.statistics.cells import Bootstrap, Cell, GridHead, Summary


@pytest.mark.parametrize("a, b", [([1.33, 1.44, 1.06], [2.1, 2.5, 1.8]),
                                  ([0.5, -0.2, 0.3, 0.1, 0.4], [0.2, 0.0, 0.35]),
                                  ([1.0, 1.2], [0.9, 1.4, 1.1, 1.3])])
def test_welch_is_scipys_interval(a, b):
    diff, half = across.welch(a, b)
    ci = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx((ci.low + ci.high) / 2)
    assert half == pytest.approx((ci.high - ci.low) / 2)


def test_words_follow_the_interval():
    assert across.word(0.5, 0.4) == across.LARGER
    assert across.word(-0.5, 0.4) == across.SMALLER
    assert across.word(0.3, 0.4) == across.NO_CHANGE
    with pytest.raises(ValueError, match="2 seeds a side"):
        across.welch([1.0], [1.0, 2.0])


def _summary(deltas: dict[str, list[float]]) -> dict[str, Summary]:
    def cell(label: str, ds: list[float]) -> Cell:
        test = Bootstrap(delta=sum(ds) / len(ds), p=0.5, n_seeds=len(ds),
                         per_seed_delta={str(i + 1): d for i, d in enumerate(ds)})
        return Cell(GridHead(*label.split("/")), {},
                    {"vs_untied" if label.endswith("dot") else "vs_dot": test})

    return {"transformer_twwt": {label: cell(label, ds) for label, ds in deltas.items()}}


def test_only_comparisons_both_sets_make_are_rows():
    there = _summary({"three_way/dot": [1.3, 1.4, 1.1], "three_way/sqnorm": [0.1, 0.2, 0.0]})
    here = _summary({"three_way/dot": [3.0, 3.4, 2.8], "three_way/l2norm": [0.5, 0.6, 0.4]})
    (row,) = across.rows(here, there, "full")
    assert row[1:3] == ["three_way × dot vs untied", "full"] and row[-1] == across.LARGER
    assert row[3].startswith("+1.27 (n=3): ") and row[4].startswith("+3.07 (n=3): ")
    assert "Beside full" in across.render(here, [(there, "full")])
    assert across.render(here, [(_summary({}), "full")]) == ""


def test_each_delta_carries_its_finding_and_every_study_beside_is_one_table():
    """A Δ reads with the rules' finding in its own study (better, worse, no difference): the
    row says whether the comparison keeps its sign and verdict; several studies beside share
    one table, a row per comparison and study."""
    def counted(summaries, p):  # the comparison's pooled p, Holm-adjusted in its family
        (model,) = summaries
        cell = summaries[model]["three_way/l2norm"]
        return {model: {"three_way/l2norm": cell.with_test(
            "vs_dot", replace(cell.tests["vs_dot"], p=p, p_holm=p))}}

    here = counted(_summary({"three_way/l2norm": [0.5, 0.6, 0.4]}), 0.001)
    lower = counted(_summary({"three_way/l2norm": [0.3, -0.2, 0.1]}), 0.4)
    higher = counted(_summary({"three_way/l2norm": [-0.5, -0.7, -0.4]}), 0.001)
    table = across.render(here, [(lower, "lr × 0.5"), (higher, "lr × 2")])
    assert table.startswith("**Beside lr × 0.5 and lr × 2**")
    half, double = (across.rows(here, s, n) for s, n in ((lower, "lr × 0.5"), (higher, "lr × 2")))
    assert half[0][3] == "+0.07 (n=3): no difference shown"
    assert double[0][3] == "-0.53 (n=3): worse" and double[0][4] == "+0.50 (n=3): better"
    assert [line.count("| three_way × l2norm vs `dot` |") for line in table.splitlines()
            if "l2norm" in line] == [1, 1]
    # with another comparison, each comparison's rows stay together, in the order given
    both = {m: {**here[m], **_summary({"three_way/dot": [1.0, 1.2, 0.8]})[m]} for m in here}
    order = [(line.split("|")[2].strip(), line.split("|")[3].strip())
             for line in across.render(both, [(lower, "lr × 0.5"), (both, "lr × 2")]).splitlines()
             if line.startswith("| `")]
    assert order == [("three_way × dot vs untied", "lr × 2"),
                     ("three_way × l2norm vs `dot`", "lr × 0.5"),
                     ("three_way × l2norm vs `dot`", "lr × 2")]


def _learning(summaries: dict[str, Summary], label: str, *cells: str) -> dict[str, Summary]:
    """The summaries with the comparison of ``label`` naming ``cells`` as still learning."""
    (model,) = summaries
    cell = summaries[model][label]
    (name, test), = cell.tests.items()
    return {model: {**summaries[model], label: cell.with_test(
        name, replace(test, learning=cells))}}


def test_a_change_between_cells_still_learning_is_unresolved():
    """As the quarter's three-way dot against untied: a Δ that shrank, from a cell still
    learning at its budget here (or on the other set), is neither smaller nor larger here: the
    row says unresolved and which cell still learns where; a change the interval does not show
    stays "no change shown"."""
    there = _summary({"three_way/dot": [1.3, 1.4, 1.1], "three_way/l2norm": [0.5, 0.6, 0.4]})
    here = _summary({"three_way/dot": [-0.3, -0.1, -0.2], "three_way/l2norm": [0.2, 0.9, -0.1]})
    assert [row[-1] for row in across.rows(here, there)] == [across.SMALLER, across.NO_CHANGE]
    learning = _learning(here, "three_way/dot", "three_way/dot")
    learning = _learning(learning, "three_way/l2norm", "three_way/l2norm", "three_way/dot")
    rows = across.rows(learning, there, "the full corpus")
    assert rows[0][-1] == "unresolved (still learning at the budget: three_way/dot here)"
    assert rows[0][-2] == across.rows(here, there)[0][-2]  # the same interval beside it
    assert rows[1][-1] == across.NO_CHANGE
    elsewhere = across.rows(here, _learning(there, "three_way/dot", "three_way/dot"),
                            "the full corpus")
    assert elsewhere[0][-1] == ("unresolved (still learning at the budget: three_way/dot in "
                                "the full corpus)")
    assert "unresolved where a compared cell still learns" in across.render(
        learning, [(there, "full")])
