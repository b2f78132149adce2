"""A study's cells, typed: what ``engine`` makes of a cell's runs and every view reads.

A cell is its spec's head (which cell it is), its values in the spec's order (a metric's
:class:`Stat` over the seeds, or a fact: the seeds, the parameter counts, the runs' stops, a
value at a common epoch) and its comparisons with its baseline cells by name (a paired
:class:`Bootstrap` or a :class:`SeedDifference`). A summary is the cells of a section by label.

``summary.json`` is written through :func:`plain` alone (each type's ``to_dict``): a cell is
``{head fields..., values..., comparisons...}``, a field that is None left out but for a head's,
a Stat's ``ci95`` and a bootstrap's ``delta_ci95``; :func:`summary_of` reads one back (another
study's, for ``across``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from fairseq_tying.evaluation.metrics import METRICS
from fairseq_tying.studies.statistics.stats import stat


def _family(test: Any) -> dict[str, Any]:
    """A test's Holm fields, once a study's family adjusted it (``verdicts.adjust``)."""
    return {} if test.p_holm is None else {"p_holm": test.p_holm, "family": test.family}


def _learning(test: Any) -> dict[str, Any]:
    """The cells of a comparison still learning at their budget (none: no field)."""
    return {"learning": list(test.learning)} if test.learning else {}


@dataclass(frozen=True)
class Stat:
    """A value over a cell's seeds (``stats.stat``): each seed's, their mean and the half width
    of its 95 % CI (None for one seed)."""

    values: tuple[float, ...]
    mean: float
    ci95: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        s = stat(values)
        return cls(tuple(s["values"]), s["mean"], s["ci95"])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stat:
        return cls(tuple(data["values"]), data["mean"], data["ci95"])

    def to_dict(self) -> dict[str, Any]:
        return {"values": list(self.values), "mean": self.mean, "ci95": self.ci95}


@dataclass(frozen=True)
class Stops:
    """Where each seed's run stopped under its stopping rule, and why."""

    epochs: tuple[int, ...]
    reasons: tuple[str, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stops:
        return cls(tuple(data["epochs"]), tuple(data["reasons"]))

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": list(self.epochs), "reasons": list(self.reasons)}


@dataclass(frozen=True)
class AtEpoch:
    """A value of every seed after one epoch (the last that every run reached)."""

    epoch: int
    stat: Stat

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AtEpoch:
        return cls(data["epoch"], Stat.from_dict(data))

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, **self.stat.to_dict()}


@dataclass(frozen=True)
class Learning:
    """Whether a cell's runs still learn at their budget under the plateau rule: each seed's
    ``gain`` (the fraction by which its last ``window`` epochs improved its best validation
    value before them, ``Plateau.gain``; None where too few epochs tell), and the rule's
    ``threshold`` (its ``min_gain``). The cell still learns when the mean of its seeds' gains
    reaches the threshold, or a seed's cannot be told."""

    gains: tuple[float | None, ...]
    window: int
    threshold: float

    @property
    def gain(self) -> float | None:
        """The mean of the seeds' gains (None where one cannot be told)."""
        return None if None in self.gains else sum(self.gains) / len(self.gains)

    @property
    def still(self) -> bool:
        return self.gain is None or self.gain >= self.threshold

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Learning:
        return cls(tuple(data["gains"]), data["window"], data["threshold"])

    def to_dict(self) -> dict[str, Any]:
        return {"gains": list(self.gains), "window": self.window, "threshold": self.threshold}


@dataclass(frozen=True, kw_only=True)
class Equivalence:
    """Two one-sided t-tests of per-seed differences within ±``margin`` (``stats.tost``): the
    1 − 2α interval ``[low, high]`` over ``n`` seeds, its p, and Holm's in a family."""

    margin: float
    low: float
    high: float
    p: float
    n: int
    p_holm: float | None = None
    family: int | None = None  # m, the tests Holm adjusted together

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Equivalence:
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return {"margin": self.margin, "low": self.low, "high": self.high, "p": self.p,
                "n": self.n, **_family(self)}


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """A paired bootstrap of ``metric`` pooled over the seeds two cells share
    (``significance.compare``): the mean paired difference, its p, each seed's difference and
    p, the 95 % CI over the seeds' differences, and what the study's family adds (an
    equivalence test, Holm's p)."""

    delta: float
    p: float
    n_seeds: int
    per_seed_delta: dict[Hashable, float]
    per_seed_p: dict[Hashable, float] = field(default_factory=dict)
    delta_ci95: float | None = None  # None for one pair
    n_samples: int | None = None  # the resamples B (p ≥ 1/(B + 1))
    metric: str = "bleu"
    equivalence: Equivalence | None = None
    p_holm: float | None = None
    family: int | None = None
    learning: tuple[str, ...] = ()  # the compared cells still learning at their budget
    per_document: dict[str, float] = field(default_factory=dict)  # Δ on each test document

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Bootstrap:
        (delta,) = [k for k in data if k.startswith("delta_") and k != "delta_ci95"]
        eq = data.get("equivalence")
        return cls(**{k: v for k, v in data.items()
                      if k not in (delta, "equivalence", "learning")},
                   delta=data[delta], metric=delta.removeprefix("delta_"),
                   equivalence=None if eq is None else Equivalence.from_dict(eq),
                   learning=tuple(data.get("learning", ())))

    def to_dict(self) -> dict[str, Any]:
        out = {f"delta_{self.metric}": self.delta, "p": self.p, "n_seeds": self.n_seeds}
        if self.n_samples is not None:
            out["n_samples"] = self.n_samples
        out |= {"per_seed_p": dict(self.per_seed_p), "per_seed_delta": dict(self.per_seed_delta),
                "delta_ci95": self.delta_ci95}
        if self.equivalence is not None:
            out["equivalence"] = self.equivalence.to_dict()
        if self.per_document:
            out["per_document"] = dict(self.per_document)
        return out | _family(self) | _learning(self)


