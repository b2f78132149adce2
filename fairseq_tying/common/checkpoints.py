"""The one reader of fairseq checkpoints and their configs for the tools (``torch.load`` with
``weights_only=True``; the plugin core allowlists what fairseq pickles).

A checkpoint written by fairseq-train holds its config as ``cfg`` (sections ``model``,
``task``, ``common``, … as dicts or ``argparse.Namespace``), an older one as ``args``;
:class:`CheckpointConfig` reads what the tools use of it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairseq_tying.common.run_spec import Identity
from fairseq_tying.core import checkpoint_compat
from fairseq_tying.core.output_layers import BASELINE

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


@dataclass(frozen=True)
class CheckpointConfig:
    """What the tools read of a checkpoint's configuration, read once (:meth:`of`): the model
    section as saved (``model``, for a tool that rewrites it), then the values looked up in the
    model section, the named section of ``cfg`` and the legacy ``args``, in that order."""

    model: Any  # cfg["model"] (a dict or an argparse.Namespace), else the legacy args
    arch: str | None
    tying: str  # the plugin's --tying, or what fairseq's sharing flags amount to
    output_layer: str | None  # None: a stock fairseq model (its output layer is ``dot``)
    seed: int | None
    task: str | None  # fairseq's --task
    data: str | None  # the fairseq-preprocess folder it was trained on (cfg.task.data)
    source_lang: str | None
    target_lang: str | None
    tokens_per_sample: int | None  # a language model's blocks
    sample_break_mode: str | None

    def identity(self, name: str) -> Identity:
        """What the checkpoint says the run is (a stock fairseq model's output layer is the
        baseline's)."""
        return Identity(name=name, arch=self.arch, tying=self.tying,
                        output_layer=self.output_layer or BASELINE, seed=self.seed)

    @classmethod
    def of(cls, state: dict[str, Any]) -> CheckpointConfig:
        cfg, args = state.get("cfg"), state.get("args")
        model = _get(cfg, "model") if _get(cfg, "model") is not None else args

        def value(key: str, section: str | None = None) -> Any:
            found = _get(model, key)
            if found is None and section is not None:
                found = _get(_get(cfg, section), key)
            return _get(args, key) if found is None else found

        def text(key: str, section: str | None = None) -> str | None:
            found = value(key, section)
            return None if found is None else str(found)

        seed, tokens = value("seed", "common"), value("tokens_per_sample", "task")
        return cls(model=model, arch=_get(model, "arch") or _get(model, "_name"),
                   tying=_tying(value), output_layer=text("output_layer"),
                   seed=None if seed is None else int(seed),
                   task=_get(_get(cfg, "task"), "_name") or _get(args, "task"),
                   data=text("data", "task"), source_lang=text("source_lang", "task"),
                   target_lang=text("target_lang", "task"),
                   tokens_per_sample=None if tokens is None else int(tokens),
                   sample_break_mode=text("sample_break_mode", "task"))


def _tying(value: Callable[[str], Any]) -> str:
    if tying := value("tying"):
        return str(tying)
    if value("share_all_embeddings"):
        return "three_way"
    if value("share_decoder_input_output_embed"):
        return "decoder"
    return "none"


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
