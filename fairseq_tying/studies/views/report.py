"""A study's reports: its records → the marked blocks of its report files, ``summary.json`` and
the plots.

A view renders the sections of one spec (``engine``, ``specs``) as a block of Markdown; a study
lists its report targets (file, block, view), the first of which also writes ``summary.json``
and the plots. A block starts with how many of the study's runs are recorded when the number it
expects is known (its sweep's runs); with no record yet that line is the whole block.
``rebuild`` does all of it for a study of the manifest (``launch.studies``), and renders the
summaries (README's short answer) it is the first source with records of.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fairseq_tying.common import DOCS_SUFFIX
from fairseq_tying.common.atomic import read_lines, write_json
from fairseq_tying.common.blocks import replace_block
from fairseq_tying.data.bible import books, read_split
from fairseq_tying.studies.engine import engine
from fairseq_tying.studies.engine.engine import Section, Spec
from fairseq_tying.studies.engine.specs import GRID, LM
from fairseq_tying.studies.records import records
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.statistics.cells import plain
from fairseq_tying.studies.views import view_answer, view_equal, view_grid, view_lm


@dataclass(frozen=True)
class View:
    spec: Spec
    # -> (block text, its summary: the cells by label, or by section then label; None: none)
    render: Callable[[list[Section]], tuple[str, Any]]
    plots: Callable[[list[Section], Path], list[Path]] | None = None
    new_file: str = "# Results\n"  # the start of a report file the block creates
    sentences: bool = True  # compares hypotheses: needs the test set's references


VIEWS: dict[str, View] = {
    "translation": View(GRID, view_grid.render, view_grid.plots),
    "equal": View(GRID, view_equal.render, view_equal.plots),
    "lm": View(LM, view_lm.render, view_lm.plots, "# Language models\n", sentences=False),
    "does_it_help": View(GRID, view_answer.render),
}


@dataclass(frozen=True)
class Target:
    """A marked block of a report file, rendered by a view."""

    file: Path
    block: str
    view: str


def auto_view(recs: Sequence[Record], where: str | os.PathLike) -> str:
    """``lm`` for language-model records, ``translation`` for translation records."""
    lm = sum(r.is_lm for r in recs)
    if lm and lm != len(recs):
        raise ValueError(f"{where}: language-model and translation records mixed; keep each "
                         "study's records in a folder of its own")
    return "lm" if lm else "translation"


def view_of(name: str) -> View:
    if name not in VIEWS:
        raise ValueError(f"view {name!r} is unknown; views: {', '.join(VIEWS)}")
    return VIEWS[name]


def recorded(n: int, expected: int | None) -> str:
    """``21 of 39 runs are recorded.`` ("" when the expected number is not known)."""
    if expected is None:
        return ""
    return f"{n} of {expected} run{'s' * (expected != 1)} {'is' if n == 1 else 'are'} recorded."


class Renderer:
    """Renders views of one study's records, each spec's sections computed once."""

    def __init__(self, recs: list[Record], refs: Sequence[str] | None,
                 n_samples: int | None = None, expected: int | None = None,
                 documents: Sequence[str] | None = None) -> None:
        self.records, self.refs, self.n_samples, self.expected = recs, refs, n_samples, expected
        self.documents = documents if documents is not None else bible_documents(refs)
        self._sections: dict[int, list[Section]] = {}

    def sections(self, view: View) -> list[Section]:
        key = id(view.spec)
        if key not in self._sections:
            if view.sentences:
                engine.check_references(self.records, self.refs)
            self._sections[key] = engine.sections(view.spec, self.records, self.refs,
                                                  self.n_samples, documents=self.documents)
        return self._sections[key]

    def block(self, name: str, count: bool = True) -> tuple[str, Any]:
        """The block text of view ``name`` (led by the count of recorded runs, unless not
        ``count``) and its summary (None without records)."""
        line = recorded(len(self.records), self.expected) if count else ""
        if not self.records:
            return line, None
        text, summary = view_of(name).render(self.sections(view_of(name)))
        return (f"{line}\n\n{text}" if line else text), summary

    def write(self, target: Target, count: bool = True, lead: str = "") -> tuple[str, Any]:
        """Render ``target``'s view into its block, after a ``lead`` line if given."""
        text, summary = self.block(target.view, count)
        text = f"{lead}\n\n{text}" if lead and self.records else text
        replace_block(target.file, target.block, text, new_file=view_of(target.view).new_file)
        return text, summary

    def plots(self, name: str, plots_dir: Path, summary: Any) -> list[Path]:
        """``summary.json`` and the view's plots in ``plots_dir`` (nothing without records)."""
        if not self.records:
            return []
        view = view_of(name)
        plots_dir.mkdir(parents=True, exist_ok=True)
        pngs = view.plots(self.sections(view), plots_dir) if view.plots else []
        return [write_json(plots_dir / "summary.json", plain(summary), indent=1), *pngs]


