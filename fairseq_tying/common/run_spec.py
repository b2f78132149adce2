"""A run, described once.

:class:`Identity` says which run it is (what a study groups and compares runs by);
:class:`RunSpec` is that identity with how the launcher runs it. The sweep makes the spec
(``sweeps.sweep.Sweep.spec``), :func:`write_run_json` writes it to ``RUN_DIR/run.json`` (the
demo's runs too), :func:`read_run_json` reads it back for every tool, the evaluation writes the
resolved identity into ``eval.json``'s ``run`` and a study's record carries it.

``run.json`` is flat: the identity's fields, then the launcher's settings. A key that neither
declares is refused, never ignored (a ``run.json`` of a newer fairseq_tying, or a typo).

Precedence, stated once (:func:`resolve`): ``run.json`` says what the run was asked to be, the
checkpoint what was trained. Each of ``CHECKED`` comes from whichever names it; where both do
and they differ, reading refuses: the folder holds another run's checkpoint, or a ``run.json``
edited by hand. Without a checkpoint, the identity an evaluation recorded (``eval.json``'s
``run``) stands in for it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from fairseq_tying.common import RUN_JSON
from fairseq_tying.common.atomic import write_json
from fairseq_tying.common.typed import checked

_SEED_PART = re.compile(r"\.s(\d+)$")  # the last part of a run's name (Identity.named)

# a tagged grid block (added by hand to a sweep, e.g. `dot` with the z-loss) is a cell of its
# own, never mixed into its layer's: "dot+zloss"
CELL_TAG = "+"


@dataclass(frozen=True)
class Identity:
    """Which run it is: its name and what it trains."""

    name: str
    method: str | None = None  # the label a study shows (default: arch:tying:output_layer)
    dataset: str | None = None
    arch: str | None = None
    tying: str | None = None
    output_layer: str | None = None
    seed: int | None = None
    train_args: list[str] | None = None
    task: str | None = None  # fairseq's --task ("translation" or LM_TASK)
    tag: str | None = None  # the grid block's name tag (a language model's variant, "tiedL")

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> Identity:
        return cls(**checked(cls, data, where, unknown="it was written by another fairseq_tying "
                             "than this one (or edited by hand): rewrite it with this one's "
                             "launcher, or remove the keys"))

    def to_dict(self) -> dict[str, Any]:
        """The identity as JSON (``eval.json``'s ``run``): its fields, None left out."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def cell_layer(self) -> str | None:
        """The output layer as a study's cell names it: with its grid block's tag, if any."""
        return f"{self.output_layer}{CELL_TAG}{self.tag}" if self.tag else self.output_layer

    def label(self) -> str:
        """``method``, else ``arch:tying:output_layer``."""
        return self.method or f"{self.arch}:{self.tying}:{self.output_layer}"

    @classmethod
    def named(cls, *, dataset: str, arch: str, seed: int, tying: str | None = None,
              output_layer: str | None = None, tag: str | None = None, **rest: Any
              ) -> Identity:
        """A sweep's run, named ``dataset.arch[.tying][.output_layer][.tag].sSEED``: the one
        format of a run's name, which :meth:`split_name` reads back."""
        parts = [dataset, arch, tying, output_layer, tag, f"s{seed}"]
        return cls(name=".".join(str(p) for p in parts if p is not None), dataset=dataset,
                   arch=arch, tying=tying, output_layer=output_layer, seed=seed, tag=tag,
                   **rest)

    @staticmethod
    def split_name(name: str) -> tuple[str, int | None]:
        """(its cell, its seed) of a run's name: ``….three_way.dot.s1`` -> (``….three_way.dot``,
        1); a name without a seed part is its own cell."""
        found = _SEED_PART.search(name)
        return (name[:found.start()], int(found[1])) if found else (name, None)


@dataclass(frozen=True)
class RunSpec:
    """A run as the launcher runs it: its identity and settings (``run.json``)."""

    identity: Identity
    run_dir: str | None = None
    data_dir: str | None = None  # the prepared data dir (``evaluate``'s default ``--data``)
    data_bin: str | None = None  # its binarized data, fairseq-train's DATA
    world_size: int | None = None
    gpu: bool | None = None
    stopping: dict[str, Any] | None = None  # the plateau rule's settings (sweeps.plateau)
    update_freq: int | None = None
    resources: dict[str, Any] | None = None  # the SLURM job's (sweeps.sweep.Resources)
    sweep: str | None = None  # the sweep's name ...
    sweep_file: str | None = None  # ... and file

    @property
    def name(self) -> str:
        return self.identity.name

    def to_dict(self) -> dict[str, Any]:
        """``run.json``'s object: the identity's fields, then the settings (None left out)."""
        settings = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "identity"}
        return {**self.identity.to_dict(), **{k: v for k, v in settings.items() if v is not None}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> RunSpec:
        own = {f.name for f in fields(cls)} - {"identity"}
        identity = Identity.from_dict({k: v for k, v in data.items() if k not in own}, where)
        return cls(identity=identity, **{k: v for k, v in data.items() if k in own})


def write_run_json(spec: RunSpec, run_dir: str | os.PathLike | None = None) -> Path:
    """``RUN_DIR/run.json`` (atomically): the one writer of a run's description."""
    return write_json(Path(run_dir or spec.run_dir) / RUN_JSON, spec.to_dict())


def read_run_json(run_dir: str | os.PathLike) -> RunSpec | None:
    """``RUN_DIR/run.json`` as written by :func:`write_run_json` (None when there is none);
    a ``run.json`` without a name is named after its folder."""
    path = Path(run_dir) / RUN_JSON
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix or remove it") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return RunSpec.from_dict({"name": Path(run_dir).name, **data}, str(path))


SHOWN = ("name", "method", "arch", "tying", "output_layer", "seed")  # a table of runs' columns
CHECKED = ("arch", "tying", "output_layer", "seed")  # what run.json and a checkpoint both say


def resolve(run_dir: Path, spec: RunSpec | None, trained: Identity | None,
            source: str) -> Identity:
    """The run's identity: ``run.json``'s, each of ``CHECKED`` taken from ``trained`` (what
    ``source`` says: the checkpoint, or an evaluation's record) where ``run.json`` does not
    name it (and ``method``, ``trained``'s or else ``Identity.label``). Refuses where the two
    name different values."""
    asked = spec.identity if spec is not None else trained or Identity(name=run_dir.name)
    found = {}
    for key in CHECKED:
        mine, theirs = getattr(asked, key), getattr(trained, key, None)
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(f"{run_dir}: {RUN_JSON} says {key} {mine!r}, {source} says "
                             f"{theirs!r}; the folder holds another run's files: evaluate the "
                             f"run its {RUN_JSON} describes, or fix that {RUN_JSON}")
        found[key] = theirs if mine is None else mine
    identity = replace(asked, **found, method=asked.method or getattr(trained, "method", None))
    return replace(identity, method=identity.label())


def flag_value(args: list[str] | None, flag: str) -> str | None:
    """The value after ``flag`` in a run's fairseq arguments (None where it is not given)."""
    args = args or []
    return args[args.index(flag) + 1] if flag in args else None
