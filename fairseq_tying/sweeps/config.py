"""Sweep files: :func:`load_sweep` reads one (:mod:`.sweepfile`), checks it and expands its grid
into runs (:mod:`.grid`); nothing is submitted.

Every error is a :class:`SweepError` naming the key at fault; validation happens before anything
is submitted. The names below are the sweep API the launcher and the tools use.
"""

from __future__ import annotations

from pathlib import Path

from fairseq_tying.sweeps import grid, sweepfile
from fairseq_tying.sweeps.sweep import Resources, Run, Sweep, SweepError, data_bin

__all__ = ["Resources", "Run", "Sweep", "SweepError", "check_data", "data_bin", "load_sweep"]


def check_data(sweep: Sweep) -> None:
    """Every dataset of the sweep's runs holds binarized data (a sweep loaded without the check,
    e.g. before a study prepares its data)."""
    for dname, d in sorted({(r.identity.dataset, r.data_dir) for r in sweep.runs}):
        sweepfile.check_data_dir(dname, d)


def load_sweep(path: str | Path, output_dir: str | Path | None = None,
               check_data: bool = True) -> Sweep:
    """Read and validate a sweep file and expand its grid into runs (nothing is submitted)."""
    path = Path(path)
    raw = sweepfile.read_sweep_file(path)
    name = sweepfile.sweep_name(raw, path)
    data_dirs = sweepfile.data_dirs(raw["datasets"], check_data)
    shared = raw.get("fairseq") if isinstance(raw.get("fairseq"), dict) else {}
    task = str(shared.get("task", "translation"))
    points = grid.grid_points(raw["grid"], data_dirs, shared)
    res = sweepfile.parse_resources(raw.get("resources"))
    batch = sweepfile.parse_batch(raw.get("batch"), res)
    stopping = sweepfile.parse_stopping(raw.get("stopping"), raw.get("fairseq"))
    common, update_freq = grid.train_flags(raw.get("fairseq"), batch, res, stopping)
    out = sweepfile.output_dir(raw, name, output_dir)
    sweep = Sweep(name=name, path=path.resolve(), output_dir=out, resources=res,
                  update_freq=update_freq, task=task,
                  **sweepfile.parse_evaluation(raw.get("evaluation"), res),
                  continue_from=sweepfile.continue_from(raw.get("continue_from"), stopping, out))
    sweep.evaluation, sweep.evaluation_also = grid.eval_options(sweep.eval_args,
                                                                sweep.eval_also, task)
    sweep.runs = grid.make_runs(points, data_dirs, out, common, res, stopping, task)
    return sweep
