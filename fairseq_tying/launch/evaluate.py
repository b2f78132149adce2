"""The one place where the launcher calls the evaluation (``python -m fairseq_tying.evaluation``).

``evaluate_run(RUN)`` must leave ``RUN/eval.json``; ``collect(ROOT, OUT)`` writes
``OUT/results.md`` and plots. They run in the calling process (an evaluation job of its own,
which holds no training state); the evaluation itself runs fairseq-generate as a child process.
"""

from __future__ import annotations

import os
from pathlib import Path

from fairseq_tying.common import PLUGIN_DIR


def _cli(args: list[str]) -> None:
    """``python -m fairseq_tying.evaluation ARGS``, in this process."""
    from fairseq_tying.evaluation.cli import main

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rc = main(args)
    if rc:
        raise RuntimeError(f"python -m fairseq_tying.evaluation {' '.join(args)} failed ({rc})")


def evaluate_run(run_dir: Path, extra_args: list[str] | None = None, cpu: bool = True,
                 tag: str | None = None) -> Path:
    """``python -m fairseq_tying.evaluation evaluate RUN_DIR`` (data dir from RUN/run.json);
    with ``--tag TAG`` among the arguments it writes ``RUN/eval.TAG.json``."""
    out = run_dir / (f"eval.{tag}.json" if tag else "eval.json")
    _cli(["evaluate", str(run_dir), "--user-dir", PLUGIN_DIR, *(["--cpu"] if cpu else []),
          *(extra_args or [])])
    if not out.exists():
        raise RuntimeError(f"evaluation of {run_dir} wrote no {out.name}")
    return out


def collect(runs_root: Path, out_dir: Path) -> Path:
    """``python -m fairseq_tying.evaluation collect RUNS_ROOT --out OUT``."""
    _cli(["collect", str(runs_root), "--out", str(out_dir)])
    out = out_dir / "results.md"
    if not out.exists():
        raise RuntimeError(f"collect of {runs_root} wrote no {out}")
    return out
