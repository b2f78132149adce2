"""The across-run engine: records → sections → cells → summaries, driven by a :class:`Spec`.

A study is a spec: how its runs group into cells (and cells into sections, e.g. one per
architecture), which values a cell reports (``metrics.METRICS`` and the cell facts below),
which cells it compares with which, and by which test (``significance``); the verdict rules are
in ``verdicts``. Each cell's summary is a typed ``cells.Cell``. The translation, language-model
and run-folder (``collect``) views are specs of it (``specs``), each rendered by its own tables
(``view_*``).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fairseq_tying.common.run_spec import flag_value
from fairseq_tying.evaluation.metrics import METRICS
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics.cells import (
    AtEpoch,
    Cell,
    Head,
    Learning,
    Stat,
    Stops,
    Summary,
    Test,
    Value,
)
from fairseq_tying.studies.statistics.significance import compare, seed_difference
from fairseq_tying.studies.statistics.verdicts import resamples
from fairseq_tying.sweeps.plateau import Plateau

Key = Hashable  # a cell's key, e.g. (tying, output layer)
Runs = dict[Any, Record]  # a cell's runs by member (its seed)
Cells = dict[Key, Runs]
PLATEAU = Plateau()  # every sweep's rule unless it sets its own: 3 epochs, 0.5 %


@dataclass(frozen=True)
class Context:
    """What a section's values and comparisons need besides the runs."""

    refs: Sequence[str] | None = None  # the test set's references (sentence-level tests)
    n_samples: int = 1000  # bootstrap resamples (engine.sections chooses them for a study)
    common_epoch: int | None = None  # the last epoch every run reached (runs under a rule)
    rule: Plateau = PLATEAU  # the plateau rule that tells a run still learning at its budget
    documents: Sequence[str] | None = None  # each test sentence's document (Δ per document)


@dataclass(frozen=True)
class Comparison:
    """A cell against its baseline cell: ``name`` is its key in the cell's summary."""

    name: str
    baseline: Callable[[Key, Collection[Key]], Key | None]  # (cell, cells there) -> baseline
    test: Callable[[Runs, Runs, Context], Test | None]


@dataclass(frozen=True)
class Spec:
    cell: Callable[[Record], Key]  # the cell a run belongs to
    label: Callable[[Key, list[Record]], str]  # the cell's key in the summary
    head: Callable[[Key, list[Record]], Head]  # which cell it is: its summary's first fields
    values: tuple[str, ...]  # names in METRICS or FACTS, in the summary's order
    comparisons: tuple[Comparison, ...] = ()
    order: Callable[[Key], Any] = lambda key: key  # cells sort by this
    member: Callable[[Record], Any] = lambda r: r.run.seed  # a run's key within its cell
    section: Callable[[Record], Hashable] | None = None  # records split into sections by this
    # the study's family of comparisons, once every section is summarized: the sections with
    # those comparisons adjusted (verdicts.adjust)
    family: Callable[[list[Section]], list[Section]] | None = None
    # how many tests that family will hold, from the sections' cells: the bootstrap's
    # resamples are chosen for it (verdicts.resamples)
    family_size: Callable[[list[Cells]], int] | None = None


@dataclass(frozen=True)
class Section:
    """One section of a study: its cells (runs by member) and their summaries by label."""

    key: Hashable
    cells: Cells
    summary: Summary


Where = tuple[int, str, str]  # a comparison of a study: (section's index, cell's label, name)


def with_tests(sections: list[Section], tests: dict[Where, Test]) -> list[Section]:
    """The sections with the comparisons at these places replaced (a family's adjusted tests)."""
    out = []
    for i, sec in enumerate(sections):
        summary = dict(sec.summary)
        for (j, label, name), test in tests.items():
            if j == i:
                summary[label] = summary[label].with_test(name, test)
        out.append(replace(sec, summary=summary))
    return out


def _stop(records: list[Record], ctx: Context) -> Stops | None:
    stops = [r.train.stop for r in records]
    if None in stops:  # not trained under a stopping rule
        return None
    return Stops(tuple(s.epoch for s in stops), tuple(s.reason for s in stops))


def valid_at(record: Record, epoch: int) -> float:
    """The run's validation value (the rule's metric) after ``epoch``."""
    if (value := record.train.valid_at(epoch)) is None:
        raise ValueError(f"{record.name}: no validation after epoch {epoch} in its record")
    return value


