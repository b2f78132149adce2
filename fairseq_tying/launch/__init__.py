"""Launching sweeps on SLURM with submitit (or locally)."""
