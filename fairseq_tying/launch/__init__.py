"""Launching sweeps on SLURM with submitit (or locally)."""

# what needs the launch extra (submitit), in its message (fairseq_tying.common.extras)
FOR_WHAT = "python -m fairseq_tying.launch (its jobs run through submitit, on SLURM or locally)"