def _valid_common(records: list[Record], ctx: Context) -> AtEpoch | None:
    if ctx.common_epoch is None:
        return None
    return AtEpoch(ctx.common_epoch, Stat.of([valid_at(r, ctx.common_epoch) for r in records]))


def _shape(record: Record) -> str:
    """``2+2 layers, D = 128`` from a run's training flags, ``2 layers, D = 128`` for a
    language model (a decoder alone); "" where they do not say."""
    args = record.run.train_args
    if record.is_lm:
        layers, dim = flag_value(args, "--decoder-layers"), flag_value(args, "--decoder-embed-dim")
        return f"{layers} layer{'s' * (layers != '1')}, D = {dim}" if layers and dim else ""
    layers, dim = flag_value(args, "--encoder-layers"), flag_value(args, "--encoder-embed-dim")
    return (f"{layers}+{flag_value(args, '--decoder-layers')} layers, D = {dim}"
            if layers and dim else "")


def _sizes(values: list[int | None]) -> tuple[int, ...] | None:
    """The distinct sizes of the runs' test sets (None where no run says)."""
    return tuple(sorted({v for v in values if v is not None})) or None


def _updates(records: list[Record], ctx: Context) -> tuple[int, ...] | None:
    """The updates trained by runs not under a stopping rule (a fixed number of updates);
    None for runs under one (their ``stop`` says) or without a training record."""
    if any(r.train is None or r.train.stop is not None for r in records):
        return None
    return _sizes([int(u) if (u := r.train.valid.get("num_updates")) is not None else None
                   for r in records])


def _learning(records: list[Record], ctx: Context) -> Learning | None:
    """Each run's gain over its last ``patience`` epochs under the plateau rule (None where
    its record holds too few validations to tell, or none: it cannot be shown to have
    flattened); None for runs without a training record (``collect``'s run folders)."""
    if any(r.train is None for r in records):
        return None
    gains = tuple(ctx.rule.gain([v for _e, _u, v in r.train.valid_epochs or ()])
                  for r in records)
    return Learning(gains, ctx.rule.patience, ctx.rule.min_gain)


# Cell facts: what a cell reports besides the metrics' mean ± CI (None: the cell has none);
# cells.FACTS reads them back.
FACTS: dict[str, Callable[[list[Record], Context], Value | None]] = {
    "seeds": lambda records, ctx: tuple(r.run.seed for r in records),
    "params": lambda records, ctx: tuple(sorted({r.train.params for r in records})),
    "stop": _stop,
    "valid_nll_common": _valid_common,
    "learning": _learning,
    # what the cell's runs are, for an answer's scope: their data, model shape, averaging
    "datasets": lambda records, ctx: tuple(sorted({r.run.dataset for r in records})),
    "shape": lambda records, ctx: tuple(sorted({_shape(r) for r in records})),
    "averaged": lambda records, ctx: tuple(sorted({len(r.eval.averaged or ()) for r in records})),
    # the test set's size: a translation's sentences, a language model's tokens
    "sentences": lambda records, ctx: _sizes([getattr(r.eval, "n_sentences", None)
                                              for r in records]),
    "tokens": lambda records, ctx: _sizes([getattr(r.eval, "n_tokens", None) for r in records]),
    "updates": _updates,
}


def cell_value(name: str, records: list[Record], ctx: Context) -> Value | None:
    """The cell's ``name``: a fact, or a metric's Stat (None where a run lacks an optional
    metric)."""
    if name in FACTS:
        return FACTS[name](records, ctx)
    values = [METRICS[name].of(r) for r in records]
    return None if None in values else Stat.of(values)


def common_epoch(records: list[Record]) -> int | None:
    """The last epoch that every run trained under a stopping rule reached (None unless all
    were, with their per-epoch validation): where the runs compare at equal training."""
    if not records or not all(r.train.stop is not None and r.train.valid_epochs is not None
                              for r in records):
        return None
    return min(r.train.stop.epoch for r in records)


def group(spec: Spec, records: Sequence[Record]) -> Cells:
    """The runs of each cell by member, cells in the spec's order; a member twice is an error."""
    cells: dict[Key, Runs] = defaultdict(dict)
    for r in records:
        key, member = spec.cell(r), spec.member(r)
        if member in cells[key]:
            raise ValueError(f"two records for {key} seed {r.run.seed} ({r.name})")
        cells[key][member] = r
    return {k: dict(sorted(cells[k].items())) for k in sorted(cells, key=spec.order)}


