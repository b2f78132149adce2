"""A run folder's facts, read once into a :class:`RunFacts`: the launcher's ``run.json`` (read
here only) and the checkpoint's configuration give the run's name, method, architecture, tying,
output layer, seed and data, which the evaluation writes into ``eval.json`` (``identity``) and
the study records carry."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairseq_tying.common import RUN_JSON
from fairseq_tying.common.checkpoints import CheckpointConfig

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


@dataclass(frozen=True)
class RunFacts:
    """One run folder, read once: its identity (the checkpoint's configuration, or an identity
    recorded earlier, overridden by ``run.json`` where it says), the launcher's settings
    (``run.json`` as written, {} without one) and the checkpoint's configuration when read."""

    run_dir: Path
    name: str
    method: str
    arch: str
    tying: str
    output_layer: str
    seed: int | None
    settings: Mapping[str, Any] = field(default_factory=dict, repr=False)
    config: CheckpointConfig | None = field(default=None, repr=False)

    @classmethod
    def read(cls, run_dir: str | os.PathLike, config: CheckpointConfig | None = None,
             recorded: Mapping[str, Any] | None = None) -> RunFacts:
        """The facts of ``run_dir``: ``run.json`` over ``config`` (else over ``recorded``, the
        identity an evaluation wrote, e.g. ``eval.json``'s ``run``)."""
        run_dir = Path(run_dir).resolve()
        return cls._resolve(run_dir, read_run_json(run_dir), config, recorded or {})

    def with_checkpoint(self, config: CheckpointConfig) -> RunFacts:
        """These facts with the configuration of the checkpoint evaluated (``run.json`` still
        overrides it), without reading ``run.json`` again."""
        return self._resolve(self.run_dir, self.settings, config, {})

    @classmethod
    def _resolve(cls, run_dir: Path, settings: Mapping[str, Any],
                 config: CheckpointConfig | None, recorded: Mapping[str, Any]) -> RunFacts:
        base: dict[str, Any] = {"arch": "?", "tying": "?", "output_layer": "?", "seed": None,
                                **{k: v for k, v in recorded.items() if v is not None}}
        if config is not None:
            base = {"arch": config.arch or "?", "tying": config.tying,
                    "output_layer": config.output_layer or "dot", "seed": config.seed}
        arch, tying, layer = (str(settings.get(k, base[k]))
                              for k in ("arch", "tying", "output_layer"))
        seed = settings.get("seed", base["seed"])
        named = {k: settings.get(k) or recorded.get(k) for k in ("name", "method")}
        return cls(run_dir=run_dir, name=str(named["name"] or run_dir.name),
                   method=str(named["method"] or method_label(arch, tying, layer)),
                   arch=arch, tying=tying, output_layer=layer,
                   seed=None if seed is None else int(seed), settings=settings, config=config)

    @property
    def data_dir(self) -> str | None:
        """The data the run was trained on, as ``run.json`` names it."""
        data = self.settings.get("data_dir")
        return str(data) if data else None

    def data(self, given: str | os.PathLike | None) -> str:
        """``--data`` when given, else the run's own data dir."""
        if given is not None:
            return str(given)
        if self.data_dir is None:
            raise ValueError(f"--data is required ({self.run_dir}/{RUN_JSON} names no data_dir)")
        return self.data_dir

    def identity(self, extra: tuple[str, ...] = ()) -> dict[str, Any]:
        """``IDENTITY`` (what ``eval.json``'s ``run`` holds), then the ``extra`` keys of
        ``run.json``."""
        return {**{k: getattr(self, k) for k in IDENTITY},
                **{k: self.settings.get(k) for k in extra}}
