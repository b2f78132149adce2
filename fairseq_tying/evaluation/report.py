"""A study's reports: its records → the marked blocks of its report files, ``summary.json`` and
the plots.

A view renders the sections of one spec (``engine``, ``specs``) as a block of Markdown; a study
lists its report targets (file, block, view), the first of which also writes ``summary.json``
and the plots. A block starts with how many of the study's runs are recorded when the number it
expects is known (its sweep's runs); with no record yet that line is the whole block.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fairseq_tying.common.atomic import replace_block, write_json
from fairseq_tying.evaluation import (
    engine,
    records,
    view_equal,
    view_grid,
    view_help,
    view_lm,
)
from fairseq_tying.evaluation.engine import Section, Spec
from fairseq_tying.evaluation.records import Record
from fairseq_tying.evaluation.specs import GRID, LM


@dataclass(frozen=True)
class View:
    spec: Spec
    render: Callable[[list[Section]], tuple[str, Any]]  # -> (block text, summary.json)
    plots: Callable[[list[Section], Path], list[Path]] | None = None
    new_file: str = "# Results\n"  # the start of a report file the block creates
    sentences: bool = True  # compares hypotheses: needs the test set's references


VIEWS: dict[str, View] = {
    "translation": View(GRID, view_grid.render, view_grid.plots),
    "equal": View(GRID, view_equal.render, view_equal.plots),
    "lm": View(LM, view_lm.render, view_lm.plots, "# Language models\n", sentences=False),
    "does_it_help": View(GRID, view_help.render),
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

    def __init__(self, recs: list[Record], refs: Sequence[str] | None, n_samples: int = 1000,
                 expected: int | None = None) -> None:
        self.records, self.refs, self.n_samples, self.expected = recs, refs, n_samples, expected
        self._sections: dict[int, list[Section]] = {}

    def sections(self, view: View) -> list[Section]:
        key = id(view.spec)
        if key not in self._sections:
            if view.sentences:
                engine.check_references(self.records, self.refs)
            self._sections[key] = engine.sections(view.spec, self.records, self.refs,
                                                  self.n_samples)
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
        return [write_json(plots_dir / "summary.json", summary, indent=1), *pngs]


def build(records_dir: str | os.PathLike, targets: Sequence[Target],
          plots_dir: str | os.PathLike, refs: Sequence[str] | None,
          runs: str | os.PathLike | None = None, n_samples: int = 1000,
          expected: int | None = None, row_norms: bool = True) -> dict[str, Any]:
    """Export the records of newly evaluated runs (``runs``), then rebuild every target's block
    and, with the first target's view, ``summary.json`` and the plots, from the records alone.
    A target's view ``auto`` is ``lm`` or ``translation`` by the records' task. Without an
    ``expected`` number of runs, a study needs at least one record."""
    exported = records.export(runs, records_dir, row_norms) if runs else []
    recs = records.load(records_dir, allow_empty=expected is not None)
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
