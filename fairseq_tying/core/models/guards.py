"""Checks that keep a run what it was: resuming with other tying flags, non-finite checkpoints.

fairseq resumes ``checkpoint_last.pt`` whenever it exists in ``--save-dir``. The flags below
do not change the checkpoint's tensors (or change them in ways fairseq cannot report clearly),
so a resume with other values would silently train another model: it is refused, naming the
flag and both values.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import torch
from fairseq.data import Dictionary
from torch import Tensor

from fairseq_tying.core import checkpoint_compat, names, output_layers

GUARDED_FLAGS = ("output_layer", "tying", "tied_embed_dim", "tied_projection", "output_bias")
EMBEDDING_KEYS = {
    names.ENCODER_EMBED: "encoder input embedding",
    names.DECODER_EMBED: "decoder input embedding",
    names.SCORER_WEIGHT: "decoder output embedding",
}


def model_flags(args: Namespace) -> dict[str, object]:
    """The guarded flags of a model config, with fairseq's defaults filled in."""
    return {
        "output_layer": getattr(args, "output_layer", None) or output_layers.BASELINE,
        "tying": getattr(args, "tying", None),
        "tied_projection": bool(getattr(args, "tied_projection", False)),
        "tied_embed_dim": getattr(args, "tied_embed_dim", None) or args.decoder_embed_dim,
        "output_bias": bool(getattr(args, "output_bias", False)),
    }


def _flag(name: str, value: object) -> str:
    option = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return option if value else f"no {option}"
    return f"{option} {value}"


def _training() -> bool:
    # Only fairseq-train resumes; fairseq-generate builds the model from the checkpoint's own
    # config and may override flags on purpose (--model-overrides).
    return "fairseq_cli.train" in sys.modules


def resume_path(args: Namespace) -> Path | None:
    """The checkpoint fairseq-train will resume, as ``checkpoint_utils.load_checkpoint`` picks
    it; None when it starts from scratch or from ``--finetune-from-model``."""
    restore = getattr(args, "restore_file", "checkpoint_last.pt")
    suffix = getattr(args, "checkpoint_suffix", "") or ""
    if restore == "checkpoint_last.pt":
        path = Path(args.save_dir) / f"checkpoint_last{suffix}.pt"
    else:
        path = Path(restore.replace(".pt", suffix + ".pt") if suffix else restore)
    return path if path.is_file() else None


def saved_model_args(path: Path) -> Namespace | None:
    try:  # mmap: only the pickled config is read, the tensors stay on disk
        state = checkpoint_compat.load(path, mmap=True)
    except RuntimeError:  # an old, non-zip checkpoint cannot be mapped
        state = checkpoint_compat.load(path)
    cfg = state.get("cfg") or {}
    args = cfg.get("model") if isinstance(cfg, dict) else None
    args = args if args is not None else state.get("args")
    return args if isinstance(args, Namespace) else None


def check_resume(args: Namespace) -> None:
    """Under fairseq-train, refuse to resume a checkpoint trained with other tying flags."""
    if not _training() or getattr(args, "reset_optimizer", False):
        return
    path = resume_path(args)
    saved = saved_model_args(path) if path is not None else None
    if saved is None or getattr(saved, "tying", None) is None:
        return  # from scratch, or not a checkpoint of this plugin
    before, now = model_flags(saved), model_flags(args)
    # the layer's constants (softcap's c), with their defaults for a checkpoint without them
    layer = output_layers.get(now["output_layer"])
    if before["output_layer"] == now["output_layer"]:
        before.update(layer.setting_values(vars(saved)))
        now.update(layer.setting_values(vars(args)))
    for name in (*GUARDED_FLAGS, *(s.name for s in layer.settings)):
        if before[name] != now[name]:
            raise ValueError(resume_message(path, name, before[name], now[name]))


def resume_message(path: Path, name: str, before: object, now: object) -> str:
    head = (f"{path} was trained with {_flag(name, before)}, but this run asks for "
            f"{_flag(name, now)}: resuming would silently change the model.")
    if name == "tied_embed_dim":
        return (f"{head} Its matrices have {before} columns and cannot be loaded into a model "
                f"with {now}: resume with --tied-embed-dim {before}, or train from scratch in "
                "another --save-dir.")
    return (f"{head} To resume it, run with its value ({_flag(name, before)}); to start from "
            "this checkpoint on purpose, train "
            f"into another --save-dir with --finetune-from-model {path}, or keep this one and "
            "add --reset-optimizer (and --reset-lr-scheduler, --reset-meters, "
            "--reset-dataloader as wanted).")


def check_finite(state_dict: dict[str, Tensor], dictionaries: dict[str, Dictionary]) -> None:
    """Name the embedding matrix and rows of a checkpoint that hold NaN or inf."""
    for key in EMBEDDING_KEYS:
        weight = state_dict.get(key)
        if weight is None or weight.dim() != 2:
            continue
        # a tied matrix is one storage under several keys: name all its roles
        role = ", ".join(r for k, r in EMBEDDING_KEYS.items() if k in state_dict
                         and state_dict[k].data_ptr() == weight.data_ptr())
        bad = (~torch.isfinite(weight)).any(dim=1).nonzero().flatten().tolist()
        if not bad:
            continue
        dictionary = dictionaries.get(key.split(".")[0])
        names = [f"{i} ({dictionary[i]!r})" if dictionary is not None and i < len(dictionary)
                 else str(i) for i in bad[:10]]
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise ValueError(
            f"the checkpoint's {key} ({role}) holds NaN/inf in {len(bad)} of {weight.shape[0]} "
            f"rows: {', '.join(names)}{more}. Training diverged before it was saved: use an "
            "earlier checkpoint (and a lower --lr, or --fp16 loss scaling, when retraining).")