@dataclass(frozen=True, kw_only=True)
class SeedDifference:
    """A value's per-seed difference between two cells (``significance.seed_difference``): the
    differences' Stat over the shared seeds, the t-test's p, and in a family Holm's p and the
    per-seed rule's verdict (``verdicts.lower``)."""

    stat: Stat
    p: float
    seeds: tuple[Any, ...]
    p_holm: float | None = None
    family: int | None = None
    verdict: str | None = None
    learning: tuple[str, ...] = ()  # the compared cells still learning at their budget

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeedDifference:
        return cls(stat=Stat.from_dict(data), p=data["p"], seeds=tuple(data["seeds"]),
                   p_holm=data.get("p_holm"), family=data.get("family"),
                   verdict=data.get("verdict"), learning=tuple(data.get("learning", ())))

    def to_dict(self) -> dict[str, Any]:
        out = {**self.stat.to_dict(), "p": self.p, "seeds": list(self.seeds), **_family(self),
               **_learning(self)}
        return out if self.verdict is None else {**out, "verdict": self.verdict}


Test = Bootstrap | SeedDifference


def comparison_of(data: Mapping[str, Any]) -> Test:
    """A comparison of a summary.json, by its fields."""
    if "per_seed_delta" in data:
        return Bootstrap.from_dict(data)
    return SeedDifference.from_dict(data)


# --- heads: which cell a cell is, one type per spec ------------------------------------------


@dataclass(frozen=True)
class GridHead:
    """A translation study's cell (``specs.GRID``)."""

    tying: str
    output_layer: str


@dataclass(frozen=True)
class LMHead:
    """A perplexity study's cell (``specs.LM``)."""

    label: str
    tying: str
    output_layer: str
    tag: str | None


@dataclass(frozen=True)
class MethodHead:
    """A method of ``collect``'s run folders (``specs.RUNS``)."""

    method: str
    arch: str
    tying: str
    output_layer: str


Head = GridHead | LMHead | MethodHead

# the facts a cell may report besides its metrics (engine.FACTS), as read from summary.json
FACTS: dict[str, Any] = {"seeds": tuple, "params": tuple, "stop": Stops.from_dict,
                         "valid_nll_common": AtEpoch.from_dict, "learning": Learning.from_dict,
                         "datasets": tuple, "shape": tuple, "averaged": tuple,
                         "sentences": tuple, "tokens": tuple, "updates": tuple}
Value = Stat | Stops | AtEpoch | Learning | tuple


def _value_dict(value: Value) -> Any:
    """A value as summary.json holds it: a fact's tuple as a list."""
    return list(value) if isinstance(value, tuple) else value.to_dict()


@dataclass(frozen=True)
class Cell:
    """One cell's summary: its head, its values by name in the spec's order, its comparisons
    by name."""

    head: Head
    values: dict[str, Value]
    tests: dict[str, Test] = field(default_factory=dict)

    @property
    def seeds(self) -> tuple[Any, ...]:
        return self.values["seeds"]

    @property
    def params(self) -> tuple[int, ...]:
        return self.values["params"]

    @property
    def stop(self) -> Stops | None:
        """Where its runs stopped (None: not trained under a stopping rule)."""
        return self.values.get("stop")

    @property
    def valid_nll_common(self) -> AtEpoch | None:
        return self.values.get("valid_nll_common")

    @property
    def learning(self) -> Learning | None:
        """Whether its runs still learn at their budget (None: no validation history)."""
        return self.values.get("learning")

    def stat(self, metric: str) -> Stat | None:
        """The metric's mean ± CI over the seeds (None where a run lacks it)."""
        return self.values.get(metric)

    def test(self, name: str) -> Test | None:
        """The comparison ``name`` (None: no baseline cell, or no seed shared with it)."""
        return self.tests.get(name)

    def with_test(self, name: str, test: Test) -> Cell:
        return replace(self, tests={**self.tests, name: test})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], head: type = GridHead) -> Cell:
        """A cell of a summary.json whose head is ``head``: a field named in FACTS or METRICS
        is a value, any other but the head's a comparison."""
        names = {f.name for f in fields(head)}
        values = {k: FACTS[k](v) if k in FACTS else Stat.from_dict(v) for k, v in data.items()
                  if k in FACTS or k in METRICS}
        tests = {k: comparison_of(v) for k, v in data.items()
                 if k not in names and k not in values}
        return cls(head(**{k: data[k] for k in names}), values, tests)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.head),
                **{k: _value_dict(v) for k, v in self.values.items()},
                **{k: t.to_dict() for k, t in self.tests.items()}}


Summary = dict[str, Cell]  # a section's cells by label


def plain(summary: Any) -> Any:
    """``summary.json``'s content: cells (by label, or by section and label) as dicts."""
    if isinstance(summary, Cell):
        return summary.to_dict()
    return {key: plain(value) for key, value in summary.items()}


def summary_of(data: Mapping[str, Any], head: type = GridHead) -> Summary:
    """A ``summary.json``'s cells by label (one section's)."""
    return {label: Cell.from_dict(cell, head) for label, cell in data.items()}
