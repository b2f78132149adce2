"""Expanding a sweep's grid into runs and their ``fairseq-train`` flags.

The part of reading a sweep that consults fairseq and the plugin, each only when called:
fairseq's registry of architectures (after the plugin has registered its own), the tying modes
and output layers, and the evaluation's flags (``common.eval_options``), which check the
sweep's evaluation arguments.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_tying.common import LM_TASK
from fairseq_tying.common.eval_options import EvalOptions, evaluate_options
from fairseq_tying.common.run_spec import Identity
from fairseq_tying.core.models.tying import TYING_MODES
from fairseq_tying.core.output_layers import OUTPUT_LAYERS
from fairseq_tying.sweeps.sweep import Batch, Resources, Run, SweepError
from fairseq_tying.sweeps.sweepfile import check_int, check_keys

# the identity's fields a grid spans (tag: a block's name part), a block's priority and flags
GRID_KEYS = {"dataset", "arch", "tying", "output_layer", "seed", "tag", "priority", "flags"}
# fairseq flags the launcher owns: setting them in `fairseq:` would contradict the grid/resources
OWNED_FLAGS = {"arch", "tying", "output_layer", "seed", "save_dir", "update_freq", "max_tokens",
               "fp16", "cpu", "user_dir", "log_file", "distributed_world_size",
               "distributed_rank", "distributed_init_method", "distributed_backend",
               "distributed_no_spawn", "distributed_port", "device_id"}
# flags that decide a run's length and checkpoints: one value for the whole sweep
STOPPING_FLAGS = {"max_epoch", "max_update", "patience", "no_epoch_checkpoints",
                  "disable_validation", "no_save"}
# what a record reads from fairseq's log (the parameter count, every validation's statistics)
LOG_FORMAT = "json"
# one grid point: (priority, dataset, arch, tying, output_layer, seed, tag, flags)
Point = tuple[Any, ...]


def fairseq_flags(raw: Any, where: str = "fairseq") -> list[str]:
    """``{lr: 0.001, share_all_embeddings: true, betas: "(0.9, 0.98)"}`` -> CLI flags."""
    section = check_keys(raw, set(raw) if isinstance(raw, dict) else set(), where)
    args: list[str] = []
    for key, value in section.items():
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", str(key)):
            raise SweepError(f"{where}.{key}: not a fairseq flag name")
        if key.replace("-", "_") in OWNED_FLAGS:
            raise SweepError(f"{where}.{key}: set by the launcher (use grid/batch/resources)")
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            args += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            raise SweepError(f"{where}.{key}: expected a scalar or list, got a mapping")
        else:
            args += [flag, str(value)]
    return args


def known_archs() -> set[str]:
    """Architectures fairseq knows, the plugin's among them (importing the package registers
    them)."""
    return set(ARCH_MODEL_REGISTRY)


def _grid_values(grid: dict, key: str, allowed: Collection[str] | None,
                 where: str = "grid") -> list:
    values = grid.get(key)
    if values is None:
        raise SweepError(f"{where}.{key}: missing (a list of values)")
    values = values if isinstance(values, list) else [values]
    if not values:
        raise SweepError(f"{where}.{key}: empty list")
    for v in values:
        if allowed is not None and v is not None and v not in allowed:
            raise SweepError(f"{where}.{key}: unknown value {v!r} (allowed: {sorted(allowed)})")
    return values


def expand_grid(raw: Any, block: int, blocks: int, data_dirs: dict[str, Path],
                shared: dict[str, Any] | None = None) -> list[Point]:
    """The points of one grid mapping; ``shared`` is the ``fairseq:`` section its ``flags`` may
    not repeat. A local sweep trains grids in ``priority`` order (default: their position in
    the list, from 1), and the grids of one priority seed by seed together."""
    where = f"grid[{block}]" if blocks > 1 else "grid"
    grid = check_keys(raw, GRID_KEYS, where)
    ds = _grid_values(grid, "dataset", set(data_dirs), where)
    archs = _grid_values(grid, "arch", None, where)
    known = known_archs()
    for arch in archs:
        if arch not in known:
            close = sorted(a for a in known if a.split("_")[0] == str(arch).split("_")[0])[:8]
            raise SweepError(f"{where}.arch: unknown architecture {arch!r} (not in fairseq's "
                             f"ARCH_MODEL_REGISTRY; similar: {close})")
    tyings = _grid_values(grid, "tying", TYING_MODES, where) if "tying" in grid else [None]
    layers = _grid_values(grid, "output_layer", OUTPUT_LAYERS, where) \
        if "output_layer" in grid else [None]
    seeds = _grid_values(grid, "seed", None, where)
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int):
            raise SweepError(f"{where}.seed: expected integers, got {s!r}")
    tag, flags = _block_flags(grid, where, shared or {})
    priority = check_int(grid.get("priority", block + 1), f"{where}.priority", 1)
    return [(priority, *point, tag, flags)
            for point in itertools.product(ds, archs, tyings, layers, seeds)]


def _block_flags(grid: dict, where: str, shared: dict[str, Any]) -> tuple[str | None, list[str]]:
    """A grid block's ``tag`` (a name part of its runs) and ``flags`` (fairseq flags of its
    runs only, e.g. ``{tied_embed_dim: 64, tied_projection: true}`` for tied+L)."""
    tag, raw = grid.get("tag"), grid.get("flags")
    if tag is not None and (not isinstance(tag, str)
                            or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", tag)):
        raise SweepError(f"{where}.tag: {tag!r} must be a simple name (letters, digits, _), "
                         "e.g. tiedL")
    if raw is None:
        return tag, []
    if not isinstance(raw, dict) or not raw:
        raise SweepError(f"{where}.flags: expected a mapping of fairseq flags, e.g. "
                         "{tied_embed_dim: 64, tied_projection: true}")
    if tag is None:
        raise SweepError(f"{where}.flags: runs with their own flags need a `tag` in the same "
                         "grid block (it goes into their names), e.g. tag: tiedL")
    for key in raw:
        norm = str(key).replace("-", "_")
        if any(str(k).replace("-", "_") == norm for k in shared):
            raise SweepError(f"{where}.flags.{key}: also set in the fairseq section; set it in "
                             "one place")
        if norm in STOPPING_FLAGS:
            raise SweepError(f"{where}.flags.{key}: training length and checkpoints are the "
                             "sweep's (fairseq/stopping sections), not a grid block's")
    return tag, fairseq_flags(raw, f"{where}.flags")


def grid_points(raw: Any, data_dirs: dict[str, Path], shared: dict[str, Any]) -> list[Point]:
    """The points of ``grid``: one mapping, or a list of them in priority order."""
    grids = raw if isinstance(raw, list) else [raw]
    if not grids:
        raise SweepError("grid: empty list (give a mapping, or a list of them in priority order)")
    return [p for i, g in enumerate(grids)
            for p in expand_grid(g, i, len(grids), data_dirs, shared)]


def train_flags(fairseq: Any, batch: Batch, res: Resources,
                stopping: dict[str, Any] | None) -> tuple[list[str], int]:
    """The fairseq-train flags every run shares (``fairseq``, ``batch``, the device and the
    ``stopping`` rule's epoch budget), and the update frequency."""
    update_freq = _update_freq(batch, res)
    common = fairseq_flags(fairseq)
    if "--log-format" not in common:
        common += ["--log-format", LOG_FORMAT]
    elif (given := common[common.index("--log-format") + 1]) != LOG_FORMAT:
        raise SweepError(f"fairseq.log_format: {given}; a run's record and the answer read "
                         f"fairseq's {LOG_FORMAT} log lines: set log_format: {LOG_FORMAT} or "
                         "leave it out")
    if batch.max_tokens is not None:
        common += ["--max-tokens", str(batch.max_tokens)]
    common += ["--update-freq", str(update_freq)]
    common += ["--fp16"] if (res.gpu if batch.fp16 is None else batch.fp16) else []
    common += [] if res.gpu else ["--cpu"]
    if stopping:
        common += ["--max-epoch", str(stopping["max_epoch"])]
        if "--update-epoch-batch-itr" not in common:
            # fairseq otherwise freezes the batches of the epoch it starts in: a run resumed at
            # an epoch boundary would see other batches than an uninterrupted one
            common += ["--update-epoch-batch-itr", "True"]
    return common, update_freq


def _update_freq(batch: Batch, res: Resources) -> int:
    """Gradient accumulation so that ``world_size`` workers simulate ``target_gpus`` of them."""
    if batch.update_freq is not None:
        return batch.update_freq
    if batch.target_gpus is None:
        return 1
    world = res.world_size
    if batch.target_gpus % world:
        raise SweepError(f"batch.target_gpus: {batch.target_gpus} is not a multiple of the job's "
                         f"world size {world} (resources.nodes x tasks per node)")
    return batch.target_gpus // world


def eval_options(args: list[str], also: dict[str, list[str]], task: str
                 ) -> tuple[EvalOptions, dict[str, EvalOptions]]:
    """The sweep's evaluation arguments as the options of the evaluation of ``task``
    (``evaluate`` or ``evaluate-lm``): the main one's and each tagged one's."""
    def parsed(where: str, given: list[str]) -> EvalOptions:
        try:
            return evaluate_options(given, task)
        except ValueError as err:
            tool = "evaluate-lm" if task == LM_TASK else "evaluate"
            raise SweepError(f"{where}: {err} (the flags of `python -m fairseq_tying.evaluation "
                             f"{tool}`, for fairseq's --task {task})") from err

    return (parsed("evaluation.args", args),
            {t: parsed(f"evaluation.also.{t}", a) for t, a in also.items()})


def make_runs(points: list[Point], data_dirs: dict[str, Path], out: Path, common: list[str],
              res: Resources, stopping: dict[str, Any] | None, task: str) -> list[Run]:
    """One :class:`Run` per grid point, named by its identity (``Identity.named``)."""
    runs: list[Run] = []
    for priority, d, arch, tying, layer, seed, tag, flags in points:
        args = ["--arch", arch, "--seed", str(seed)]
        args += ["--tying", tying] if tying is not None else []
        args += ["--output-layer", layer] if layer is not None else []
        identity = Identity.named(dataset=d, arch=arch, tying=tying, output_layer=layer,
                                  seed=seed, tag=tag, train_args=args + flags + common,
                                  task=task)
        if any(r.name == identity.name for r in runs):
            raise SweepError(f"grid: run {identity.name} appears in two grids (give one a "
                             "`tag`)")
        runs.append(Run(identity, run_dir=out / identity.name, data_dir=data_dirs[d],
                        resources=res, stopping=stopping, priority=priority))
    return runs
