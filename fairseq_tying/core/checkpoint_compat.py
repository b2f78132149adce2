"""Let fairseq checkpoints load under ``torch.load(weights_only=True)`` (torch >= 2.6).

fairseq pickles a few non-tensor objects into its checkpoints. We allowlist exactly those
classes with ``torch.serialization.add_safe_globals``; ``weights_only`` stays on. ``load`` is
the plugin's one ``torch.load`` of a checkpoint: a truncated or corrupt file is named, with the
checkpoint before it in its folder, instead of torch's "PytorchStreamReader failed reading zip
archive".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

EPOCH_CHECKPOINT = re.compile(r"^checkpoint(\d+)\.pt$")  # fairseq's checkpointE.pt
UPDATE_CHECKPOINT = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")  # checkpoint_E_U.pt


class UnreadableCheckpoint(ValueError):
    """A checkpoint file torch cannot read: truncated or corrupt."""


def load(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """``torch.load`` of a fairseq checkpoint on the CPU (``weights_only``); a file torch cannot
    read raises ``UnreadableCheckpoint`` naming it and the checkpoint to use instead."""
    with reading(path, mmap):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


@contextlib.contextmanager
def reading(path: str | os.PathLike, mmap: bool = False) -> Iterator[None]:
    """Turns torch's error on a truncated or corrupt ``path`` (read inside the block, by
    ``load`` or by fairseq's own loader) into ``UnreadableCheckpoint``."""
    try:
        yield
    except pickle.UnpicklingError as err:
        if "Unsupported global" in str(err):
            raise  # readable, but holds a class the allowlist does not have: torch says which
        raise unreadable(Path(path), err) from err
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise  # the file itself is missing or closed: the OS error says so
    except (RuntimeError, EOFError, ValueError, OSError) as err:  # OSError: a seek past the end
        if mmap and "mmap" in str(err):
            raise  # not a zip checkpoint: the caller loads it without mmap
        raise unreadable(Path(path), err) from err


def _order(path: Path) -> tuple[int, int] | None:
    """(epoch, update) of an epoch or update checkpoint's name, None for any other name."""
    if m := UPDATE_CHECKPOINT.match(path.name):
        return int(m.group(1)), int(m.group(2))
    if m := EPOCH_CHECKPOINT.match(path.name):
        return int(m.group(1)), 0
    return None


def previous_checkpoint(path: Path) -> Path | None:
    """The newest whole epoch or update checkpoint of ``path``'s folder saved before it (the
    newest of all for checkpoint_last.pt, _best or an average); whole: its zip archive's
    directory, written last, is there (a truncated file has none)."""
    mine = _order(path)
    found = sorted((key, p) for p in path.parent.glob("checkpoint*.pt")
                   if p != path and (key := _order(p)) is not None and (mine is None
                                                                        or key < mine))
    return next((p for _, p in reversed(found) if zipfile.is_zipfile(p)), None)


def unreadable(path: Path, err: BaseException) -> UnreadableCheckpoint:
    """The error for a checkpoint torch cannot read, with what to use instead."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    previous = previous_checkpoint(path)
    instead = (f"The checkpoint saved before it is {previous}: use that one (fairseq-train "
               f"resumes from it with --restore-file {previous})." if previous else
               "No earlier epoch checkpoint is in its folder: train it again.")
    return UnreadableCheckpoint(f"checkpoint {path} cannot be read: it is truncated or corrupt "
                                f"(torch: {detail}). {instead}")


def _numpy_globals() -> list:
    found = []
    # numpy 1.x pickles ``numpy.core.multiarray``; numpy 2.x ``numpy._core.multiarray``.
    for module_name in ("numpy.core.multiarray", "numpy._core.multiarray"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in ("_reconstruct", "scalar"):
            fn = getattr(module, name, None)
            if fn is not None:
                found.append((fn, f"{module_name}.{name}"))
    return found


def fairseq_checkpoint_globals() -> list:
    """The classes and functions that fairseq checkpoints contain."""
    dtype_classes = sorted({type(np.dtype(t)) for t in np.sctypeDict.values()}, key=str)
    return [argparse.Namespace, np.ndarray, np.dtype, *dtype_classes, *_numpy_globals()]


def allow_fairseq_checkpoints() -> None:
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:  # torch < 2.4 loads them without an allowlist
        add_safe_globals(fairseq_checkpoint_globals())