def summarize(spec: Spec, cells: Cells, ctx: Context) -> Summary:
    """Per cell, by label: its head, its values, then its comparisons with its baselines, each
    naming the cells it compares that still learn at their budget."""
    out = {}
    labels = {key: spec.label(key, list(runs.values())) for key, runs in cells.items()}
    learning = {key: _learning(list(runs.values()), ctx) for key, runs in cells.items()}
    for key, runs in cells.items():
        records = list(runs.values())
        values = {name: value for name in spec.values
                  if (value := cell_value(name, records, ctx)) is not None}
        tests = {}
        for comp in spec.comparisons:
            base = comp.baseline(key, cells.keys())
            if base is not None and base in cells and \
                    (test := comp.test(runs, cells[base], ctx)) is not None:
                still = tuple(labels[k] for k in (key, base)
                              if learning[k] is not None and learning[k].still)
                tests[comp.name] = replace(test, learning=still) if still else test
        out[labels[key]] = Cell(spec.head(key, records), values, tests)
    return out


def sections(spec: Spec, records: Sequence[Record], refs: Sequence[str] | None = None,
             n_samples: int | None = None, rule: Plateau = PLATEAU,
             documents: Sequence[str] | None = None) -> list[Section]:
    """The study's sections (the largest first), each grouped and summarized; the bootstrap
    draws ``n_samples`` resamples, by default as many as the spec's family needs
    (``verdicts.resamples``); ``rule`` tells a run still learning at its budget."""
    by_key: dict[Hashable, list[Record]] = defaultdict(list)
    for r in records:
        by_key[spec.section(r) if spec.section else None].append(r)
    keys = sorted(by_key, key=lambda k: -len(by_key[k]))  # stable: ties keep their order
    grouped = {key: group(spec, by_key[key]) for key in keys}
    if n_samples is None:
        n_samples = resamples(spec.family_size(list(grouped.values()))
                              if spec.family_size else 0)
    out = []
    for key, cells in grouped.items():
        ctx = Context(refs, n_samples, common_epoch(by_key[key]) if
                      "valid_nll_common" in spec.values else None, rule, documents)
        out.append(Section(key, cells, summarize(spec, cells, ctx)))
    return out if spec.family is None else spec.family(out)


def check_references(records: Sequence[Record], refs: Sequence[str]) -> None:
    """Every record was scored against ``refs`` and has one hypothesis per reference."""
    digest = hashlib.sha256(("\n".join(refs) + "\n").encode("utf-8")).hexdigest()
    for r in records:
        if r.eval.references_sha256 != digest:
            raise ValueError(f"{r.name} was scored against other references than --references"
                             f" (sha256 {r.eval.references_sha256[:12]}…, "
                             f"given {digest[:12]}…)")
        if len(r.hypotheses) != len(refs):
            raise ValueError(f"{r.name}: {len(r.hypotheses)} hypotheses for "
                             f"{len(refs)} references")


def paired_bootstrap(metric: str = "bleu") -> Callable[[Runs, Runs, Context], Test | None]:
    """The test of two cells' ``metric``: the paired bootstrap over the seeds they share."""
    def test(runs: Runs, base: Runs, ctx: Context) -> Test | None:
        shared = sorted(set(runs) & set(base))
        if not shared:
            return None
        return compare([(s, runs[s], base[s]) for s in shared], ctx.refs, ctx.n_samples, metric,
                       ctx.documents if metric == "bleu" else None)

    return test


def seed_differences(metric: str) -> Callable[[Runs, Runs, Context], Test | None]:
    """The test of two cells' ``metric``: the CI of its per-seed differences."""
    return lambda runs, base, ctx: seed_difference(runs, base, metric)


def band(records: Sequence[Record], transform: Callable[[float], float] = float
         ) -> tuple[list, list, list, list]:
    """Per epoch: the mean, min and max of the (transformed) validation value over the runs
    that reached it."""
    points: dict[int, list[float]] = defaultdict(list)
    for r in records:
        for epoch, _update, value in r.train.valid_epochs:
            points[epoch].append(transform(value))
    xs = sorted(points)
    return (xs, [float(np.mean(points[x])) for x in xs], [min(points[x]) for x in xs],
            [max(points[x]) for x in xs])
