"""The one place where the launcher calls the evaluation (``python -m fairseq_tying.evaluation``).

``evaluate_run(RUN)`` must leave ``RUN/eval.json``; ``collect(ROOT, OUT)`` writes
``OUT/results.md`` and plots. Both run in a child process so that a job's own fairseq state
(distributed groups, registries, logging) never leaks into them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import fairseq_tying

USER_DIR = os.path.dirname(fairseq_tying.__file__)


def _python(args: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run([sys.executable, "-m", *args], check=True, env=env)


def _require_cli() -> None:
    if importlib.util.find_spec("fairseq_tying.evaluation.__main__") is None:
        raise RuntimeError("fairseq_tying.evaluation has no command line (__main__.py): "
                           "install the complete package")


def evaluate_run(run_dir: Path, extra_args: list[str] | None = None, cpu: bool = True) -> Path:
    """``python -m fairseq_tying.evaluation evaluate RUN_DIR`` (data dir from RUN/run.json)."""
    _require_cli()
    out = run_dir / "eval.json"
    _python(["fairseq_tying.evaluation", "evaluate", str(run_dir), "--user-dir", USER_DIR,
             *(["--cpu"] if cpu else []), *(extra_args or [])])
    if not out.exists():
        raise RuntimeError(f"evaluation of {run_dir} wrote no {out.name}")
    return out


def collect(runs_root: Path, out_dir: Path) -> Path:
    """``python -m fairseq_tying.evaluation collect RUNS_ROOT --out OUT``."""
    _require_cli()
    _python(["fairseq_tying.evaluation", "collect", str(runs_root), "--out", str(out_dir)])
    out = out_dir / "results.md"
    if not out.exists():
        raise RuntimeError(f"collect of {runs_root} wrote no {out}")
    return out
