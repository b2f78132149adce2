"""A run folder's identity: ``run.json`` (read here only, :func:`read_run_json`) and the
checkpoint's configuration give the run's name, method, architecture, tying, output layer and
seed, which the evaluation writes into ``eval.json`` and the study records carry."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fairseq_tying.common import RUN_JSON, checkpoints

IDENTITY = ("name", "method", "arch", "tying", "output_layer", "seed")  # eval.json's "run"


def read_run_json(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``RUN_DIR/run.json``, the launcher's settings of the run ({} when there is none)."""
    path = Path(run_dir) / RUN_JSON
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix or remove it") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    # Accept "label" as a synonym of "method" and "output-layer" spellings.
    if "label" in data and "method" not in data:
        data["method"] = data["label"]
    if "output-layer" in data and "output_layer" not in data:
        data["output_layer"] = data["output-layer"]
    return data


def method_label(arch: str, tying: str, output_layer: str) -> str:
    return f"{arch}:{tying}:{output_layer}"


def run_identity(run_dir: str | os.PathLike, state: dict | None,
                 extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Which method, architecture, tying, output layer and seed a run used (``IDENTITY``,
    then the ``extra`` keys of ``run.json``): the checkpoint's config, overridden by
    ``RUN_DIR/run.json`` where it says."""
    arch = tying = output_layer = "?"
    seed = None
    if state is not None:
        arch = checkpoints.arch_of(state) or "?"
        tying = checkpoints.tying_of(state)
        output_layer = str(checkpoints.config_value(state, "output_layer") or "dot")
        seed = checkpoints.config_value(state, "seed", section="common")
    meta = read_run_json(run_dir)
    arch = str(meta.get("arch", arch))
    tying = str(meta.get("tying", tying))
    output_layer = str(meta.get("output_layer", output_layer))
    seed = meta.get("seed", seed)
    return {"name": str(meta.get("name") or Path(run_dir).resolve().name),
            "method": str(meta.get("method") or method_label(arch, tying, output_layer)),
            "arch": arch, "tying": tying, "output_layer": output_layer,
            "seed": int(seed) if seed is not None else None,
            **{k: meta.get(k) for k in extra}}
