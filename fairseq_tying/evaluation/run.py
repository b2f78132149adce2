"""A run folder's facts, read once into a :class:`RunFacts`: its ``run.json`` (a
:class:`~fairseq_tying.common.run_spec.RunSpec`) and the checkpoint's configuration give the
run's :class:`~fairseq_tying.common.run_spec.Identity` (``run_spec.resolve`` states which wins
and refuses where they disagree), which the evaluation writes into ``eval.json``'s ``run`` and
the study records carry."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fairseq_tying.common import RUN_JSON
from fairseq_tying.common.checkpoints import CheckpointConfig
from fairseq_tying.common.run_spec import Identity, RunSpec, read_run_json, resolve


@dataclass(frozen=True)
class RunFacts:
    """One run folder, read once: its identity, its ``run.json`` (None without one) and the
    configuration of the checkpoint evaluated, when read."""

    run_dir: Path
    identity: Identity
    spec: RunSpec | None = field(default=None, repr=False)
    config: CheckpointConfig | None = field(default=None, repr=False)

    @classmethod
    def read(cls, run_dir: str | os.PathLike, config: CheckpointConfig | None = None,
             recorded: Identity | None = None) -> RunFacts:
        """The facts of ``run_dir``: ``run.json`` with ``config`` (else with ``recorded``, the
        identity an evaluation wrote, ``eval.json``'s ``run``)."""
        run_dir = Path(run_dir).resolve()
        return cls._resolve(run_dir, read_run_json(run_dir), config, recorded)

    def with_checkpoint(self, config: CheckpointConfig) -> RunFacts:
        """These facts with the configuration of the checkpoint evaluated, without reading
        ``run.json`` again."""
        return self._resolve(self.run_dir, self.spec, config, None)

    @classmethod
    def _resolve(cls, run_dir: Path, spec: RunSpec | None, config: CheckpointConfig | None,
                 recorded: Identity | None) -> RunFacts:
        if config is not None:
            trained, source = config.identity(run_dir.name), "its checkpoint"
        else:
            trained, source = recorded, "its evaluation's record of it"
        return cls(run_dir, resolve(run_dir, spec, trained, source), spec, config)

    @property
    def data_dir(self) -> str | None:
        """The data the run was trained on, as ``run.json`` names it."""
        return self.spec.data_dir if self.spec is not None else None

    def data(self, given: str | os.PathLike | None) -> str:
        """``--data`` when given, else the run's own data dir."""
        if given is not None:
            return str(given)
        if self.data_dir is None:
            raise ValueError(f"--data is required ({self.run_dir}/{RUN_JSON} names no data_dir)")
        return self.data_dir
