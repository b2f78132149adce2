"""Let fairseq checkpoints load under ``torch.load(weights_only=True)`` (torch >= 2.6).

fairseq pickles a few non-tensor objects into its checkpoints. We allowlist exactly those
classes with ``torch.serialization.add_safe_globals``; ``weights_only`` stays on.
"""

from __future__ import annotations

import argparse
import importlib

import numpy as np
import torch


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
