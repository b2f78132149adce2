"""The studies' specs (``engine.Spec``): how runs group into cells, what a cell reports, and
which comparisons it makes; the papers' claims that the verdict rule decides.

- ``GRID``: a translation study, a cell per (tying, output layer) and a section per
  architecture; each cell against ``dot`` with its tying and against the untied model with its
  output layer (paired bootstrap of BLEU over the seeds).
- ``LM``: the perplexity study, a cell per (tying, output layer, tag); each cell against the
  untied dot-product model, and each decoder-tied cell against the decoder-tied dot-product
  model (the per-seed difference of test perplexity).
- ``RUNS``: ``collect``'s view of the evaluated run folders of one test set, a cell per
  method, its scores over its runs and no comparison (a sweep's comparisons are its answer's,
  ``GRID``'s).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

from fairseq_tying.common.run_spec import CELL_TAG, flag_value
from fairseq_tying.core import output_layers
from fairseq_tying.core.models.tying import DECODER, THREE_WAY, UNTIED, tying_mode
from fairseq_tying.core.output_layers import BASELINE
from fairseq_tying.studies.engine.engine import (
    Cells,
    Comparison,
    Key,
    Section,
    Spec,
    paired_bootstrap,
    seed_differences,
    with_tests,
)
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics import verdicts
from fairseq_tying.studies.statistics.cells import (
    Bootstrap,
    Cell,
    GridHead,
    Learning,
    LMHead,
    MethodHead,
    Summary,
)

# --- translation: (tying, output layer) cells ------------------------------------------------

# a claim's comparison under the protocol's other choices: its name plus one of these
ALSO = {"_chrf": "chrF", "_best": "the best checkpoint"}
def grid_layer(record: Record) -> str:
    """A run's output layer as its cell names it (a tagged cell, "dot+zloss", is compared with
    the same tying's `dot`)."""
    return record.run.cell_layer()


def layer_order(layer: str) -> tuple:
    """Where a cell's layer sorts: the registry's order, tagged cells after every plain one."""
    names = output_layers.names()
    base = layer.split(CELL_TAG)[0]
    return (CELL_TAG in layer, names.index(base) if base in names else len(names), layer)


def _vs_dot(key: Key, cells: Collection[Key]) -> Key | None:
    tying, layer = key
    return None if layer == BASELINE else (tying, BASELINE)


def _vs_untied(key: Key, cells: Collection[Key]) -> Key | None:
    tying, layer = key
    return None if tying == UNTIED.name else (UNTIED.name, layer)


def claim_family(sections: list[Section]) -> list[Section]:
    """Holm over the study's tests: every claim's comparison in every section (model), and the
    equivalence test (``stats.tost``, within the claim's margin) of each claim that BLEU is
    unchanged; the sections with those tests adjusted."""
    found = []  # (where, the claim's bootstrap, its equivalence test or None)
    for i, sec in enumerate(sections):
        for claim, test in claims_tests(sec.summary):
            eq = verdicts.equivalence(test, claim.margin) \
                if claim.expects == verdicts.UNCHANGED else None
            found.append(((i, claim.cell, claim.test), test, eq))
    # the family in order: each claim's bootstrap, then its equivalence test where it has one
    adjusted = iter(verdicts.adjust([t for _, test, eq in found for t in (test, eq)
                                     if t is not None]))
    tests = {}
    for where, _, eq in found:
        test = next(adjusted)
        tests[where] = test if eq is None else replace(test, equivalence=next(adjusted))
    for also in ALSO:  # each other choice its own family, over the same claims
        others = [((i, cell, name + also), test) for (i, cell, name), _, _ in found
                  if (test := sections[i].summary[cell].test(name + also)) is not None]
        tests |= dict(zip([w for w, _ in others],
                          verdicts.adjust([t for _, t in others]), strict=True))
    return with_tests(sections, tests)


def claim_family_size(sections: list[Cells]) -> int:
    """How many tests ``claim_family`` will adjust, from the cells alone (before any
    comparison is made, so that the bootstrap's resamples can be chosen for it): a claim whose
    cell and baseline cell share a seed, and its equivalence test where they share two."""
    baselines = {"vs_dot": _vs_dot, "vs_untied": _vs_untied}
    m = 0
    for cells in sections:
        for c in study_claims("/".join(k) for k in cells):
            key = tuple(c.cell.split("/"))
            base = baselines[c.test](key, cells.keys())
            shared = len(set(cells.get(key, {})) & set(cells.get(base, {})))
            m += (shared >= 1) + (c.expects == verdicts.UNCHANGED and shared >= 2)
    return m


