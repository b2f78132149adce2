"""What a training job changes in fairseq while it runs fairseq-train in its own process, each
change in one place with its reason:

- ``fairseq_cli.train.validate_and_save`` is wrapped (``wrap_validate_and_save``): fairseq calls
  it after every update, and it is the one place that sees the validation losses and may stop
  the loop; the job records its progress there, applies the plateau rule at the end of an
  epoch, and on a stop request saves ``checkpoint_last.pt`` and leaves the loop;
- ``fairseq.file_io.PathManager.copy`` becomes ``atomic_copy``: fairseq writes
  ``checkpoint_last.pt`` by copying the epoch checkpoint in place, and a job killed mid-copy
  (SLURM's time limit, a preemption) would leave a truncated file to resume from;
- ``sys.argv`` is fairseq-train's command line while ``fairseq_cli.train.cli_main`` runs
  (``run_fairseq_train``): it parses ``sys.argv`` and takes no arguments.

``fairseq_cli.train`` is imported by these functions only: the plugin reads an imported
``fairseq_cli.train`` as running under fairseq-train (``core/models/guards.py``), which the
launcher itself is not.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from typing import Any

from fairseq.file_io import PathManager

from fairseq_tying.common import atomic

# (fairseq's own validate_and_save, cfg, trainer, task, epoch_itr, valid_subsets,
#  end_of_epoch) -> (valid_losses, should_stop), as fairseq's returns them
Wrapper = Callable[..., tuple[list, bool]]


def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
    """``PathManager.copy`` that copies beside ``dst_path``, then renames: a process killed
    mid-copy leaves the old file or the new one, never a truncated one."""
    atomic.atomic_write(dst_path, lambda tmp: shutil.copyfile(src_path, tmp))
    return True


def wrap_validate_and_save(wrapper: Wrapper) -> None:
    """Make fairseq's training loop call ``wrapper(original, *args)`` instead of its own
    ``validate_and_save(*args)`` (a second call replaces the first wrapper), and copy
    checkpoints atomically."""
    # imported by a training job only (see the module's docstring)
    import fairseq_cli.train as fairseq_train

    PathManager.copy = staticmethod(atomic_copy)
    original = getattr(fairseq_train.validate_and_save, "__wrapped__",
                       fairseq_train.validate_and_save)

    def validate_and_save(*args: Any) -> tuple[list, bool]:
        return wrapper(original, *args)

    validate_and_save.__wrapped__ = original
    fairseq_train.validate_and_save = validate_and_save


def run_fairseq_train(argv: list[str]) -> None:
    """fairseq-train's ``cli_main`` on ``argv`` (``["fairseq-train", DATA, flags...]``) in this
    process; ``sys.argv`` is restored afterwards, however it ends."""
    # imported by a training job only (see the module's docstring)
    from fairseq_cli.train import cli_main

    saved_argv, sys.argv = sys.argv, argv
    try:
        cli_main()
    finally:
        sys.argv = saved_argv
