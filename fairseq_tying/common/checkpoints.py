"""The one reader of fairseq checkpoints and their configs for the tools (``torch.load`` with
``weights_only=True``; the plugin core allowlists what fairseq pickles).

A checkpoint written by fairseq-train holds its config as ``cfg`` (sections ``model``,
``task``, ``common``, … as dicts or ``argparse.Namespace``), an older one as ``args``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from fairseq_tying.core import checkpoint_compat

checkpoint_compat.allow_fairseq_checkpoints()

_EPOCH = checkpoint_compat.EPOCH_CHECKPOINT
_UPDATE = checkpoint_compat.UPDATE_CHECKPOINT


def load(path: str | os.PathLike) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return checkpoint_compat.load(path)


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(key, default)
    if isinstance(obj, argparse.Namespace):
        return getattr(obj, key, default)
    return default


def model_args(state: dict[str, Any]) -> Any:
    """The model section of a checkpoint's config (a dict or an argparse.Namespace)."""
    cfg = state.get("cfg")
    if cfg is not None and _get(cfg, "model") is not None:
        return _get(cfg, "model")
    return state.get("args")


def config_value(state: dict[str, Any], key: str, section: str | None = None) -> Any:
    """Look ``key`` up in the model config, then in ``cfg[section]``, then in legacy ``args``."""
    value = _get(model_args(state), key)
    if value is None and section is not None:
        value = _get(_get(state.get("cfg"), section), key)
    if value is None:
        value = _get(state.get("args"), key)
    return value


def tying_of(state: dict[str, Any]) -> str:
    """The plugin's ``--tying``, or what fairseq's sharing flags amount to for a stock model."""
    tying = config_value(state, "tying")
    if tying:
        return str(tying)
    if config_value(state, "share_all_embeddings"):
        return "three_way"
    if config_value(state, "share_decoder_input_output_embed"):
        return "decoder"
    return "none"


def task_data(state: dict[str, Any]) -> str | None:
    """The fairseq-preprocess folder the model was trained on (``cfg.task.data``)."""
    value = config_value(state, "data", section="task")
    return None if value is None else str(value)


def task_of(state: dict[str, Any]) -> str | None:
    """fairseq's ``--task`` the model was trained with (``cfg.task._name``)."""
    return _get(_get(state.get("cfg"), "task"), "_name") or _get(state.get("args"), "task")


def arch_of(state: dict[str, Any]) -> str | None:
    model = model_args(state)
    return _get(model, "arch") or _get(model, "_name")


def epoch_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """``checkpoint_E_U.pt`` files by update if there are any, else ``checkpointE.pt`` by epoch."""
    run_dir = Path(run_dir)
    by_update = sorted(
        (int(m.group(2)), p) for p in run_dir.iterdir() if (m := _UPDATE.match(p.name))
    )
    if by_update:
        return [p for _, p in by_update]
    by_epoch = sorted(
        (int(m.group(1)), p) for p in run_dir.iterdir() if (m := _EPOCH.match(p.name))
    )
    return [p for _, p in by_epoch]