GRID = Spec(
    cell=lambda r: (r.run.tying, grid_layer(r)),
    label=lambda key, records: f"{key[0]}/{key[1]}",
    head=lambda key, records: GridHead(*key),
    values=("seeds", "bleu", "chrf", "valid_nll", "params", "stop", "bleu_best",
            "valid_nll_common", "learning", "datasets", "shape", "averaged", "sentences",
            "updates"),
    comparisons=(Comparison("vs_dot", _vs_dot, paired_bootstrap("bleu")),
                 Comparison("vs_untied", _vs_untied, paired_bootstrap("bleu")),
                 # the protocol's other choices: chrF instead of BLEU, and the best-validation
                 # checkpoint (its corpus BLEU per seed) instead of the last-5 average
                 *(Comparison(f"{name}{also}", base, test)
                   for name, base in (("vs_dot", _vs_dot), ("vs_untied", _vs_untied))
                   for also, test in (("_chrf", paired_bootstrap("chrf")),
                                      ("_best", seed_differences("bleu_best"))))),
    section=lambda r: r.run.arch,
    family=claim_family,
    family_size=claim_family_size,
)

PRESS_WOLF = "Press & Wolf (2017)"
# tying modes whose matrix is shared by the output layer, as in the normalization paper
SHARED = (THREE_WAY.name, DECODER.name)


@dataclass(frozen=True)
class Claim:
    """A paper's claim about one comparison of a ``GRID`` cell."""

    text: str
    source: str
    cell: str  # the summary's "tying/layer" key
    test: str  # "vs_untied" or "vs_dot": which comparison of the cell
    expects: str  # verdicts.GAIN or verdicts.UNCHANGED
    margin: float = verdicts.MARGIN  # BLEU: what "unchanged" tolerates (verdicts.UNCHANGED)
    # what its source paper claims where that is less than ``expects`` (verdicts.NO_HARM: the
    # paper's "without harming" beside the study's "unchanged"; verdicts.on_paper reads it)
    paper: str = ""


def normalized() -> list[str]:
    """The registered output layers but ``dot``: each one's claim is that it beats ``dot``."""
    return [la for la in output_layers.names() if la != BASELINE]


def study_claims(cells: Iterable[str] = ()) -> list[Claim]:
    """Tying keeps BLEU (with ``dot``; Press & Wolf's claim is that it does no harm); each
    normalized layer beats ``dot`` on a shared matrix (its paper's claim:
    ``OutputLayer.citation``); and each tagged cell among ``cells`` (their "tying/layer"
    labels) beats its tying's ``dot``, a claim of no paper."""
    tying = [Claim(f"{tying_mode(t).label} tying does not harm BLEU (`{BASELINE}`)",
                   PRESS_WOLF, f"{t}/{BASELINE}", "vs_untied", verdicts.UNCHANGED,
                   paper=verdicts.NO_HARM) for t in SHARED]
    layers = [Claim(f"`{la}` beats `{BASELINE}` ({tying_mode(t).label} tying)",
                    output_layers.get(la).citation, f"{t}/{la}", "vs_dot",
                    verdicts.GAIN) for t in SHARED for la in normalized()]
    tagged = [Claim(f"`{la}` beats `{BASELINE}` ({tying_mode(t).label} tying)", "",
                    f"{t}/{la}", "vs_dot", verdicts.GAIN)
              for t, la in sorted((tuple(c.split("/")) for c in set(cells) if CELL_TAG in c),
                                  key=lambda k: layer_order(k[1])) if t in SHARED]
    return tying + layers + tagged


def claims_tests(summary: Summary) -> list[tuple[Claim, Bootstrap]]:
    """The study's claims whose comparison the summary has, each with that comparison."""
    return [(c, test) for c in study_claims(summary)
            if c.cell in summary and (test := summary[c.cell].test(c.test)) is not None]


def claims_between(keys: Collection[Key]) -> list[Claim]:
    """The study's claims whose cell and the cell it is compared with are both among ``keys``
    (``(tying, output layer)`` pairs, e.g. one architecture's cells of a sweep's grid)."""
    baselines = {"vs_dot": _vs_dot, "vs_untied": _vs_untied}
    return [c for c in study_claims("/".join(k) for k in keys)
            if (key := tuple(c.cell.split("/"))) in keys
            and baselines[c.test](key, keys) in keys]