def build(records_dir: str | os.PathLike, targets: Sequence[Target],
          plots_dir: str | os.PathLike, refs: Sequence[str] | None,
          runs: str | os.PathLike | None = None, n_samples: int | None = None,
          expected: int | None = None, row_norms: bool = True,
          select: Sequence[str] = ()) -> dict[str, Any]:
    """Export the records of newly evaluated runs (``runs``), then rebuild every target's block
    and, with the first target's view, ``summary.json`` and the plots, from the records alone.
    A target's view ``auto`` is ``lm`` or ``translation`` by the records' task. Without an
    ``expected`` number of runs, a study needs at least one record; ``select``: only the records
    whose run name matches one of its globs."""
    exported = records.export(runs, records_dir, row_norms) if runs else []
    recs = records.load(records_dir, allow_empty=expected is not None, select=select)
    targets = [replace(t, view=auto_view(recs, records_dir)) if t.view == "auto" else t
               for t in targets]
    renderer = Renderer(recs, refs, n_samples, expected)
    first, summary = renderer.write(targets[0])
    written = [str(targets[0].file)]
    for target in targets[1:]:
        renderer.write(target)
        written.append(str(target.file))
    written += map(str, renderer.plots(targets[0].view, Path(plots_dir), summary))
    return {"exported": exported, "records": len(recs), "markdown": first, "written": written,
            "renderer": renderer}


def bible_documents(refs: Sequence[str] | None) -> list[str] | None:
    """The book of each reference where ``refs`` are the embedded Bible's test set (either
    side), else None."""
    if refs is None:
        return None
    for lang in ("en", "es"):
        if list(refs) == read_split("test", lang):
            return books("test")
    return None


def documents(refs_path: Path) -> list[str] | None:
    """A user's test documents: ``REFS.docs`` beside the references, one name per line (what
    ``data.prepare`` copies from the corpus's ``test.docs``)."""
    path = Path(f"{refs_path}{DOCS_SUFFIX}")
    return read_lines(path) if path.is_file() else None


def references(path: str | os.PathLike | None) -> list[str]:
    """The test set's references: ``path``, else the embedded Bible's test.en."""
    if path is None:
        return read_split("test", "en")
    return read_lines(path)


# --- a study of the manifest -------------------------------------------------------------


@dataclass(frozen=True)
class StudyReport:
    """What a study's report is rebuilt from and into: its records, plots folder and report
    blocks, and the test set's references (None: the embedded Bible's test.en)."""

    name: str
    records: Path
    plots: Path
    reports: tuple[Target, ...]
    references: Path | None = None
    select: tuple[str, ...] = ()  # globs of run names: the records it reads (empty: all)


@dataclass(frozen=True)
class Summary:
    """A block rendered from the first of several studies whose records answer it."""

    target: Target
    sources: tuple[StudyReport, ...]  # the first with records that answer it renders it


def summary_lead(name: str, records: int) -> str:
    """The line that names the study a summary block is rendered from."""
    return f"From the `{name}` study's {records} records."


def summary_source(summary: Summary) -> str | None:
    """The first study of ``summary.sources`` whose records answer the summary's question
    (``does_it_help``: every cell of the answer with all its seeds; other views: any record);
    when none does yet, the first with records."""
    with_records = {study.name: records.load(study.records, allow_empty=True, hypotheses=False,
                                             select=study.select)
                    for study in summary.sources}
    for name, found in with_records.items():
        if found and (summary.target.view != "does_it_help" or view_answer.answers(found)):
            return name
    return next((name for name, found in with_records.items() if found), None)


def _moved(path: Path, out: Path | None) -> Path:
    """``path`` under ``out`` (same relative path), a copy of it there for a report file."""
    if out is None:
        return path
    rel = path.resolve().relative_to(Path.cwd().resolve()) if path.is_absolute() else path
    moved = out / rel
    if path.is_file() and not moved.exists():
        moved.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, moved)
    return moved


def rebuild(study: StudyReport, expected: int | None, summaries: Sequence[Summary] = (),
            runs: Path | None = None, row_norms: bool = True, n_samples: int | None = None,
            out: Path | None = None) -> dict[str, Any]:
    """Export the records of newly evaluated runs under ``runs`` (none: the committed records
    alone), then rebuild the study's reports and plots (led by the count of its ``expected``
    runs) and the ``summaries`` it is the first source with records of; with ``out``, under
    that folder instead of in place."""
    done = build(study.records, [replace(t, file=_moved(t.file, out)) for t in study.reports],
                 _moved(study.plots, out), references(study.references), runs, n_samples,
                 expected, row_norms, study.select)
    renderer, written = done.pop("renderer"), done["written"]
    for s in summaries:
        if study.name in (src.name for src in s.sources) and summary_source(s) == study.name:
            target = replace(s.target, file=_moved(s.target.file, out))
            renderer.write(target, count=False, lead=summary_lead(study.name, done["records"]))
            written.append(str(target.file))
    return {**done, "expected": renderer.expected}
