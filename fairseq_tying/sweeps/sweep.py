"""What a sweep file becomes: a :class:`Sweep` of :class:`Run` s on :class:`Resources`.

A field that a sweep file sets declares its key with :func:`setting` (the key, when it is
spelled otherwise than the field, and the section it belongs to); the keys a section accepts
are the fields :func:`section_fields` finds, so the checks cannot drift from the dataclasses.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from fairseq_tying.common.eval_options import EvalOptions, TranslationEvalOptions
from fairseq_tying.common.run_spec import Identity, RunSpec


class SweepError(ValueError):
    """A sweep file is invalid; the message names the key."""


def setting(default: Any = MISSING, *, key: str | None = None, section: str | None = None,
            kind: str | None = None, minimum: int | None = None, unit: str | None = None,
            factory: Any = MISSING) -> Any:
    """A dataclass field set by a sweep file's ``key`` (default: the field's name) in
    ``section``; ``kind`` overrides the check its type implies (``time``: a SLURM time in
    minutes), ``minimum`` bounds an integer, ``unit`` names a number's unit in messages."""
    meta = {"key": key, "section": section, "kind": kind, "minimum": minimum, "unit": unit}
    return field(default=default, default_factory=factory, metadata=meta)


def section_fields(cls: type, section: str | None = None) -> dict[str, Field]:
    """``{key: field}`` of the fields of ``cls`` that ``section`` sets (every field when
    ``section`` is None)."""
    return {f.metadata.get("key") or f.name: f for f in fields(cls)
            if section is None or f.metadata.get("section") == section}


def data_bin(data_dir: Path) -> Path:
    """The binarized data of a prepared data dir (``D/bin``), or D itself if it is a data-bin."""
    return data_dir / "bin" if (data_dir / "bin").is_dir() else data_dir


@dataclass
class Resources:
    """The ``resources:`` section: the SLURM job that trains one run."""

    nodes: int = setting(1, minimum=1)
    gpus_per_node: int = setting(0, minimum=0)
    tasks_per_node: int = setting(1, minimum=1)  # default: gpus_per_node (one task per GPU)
    cpus_per_task: int = setting(1, minimum=1)
    mem_gb: float = setting(4, unit="GB")
    partition: str | None = None
    time_min: int = setting(60, key="time", kind="time")
    constraint: str | None = None
    account: str | None = None
    qos: str | None = None
    max_num_timeout: int = setting(3, minimum=0)
    array_parallelism: int = setting(64, minimum=1)
    signal_delay_s: int = setting(120, minimum=0)

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def gpu(self) -> bool:
        return self.gpus_per_node > 0


@dataclass
class Batch:
    """The ``batch:`` section: tokens per batch, and the update frequency, given directly or as
    the number of GPUs to simulate; ``fp16`` defaults to on for GPU jobs."""

    max_tokens: int | None = setting(None, minimum=1)
    target_gpus: int | None = setting(None, minimum=1)
    update_freq: int | None = setting(None, minimum=1)
    fp16: bool | None = None


@dataclass
class Run:
    """One point of the grid: a training job, then its evaluation. Which run it is (its name,
    data set, architecture, tying, output layer, seed, training arguments, task, tag) is its
    :class:`Identity`."""

    identity: Identity
    run_dir: Path
    data_dir: Path
    resources: Resources
    stopping: dict[str, Any] | None = None
    priority: int = 1  # its grid's `priority:` (default: the grid's position in the list)

    @property
    def name(self) -> str:
        return self.identity.name


EVALUATION = "evaluation"


@dataclass
class Sweep:
    name: str
    path: Path
    output_dir: Path
    resources: Resources
    runs: list[Run] = field(default_factory=list)
    # the `evaluation:` section: the job that scores each trained run
    eval_enabled: bool = setting(True, key="enabled", section=EVALUATION)
    eval_args: list[str] = setting(key="args", section=EVALUATION, kind="args", factory=list)
    eval_also: dict[str, list[str]] = setting(key="also", section=EVALUATION, kind="tagged_args",
                                              factory=dict)
    eval_time_min: int = setting(60, key="time", section=EVALUATION, kind="time")
    # default: the training job's
    eval_cpus: int = setting(1, key="cpus_per_task", section=EVALUATION, minimum=1)
    eval_mem_gb: float = setting(4, key="mem_gb", section=EVALUATION, unit="GB")
    # what `args` and each of `also` say, parsed once (sweeps.config.load_sweep)
    evaluation: EvalOptions = field(default_factory=TranslationEvalOptions)
    evaluation_also: dict[str, EvalOptions] = field(default_factory=dict)
    update_freq: int = 1
    task: str = "translation"
    continue_from: Path | None = None  # another sweep's runs to start from (launch/continuation)

    def spec(self, run: Run) -> RunSpec:
        """``run`` as its jobs and its ``run.json`` describe it."""
        return RunSpec(run.identity, run_dir=str(run.run_dir), data_dir=str(run.data_dir),
                       data_bin=str(data_bin(run.data_dir)),
                       world_size=run.resources.world_size, gpu=run.resources.gpu,
                       stopping=run.stopping, update_freq=self.update_freq,
                       resources=vars(run.resources), sweep=self.name,
                       sweep_file=str(self.path))
