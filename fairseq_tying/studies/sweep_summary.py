"""The launcher's summary of a translation sweep, ``OUTPUT/results.md``, written after its last
evaluation: the sweep's answer, or why there is none yet.

The answer is ``studies answer``'s (``studies.answer.make``: each cell against its own
baseline, the verdict rule, Holm over the sweep's claims), made from the sweep's run folders
into ``OUTPUT/answer/`` (``answer.md``, ``records/``, ``summary.json``, the plots) with the
command its head names, which rebuilds it. ``results.md`` is that answer's text, so the
launcher states no other Δ of these runs. Where there is no answer, ``results.md`` says why in
a sentence and lists each evaluated run's scores, with no Δ and no p:

- the sweep's grid makes none of the answer's comparisons (``specs.claims_between``);
- the launch skips runs with a study record (``--skip-recorded``): these folders need not hold
  the whole sweep, whose answer comes from its records (``launch study NAME``);
- no run can be compared yet, or the answer cannot be made (its error, e.g. a sweep of two
  datasets, or test references that are not in the data dir).

Launchers before this one wrote a table of every method against one baseline there, beside
``results.json`` and ``bleu.png``; those two files are removed, so that no other Δ of these runs
is left beside the answer.
"""

from __future__ import annotations

import shlex
import sys
from collections import defaultdict
from pathlib import Path

from fairseq_tying.common import EVAL_JSON
from fairseq_tying.common.atomic import write_text
from fairseq_tying.common.tables import markdown_table
from fairseq_tying.evaluation.result import TranslationResult, read_result
from fairseq_tying.studies import answer
from fairseq_tying.studies.engine import specs
from fairseq_tying.sweeps.config import Sweep

SUMMARY = "results.md"
ANSWER_DIR = "answer"
FORMER = ("results.json", "bleu.png")  # what the table of one baseline was written with


def answer_command(sweep: Sweep) -> str:
    """The command that makes (and rebuilds) the sweep's answer in ``OUTPUT/answer``."""
    return shlex.join(["python", "-m", "fairseq_tying.studies", "answer", str(sweep.path),
                       "--runs", str(sweep.output_dir),
                       "--out", str(sweep.output_dir / ANSWER_DIR)])


def no_comparison(sweep: Sweep) -> str | None:
    """Why the sweep's grid makes none of the answer's comparisons; None if it makes one."""
    cells: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for run in sweep.runs:
        cells[run.identity.arch].add((run.identity.tying, run.identity.cell_layer()))
    if any(specs.claims_between(keys) for keys in cells.values()):
        return None
    return ("its grid makes none of the answer's comparisons: each tying mode with `dot` "
            "against untied `dot`, and each normalized output layer against `dot` under the "
            "same decoder or three-way tying, by architecture")


def scores(sweep: Sweep) -> str:
    """Each evaluated run's scores, as its ``eval.json`` has them; "" when none is evaluated."""
    rows = []
    for run in sweep.runs:
        path = run.run_dir / EVAL_JSON
        try:
            ev = read_result(path) if path.is_file() else None
        except (ValueError, KeyError) as err:  # the answer names it; the scores go on
            print(f"{path}: {err}", file=sys.stderr)
            continue
        if isinstance(ev, TranslationResult):
            rows.append([f"`{run.name}`", run.identity.tying, f"`{run.identity.output_layer}`",
                         run.identity.seed, f"{ev.bleu:.2f}", f"{ev.tok_bleu:.2f}",
                         f"{ev.chrf:.2f}"])
    if not rows:
        return ""
    return (f"Each evaluated run's scores ({len(rows)} of {len(sweep.runs)}; no Δ or p: "
            "comparisons and their verdicts are the answer's):\n\n"
            + markdown_table(["run", "tying", "output layer", "seed", "BLEU", "tok. BLEU",
                              "chrF"], rows))


def unanswered(sweep: Sweep, why: str, then: str = "",
               left: list[answer.LeftOut] | None = None) -> str:
    """``results.md`` without an answer: why, the runs ``left`` out, what makes one (``then``),
    the runs' scores."""
    parts = [answer.TITLE.strip(), f"No answer for the runs of `{sweep.path}` ({sweep.name}) in "
             f"`{sweep.output_dir}`: {why}." + (f" {then}" if then else "")]
    if left:
        parts.append("\n".join(f"- `{lo.run}`: {lo.why}" for lo in left))
    if table := scores(sweep):
        parts.append(table.rstrip("\n"))
    return "\n\n".join(parts) + "\n"


def summarize(sweep: Sweep, skipped: Path | None = None) -> tuple[Path, str]:
    """Write ``OUTPUT/results.md`` for the sweep (``skipped``: the records folder of
    ``--skip-recorded``); return its path and a line that says what it holds."""
    output = sweep.output_dir
    path = output / SUMMARY
    for name in FORMER:
        (output / name).unlink(missing_ok=True)
    command = answer_command(sweep)
    if skipped is not None:
        n = sum((skipped / f"{run.name}.json").is_file() for run in sweep.runs)
        why = (f"it was launched with --skip-recorded `{skipped}`, whose study records stand "
               f"for runs these folders need not hold ({n} of {len(sweep.runs)} now)")
        write_text(path, unanswered(sweep, why, "The sweep's answer comes from those records "
                                    "(a study of slurm/studies.yaml: `python -m "
                                    "fairseq_tying.launch study NAME`)."))
        return path, f"{path}: no answer ({why})"
    if (why := no_comparison(sweep)) is not None:
        write_text(path, unanswered(sweep, why))
        return path, f"{path}: no answer ({why})"
    try:
        done = answer.make(sweep, sweep.path, output / ANSWER_DIR, command=command)
    except answer.Unanswered as err:
        why, left = f"none of its {len(sweep.runs)} runs can be compared yet", err.left
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as err:
        why, left = f"the answer stopped: {err}", []
    else:
        text = (done.out / answer.ANSWER).read_text()
        write_text(path, text + f"\nIts records, `summary.json` and plots: [{ANSWER_DIR}/]"
                   f"({ANSWER_DIR}/).\n")
        return path, (f"{path}: the answer for {done.compared} of {len(sweep.runs)} runs "
                      f"(also {done.out / answer.ANSWER})")
    write_text(path, unanswered(sweep, why, f"`{command}` makes it once runs can be compared.",
                                left))
    return path, f"{path}: no answer ({why})"
