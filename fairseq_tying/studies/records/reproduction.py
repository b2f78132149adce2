"""A run trained again beside its committed record: per run, each score of the reproduction
against the record's, the difference, and whether it lies within the range (min–max) of the
committed seeds of the run's cell, with the machine of both.

``python -m fairseq_tying.launch study NAME --reproduce DIR`` trains the runs and calls
:func:`compare`; :func:`facts` is the one place a record is read here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from fairseq_tying.common.atomic import write_json, write_text
from fairseq_tying.common.reproducible import cpu_name
from fairseq_tying.common.run_spec import Identity
from fairseq_tying.common.tables import markdown_table
from fairseq_tying.studies.records.records import Record

NOT_RECORDED = "not recorded"
SPREAD = "min–max of the cell's committed seeds"
# the decimals a score is shown with (the records' own precision)
DECIMALS = {"BLEU": 2, "chrF": 2, "perplexity": 2, "valid NLL": 3}


@dataclass(frozen=True)
class Facts:
    """What a comparison reads of one record: its scores by name, and its machine."""

    scores: dict[str, float]
    cpu: str | None
    torch: str | None


def facts(record: Record) -> Facts:
    """The scores (translation: BLEU, chrF; language model: perplexity; both: the last
    validation's NLL) and the machine (``train.cpu``, ``train.torch``) of ``record``."""
    ev, train = record.eval, record.train
    scores = ({"perplexity": ev.perplexity} if record.is_lm
              else {"BLEU": ev.bleu, "chrF": ev.chrf})
    scores["valid NLL"] = train.valid_nll
    return Facts(scores, train.cpu, train.torch)


def cell(name: str) -> str:
    """The run's cell: its name without the seed (``…three_way.dot.s1`` -> ``…three_way.dot``)."""
    return Identity.split_name(name)[0]


@dataclass(frozen=True)
class Score:
    """One score of a reproduced run beside its record's and its cell's committed seeds."""

    metric: str
    record: float
    reproduction: float
    difference: float
    seeds_min: float
    seeds_max: float
    n_seeds: int
    within: bool


def compare_run(reproduced: Record, committed: list[Record]) -> dict[str, Any]:
    """The scores of ``reproduced`` against its record among the study's ``committed``
    records, and the machine of both."""
    mine = facts(reproduced)
    record = facts(next(r for r in committed if r.name == reproduced.name))
    seeds = [facts(r) for r in committed if cell(r.name) == cell(reproduced.name)]
    scores = []
    for metric, value in mine.scores.items():
        values = [s.scores[metric] for s in seeds]
        low, high = min(values), max(values)
        scores.append(Score(metric, record.scores[metric], value,
                            value - record.scores[metric], low, high, len(values),
                            low - 1e-9 <= value <= high + 1e-9))
    this_cpu = mine.cpu or cpu_name()
    return {"run": reproduced.name, "scores": [asdict(s) for s in scores],
            "machine": {"record": {"cpu": record.cpu or NOT_RECORDED,
                                   "torch": record.torch or NOT_RECORDED},
                        "reproduction": {"cpu": this_cpu,
                                         "torch": mine.torch or version("torch")}}}


def compare(study: str, reproduced: list[Record], committed: list[Record]) -> dict[str, Any]:
    """The comparison of every reproduced run with its committed record."""
    return {"study": study, "spread": SPREAD,
            "runs": [compare_run(r, committed) for r in reproduced]}


def _num(metric: str, value: float, sign: bool = False) -> str:
    return f"{value:{'+' if sign else ''}.{DECIMALS.get(metric, 3)}f}"


def markdown(comparison: dict[str, Any]) -> str:
    """The comparison as Markdown: the scores, then the machines."""
    rows, machines = [], []
    for run in comparison["runs"]:
        for s in run["scores"]:
            m = s["metric"]
            rows.append([run["run"], m, _num(m, s["record"]), _num(m, s["reproduction"]),
                         _num(m, s["difference"], sign=True),
                         f"{_num(m, s['seeds_min'])}–{_num(m, s['seeds_max'])} "
                         f"({s['n_seeds']} seed{'s' * (s['n_seeds'] != 1)})",
                         "within" if s["within"] else "outside"])
        rec, rep = run["machine"]["record"], run["machine"]["reproduction"]
        machines.append([run["run"], rec["cpu"], rec["torch"], rep["cpu"], rep["torch"]])
    return (f"# Reproduction of the `{comparison['study']}` study's runs\n\n"
            f"Each score of the reproduction against the committed record; \"within\": inside "
            f"the {SPREAD} (their range).\n\n"
            + markdown_table(["run", "score", "record", "reproduction", "difference",
                              "committed seeds (min–max)", "seed range"], rows)
            + "\nMachines:\n\n"
            + markdown_table(["run", "record's CPU", "record's torch", "reproduction's CPU",
                              "reproduction's torch"], machines))


def write(comparison: dict[str, Any], out: Path) -> str:
    """``out/comparison.json`` and ``out/comparison.md`` (each written atomically); the
    Markdown."""
    text = markdown(comparison)
    write_json(out / "comparison.json", comparison, indent=1)
    write_text(out / "comparison.md", text)
    return text