def baseline_label(cell: Cell, test: str) -> str:
    """The summary's key of the cell that a ``GRID`` cell's ``vs_dot`` or ``vs_untied``
    comparison is made against."""
    key = {"vs_dot": _vs_dot, "vs_untied": _vs_untied}[test](
        (cell.head.tying, cell.head.output_layer), ())
    return f"{key[0]}/{key[1]}"


def family_of(summaries: Iterable[Summary]
              ) -> tuple[list[Bootstrap], set[float], Learning | None]:
    """What a legend states of a study's claims (``formatting.legend``): their tests, the
    margins of those that BLEU is unchanged, and a cell's convergence check (its rule's
    numbers; None where no cell has one)."""
    summaries = list(summaries)
    pairs = [pair for summary in summaries for pair in claims_tests(summary)]
    learning = next((c.learning for summary in summaries for c in summary.values()
                     if c.learning is not None), None)
    return ([test for _, test in pairs],
            {c.margin for c, _ in pairs if c.expects == verdicts.UNCHANGED}, learning)


def changed_by_holm(test: Bootstrap, expects: str) -> tuple[str, str] | None:
    """(raw-p outcome, outcome) of a claim whose outcome Holm–Bonferroni changed, else None."""
    before = verdicts.outcome(verdicts.bootstrap(verdicts.without_holm(test), expects))
    now = verdicts.outcome(verdicts.bootstrap(test, expects))
    return None if before == now else (before, now)


def claims_of(summary: Summary) -> list[tuple[Claim, Bootstrap, str]]:
    """The claims whose comparison the summary has, each with it and its verdict."""
    return [(c, test, verdicts.bootstrap(test, c.expects, c.margin))
            for c, test in claims_tests(summary)]


# --- language models: (tying, output layer, tag) cells ---------------------------------------

LM_BASELINE: Key = (UNTIED.name, BASELINE, "")
LM_TIED: Key = (DECODER.name, BASELINE, "")


def lm_label(key: Key, records: list[Record]) -> str:
    tying, layer, tag = key
    text = f"{tying} × {layer}"
    if tag:
        dims = sorted({flag_value(r.run.train_args, "--tied-embed-dim") for r in records} - {None})
        text += f" + {tag}" + (f" (D = {', '.join(dims)})" if dims else "")
    return text



def _lm_order(key: Key) -> tuple:
    tying, layer, tag = key
    layers = output_layers.names()
    return (tag != "", tag, tying != UNTIED.name, layers.index(layer) if layer in layers else 99)



def lm_family(sections: list[Section]) -> list[Section]:
    """Holm over every comparison of the perplexity study (each a claim that the cell's test
    perplexity is lower than its baseline's), then each one's verdict (``verdicts.lower``)."""
    found = [((i, label, c.name), test) for i, sec in enumerate(sections)
             for label, cell in sec.summary.items() for c in LM.comparisons
             if (test := cell.test(c.name)) is not None]
    adjusted = verdicts.adjust([test for _, test in found])
    return with_tests(sections, {where: replace(test, verdict=verdicts.lower(test))
                                 for (where, _), test in zip(found, adjusted, strict=True)})


LM = Spec(
    cell=lambda r: (r.run.tying, r.run.output_layer, r.run.tag or ""),
    label=lm_label,
    head=lambda key, records: LMHead(lm_label(key, records), key[0], key[1], key[2] or None),
    values=("seeds", "test_ppl", "test_loss", "params", "test_ppl_best", "stop",
            "valid_nll_common", "learning", "datasets", "shape", "averaged", "tokens"),
    comparisons=(
        Comparison("vs_untied_dot", lambda key, cells: None if key == LM_BASELINE
                   else LM_BASELINE, seed_differences("test_ppl")),
        Comparison("vs_tied_dot", lambda key, cells: LM_TIED if key[0] == LM_TIED[0]
                   and key != LM_TIED else None, seed_differences("test_ppl"))),
    order=_lm_order,
    family=lm_family,
)

# --- evaluated run folders (collect): a cell per method, no comparison ----------------------

RUN_METRICS = ("bleu", "tok_bleu", "chrf")


def test_set(r: Record) -> tuple:
    """The section of a run folder's record: the test set it was scored on."""
    ev = r.eval
    return ev.corpus, ev.src, ev.tgt, ev.subset, ev.references_sha256


RUNS = Spec(
    cell=lambda r: r.run.method,
    label=lambda key, records: key,
    head=lambda key, records: MethodHead(key, records[0].run.arch, records[0].run.tying,
                                         records[0].run.output_layer),
    values=("seeds", *RUN_METRICS),
    member=lambda r: (r.run.seed is None, r.run.seed or 0, r.name),
)
