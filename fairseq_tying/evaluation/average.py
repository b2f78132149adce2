"""Average the parameters of several checkpoints (what fairseq's average_checkpoints.py does)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from fairseq_tying.common import checkpoints
from fairseq_tying.common.atomic import atomic_write


def average_states(paths: Sequence[str | os.PathLike]) -> dict:
    """Return the newest checkpoint's state (the most updates, as fairseq's
    average_checkpoints.py keeps the newest) with ``model`` replaced by the parameter mean, so
    that the average reports how long its latest input trained.

    Floating point tensors are summed in float64 and cast back to their dtype; integer
    tensors are floor-divided like fairseq does. The optimizer state is dropped.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    newest: dict | None = None
    sums: dict[str, torch.Tensor] = {}
    for path in tqdm(paths, desc="averaging checkpoints", unit="ckpt"):
        state = checkpoints.load(path)
        params = state.pop("model")
        if newest is None:
            dtypes = {k: v.dtype for k, v in params.items()}
        elif params.keys() != sums.keys():
            missing = sorted(set(sums) ^ set(params))[:5]
            raise ValueError(f"{path} has different parameters from {paths[0]}: {missing}")
        for key, value in params.items():
            value = value.double() if value.is_floating_point() else value.long()
            if key in sums:
                if sums[key].shape != value.shape:
                    raise ValueError(f"{path}: {key} has shape {tuple(value.shape)}, "
                                     f"{paths[0]} has {tuple(sums[key].shape)}")
                sums[key] += value
            else:
                sums[key] = value.clone()
        if newest is None or _updates(state) >= _updates(newest):
            newest = state
    n = len(paths)
    averaged = {}
    for key, total in sums.items():
        mean = total / n if total.is_floating_point() else total // n
        averaged[key] = mean.to(dtypes[key])
    assert newest is not None
    newest["model"] = averaged
    newest["last_optimizer_state"] = None
    return newest


def _updates(state: dict) -> int:
    return int((state.get("optimizer_history") or [{}])[-1].get("num_updates", 0))


def last_checkpoints(run_dir: str | os.PathLike, n: int) -> list[Path]:
    found = checkpoints.epoch_checkpoints(run_dir)
    if n < 1:
        raise ValueError(f"--average-last must be at least 1, got {n}")
    if len(found) < n:
        raise ValueError(
            f"--average-last {n}: {run_dir} has only {len(found)} epoch/update checkpoints "
            "(checkpointN.pt or checkpoint_E_U.pt); lower N or train with those saved"
        )
    return found[-n:]


def average_checkpoints(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Average ``paths`` and write the result atomically to ``out``."""
    state = average_states(paths)
    return atomic_write(out, lambda tmp: torch.save(state, tmp))

