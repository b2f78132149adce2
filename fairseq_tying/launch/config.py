"""Sweep files: loading (yaml.safe_load), schema validation and expansion into runs.

Every error is a :class:`SweepError` naming the key at fault; validation happens before anything
is submitted.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fairseq_tying.common import LM_TASK
from fairseq_tying.core.models.tying import TYING_MODES
from fairseq_tying.core.scoring import OUTPUT_LAYERS
from fairseq_tying.launch import plateau

TOP_KEYS = {"name", "output_dir", "datasets", "grid", "fairseq", "batch", "resources",
            "evaluation", "stopping", "base", "continue_from"}
GRID_KEYS = {"dataset", "arch", "tying", "output_layer", "seed", "flags", "tag", "priority"}
BATCH_KEYS = {"max_tokens", "target_gpus", "update_freq", "fp16"}
RESOURCE_KEYS = {"nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "mem_gb",
                 "partition", "time", "constraint", "account", "qos", "max_num_timeout",
                 "array_parallelism", "signal_delay_s"}
EVAL_KEYS = {"enabled", "args", "also", "time", "cpus_per_task", "mem_gb"}
# fairseq flags the launcher owns: setting them in `fairseq:` would contradict the grid/resources
OWNED_FLAGS = {"arch", "tying", "output_layer", "seed", "save_dir", "update_freq", "max_tokens",
               "fp16", "cpu", "user_dir", "log_file", "distributed_world_size",
               "distributed_rank", "distributed_init_method", "distributed_backend",
               "distributed_no_spawn", "distributed_port", "device_id"}
# flags that decide a run's length and checkpoints: one value for the whole sweep
STOPPING_FLAGS = {"max_epoch", "max_update", "patience", "no_epoch_checkpoints",
                  "disable_validation", "no_save"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class SweepError(ValueError):
    """A sweep file is invalid; the message names the key."""


def expand_vars(value: str, key: str) -> str:
    """``${VAR}`` and ``${VAR:-default}`` from the environment."""

    def sub(m: re.Match) -> str:
        if m.group(1) in os.environ:
            return os.environ[m.group(1)]
        if m.group(2) is not None:
            return m.group(2)
        raise SweepError(f"{key}: environment variable {m.group(1)} is not set")

    return _VAR.sub(sub, value)


def parse_time(value: Any, key: str) -> int:
    """SLURM time (``MM``, ``HH:MM:SS``, ``D-HH:MM[:SS]``) or minutes -> minutes."""
    if isinstance(value, int) and not isinstance(value, bool):
        minutes = value
    elif isinstance(value, str) and re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", value):
        days, _, rest = value.rpartition("-")
        parts = [int(p) for p in rest.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif days:
            h, m, s = (parts + [0, 0])[:3]
        else:
            h, m, s = ([0] * (3 - len(parts)) + parts)
        minutes = int(days or 0) * 1440 + h * 60 + m + math.ceil(s / 60)
    else:
        raise SweepError(f"{key}: {value!r} is not a SLURM time (minutes, HH:MM:SS, D-HH:MM)")
    if minutes <= 0:
        raise SweepError(f"{key}: time must be positive, got {value!r}")
    return minutes


@dataclass
class Resources:
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    mem_gb: float = 4
    partition: str | None = None
    time_min: int = 60
    constraint: str | None = None
    account: str | None = None
    qos: str | None = None
    max_num_timeout: int = 3
    array_parallelism: int = 64
    signal_delay_s: int = 120

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def gpu(self) -> bool:
        return self.gpus_per_node > 0


@dataclass
class Run:
    """One point of the grid: a training job, then its evaluation."""

    name: str
    run_dir: Path
    data_dir: Path
    dataset: str
    arch: str
    tying: str | None
    output_layer: str | None
    seed: int
    train_args: list[str]
    resources: Resources
    stopping: dict[str, Any] | None = None
    priority: int = 1  # its grid's `priority:` (default: the grid's position in the list)
    task: str = "translation"  # fairseq's --task: what the evaluation job does with the run
    tag: str | None = None  # the grid block's name tag (its extra `flags`)

    def describe(self) -> dict:
        return {"name": self.name, "run_dir": str(self.run_dir), "data_dir": str(self.data_dir),
                "data_bin": str(data_bin(self.data_dir)), "dataset": self.dataset,
                "arch": self.arch, "tying": self.tying, "output_layer": self.output_layer,
                "seed": self.seed, "task": self.task, "tag": self.tag,
                "world_size": self.resources.world_size, "gpu": self.resources.gpu,
                "train_args": self.train_args, "stopping": self.stopping}


@dataclass
class Sweep:
    name: str
    path: Path
    output_dir: Path
    resources: Resources
    runs: list[Run] = field(default_factory=list)
    eval_enabled: bool = True
    eval_args: list[str] = field(default_factory=list)
    eval_also: dict[str, list[str]] = field(default_factory=dict)
    eval_time_min: int = 60
    eval_cpus: int = 1
    eval_mem_gb: float = 4
    update_freq: int = 1
    task: str = "translation"
    continue_from: Path | None = None  # another sweep's runs to start from (launch/continuation)


def data_bin(data_dir: Path) -> Path:
    """The binarized data of a prepared data dir (``D/bin``), or D itself if it is a data-bin."""
    return data_dir / "bin" if (data_dir / "bin").is_dir() else data_dir


def _check_keys(section: Any, allowed: set[str], where: str) -> dict:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise SweepError(f"{where}: expected a mapping, got {type(section).__name__}")
    for key in section:
        if key not in allowed:
            raise SweepError(f"{where}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})"
                             if where else
                             f"{key}: unknown key (allowed: {', '.join(sorted(allowed))})")
    return section


def _int(section: dict, key: str, where: str, default: int, minimum: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SweepError(f"{where}.{key}: expected an integer, got {value!r}")
    if value < minimum:
        raise SweepError(f"{where}.{key}: must be >= {minimum}, got {value}")
    return value


def _opt_str(section: dict, key: str, where: str) -> str | None:
    value = section.get(key)
    if value is not None and not isinstance(value, str):
        raise SweepError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def parse_resources(raw: Any) -> Resources:
    where = "resources"
    section = _check_keys(raw, RESOURCE_KEYS, where)
    gpus = _int(section, "gpus_per_node", where, 0, 0)
    res = Resources(
        nodes=_int(section, "nodes", where, 1, 1),
        gpus_per_node=gpus,
        tasks_per_node=_int(section, "tasks_per_node", where, max(gpus, 1), 1),
        cpus_per_task=_int(section, "cpus_per_task", where, 1, 1),
        partition=_opt_str(section, "partition", where),
        time_min=parse_time(section.get("time", 60), f"{where}.time"),
        constraint=_opt_str(section, "constraint", where),
        account=_opt_str(section, "account", where),
        qos=_opt_str(section, "qos", where),
        max_num_timeout=_int(section, "max_num_timeout", where, 3, 0),
        array_parallelism=_int(section, "array_parallelism", where, 64, 1),
        signal_delay_s=_int(section, "signal_delay_s", where, 120, 0),
    )
    mem = section.get("mem_gb", 4)
    if isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem <= 0:
        raise SweepError(f"{where}.mem_gb: expected a positive number of GB, got {mem!r}")
    res.mem_gb = mem
    if gpus and res.tasks_per_node != gpus:
        raise SweepError(f"{where}.tasks_per_node: GPU jobs run one task per GPU, so it must equal"
                         f" gpus_per_node ({gpus}), got {res.tasks_per_node}")
    if res.signal_delay_s >= res.time_min * 60:
        raise SweepError(f"{where}.signal_delay_s: {res.signal_delay_s}s leaves no time to train "
                         f"in a {res.time_min} min job")
    return res


def fairseq_flags(raw: Any, where: str = "fairseq") -> list[str]:
    """``{lr: 0.001, share_all_embeddings: true, betas: "(0.9, 0.98)"}`` -> CLI flags."""
    section = _check_keys(raw, set(raw) if isinstance(raw, dict) else set(), where)
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


def parse_stopping(raw: Any, fairseq: Any) -> dict[str, Any] | None:
    """``stopping: {patience, min_gain, max_epoch}``: train each run to a validation plateau
    (:mod:`fairseq_tying.launch.plateau`), with a checkpoint every epoch."""
    if raw is None:
        return None
    where = "stopping"
    section = _check_keys(raw, plateau.KEYS, where)
    fairseq = fairseq if isinstance(fairseq, dict) else {}
    for key in ("max_epoch", "max_update", "patience"):
        if fairseq.get(key) or fairseq.get(key.replace("_", "-")):
            raise SweepError(f"fairseq.{key}: the stopping section decides when runs end; "
                             "remove it (or remove `stopping:` for a fixed budget)")
    for key in ("no_epoch_checkpoints", "disable_validation", "no_save"):
        if fairseq.get(key):
            raise SweepError(f"fairseq.{key}: the plateau rule needs a validation and a "
                             "checkpoint at every epoch's end; remove it")
    if not isinstance(on := section.get("plateau", True), bool):
        raise SweepError(f"{where}.plateau: expected true or false (false: every run trains "
                         f"to max_epoch), got {on!r}")
    gain = section.get("min_gain", plateau.Plateau.min_gain)
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 <= gain < 1:
        raise SweepError(f"{where}.min_gain: expected a fraction in [0, 1), e.g. 0.005 for "
                         f"0.5 %, got {gain!r}")
    out = {"patience": _int(section, "patience", where, plateau.Plateau.patience, 1),
           "min_gain": float(gain),
           "min_epoch": _int(section, "min_epoch", where, plateau.Plateau.min_epoch, 1),
           "max_epoch": _int(section, "max_epoch", where, plateau.Plateau.max_epoch, 1),
           "plateau": on}
    if out["min_epoch"] > out["max_epoch"]:
        raise SweepError(f"{where}.min_epoch: {out['min_epoch']} is after max_epoch "
                         f"{out['max_epoch']}")
    return out


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


def known_archs() -> set[str]:
    """Architectures fairseq knows once the plugin is imported."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_tying  # noqa: F401  (registers the plugin's models)

    return set(ARCH_MODEL_REGISTRY)


def expand_grid(raw: Any, block: int, blocks: int, data_dirs: dict[str, Path],
                shared: dict[str, Any] | None = None) -> list[tuple]:
    """The points (priority, dataset, arch, tying, output_layer, seed, tag, flags) of one grid
    mapping; ``shared`` is the ``fairseq:`` section its ``flags`` may not repeat. A local sweep
    trains grids in ``priority`` order (default: their position in the list, from 1), and
    the grids of one priority seed by seed together."""
    where = f"grid[{block}]" if blocks > 1 else "grid"
    grid = _check_keys(raw, GRID_KEYS, where)
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
    priority = _int(grid, "priority", where, block + 1, 1)
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


def load_sweep(path: str | Path, output_dir: str | Path | None = None,
               check_data: bool = True) -> Sweep:
    """Read and validate a sweep file and expand its grid into runs (nothing is submitted)."""
    path = Path(path)
    raw = _read_sweep_file(path)
    name = _sweep_name(raw, path)
    data_dirs = _data_dirs(raw["datasets"], check_data)
    shared = raw.get("fairseq") if isinstance(raw.get("fairseq"), dict) else {}
    task = str(shared.get("task", "translation"))
    points = _grid_points(raw["grid"], data_dirs, shared)
    res = parse_resources(raw.get("resources"))
    common, update_freq, stopping = _train_flags(raw, res)
    evaluation = _evaluation(raw.get("evaluation"), res, task)
    out = output_dir or raw.get("output_dir") or f"runs/{name}"
    out = Path(expand_vars(str(out), "output_dir")).expanduser().resolve()
    sweep = Sweep(name=name, path=path.resolve(), output_dir=out, resources=res,
                  update_freq=update_freq, task=task, **evaluation,
                  continue_from=_continue_from(raw.get("continue_from"), stopping, out))
    sweep.runs = _runs(points, data_dirs, out, common, res, stopping, task)
    return sweep


def _continue_from(raw: Any, stopping: dict[str, Any] | None, out: Path) -> Path | None:
    """``continue_from: DIR``: the runs of another sweep (same names, same commands up to
    their training length) whose epoch checkpoints this sweep's runs start from."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise SweepError(f"continue_from: expected the output_dir of another sweep, got {raw!r}")
    if not stopping:
        raise SweepError("continue_from: needs a `stopping:` section (epoch checkpoints and a "
                         "validation history to continue)")
    src = Path(expand_vars(raw, "continue_from")).expanduser().resolve()
    if src == out:
        raise SweepError(f"continue_from: {src} is this sweep's own output_dir; runs resume "
                         "there anyway")
    return src


def _read_sweep_file(path: Path) -> dict:
    """The file's top-level mapping, with its keys checked and the required sections present."""
    raw = _with_base(path, ())
    for key in ("datasets", "grid"):
        if key not in raw:
            raise SweepError(f"{key}: missing required section")
    return raw


def _with_base(path: Path, seen: tuple[Path, ...]) -> dict:
    """A sweep file's mapping on top of its ``base:`` file's (relative to it): each top-level
    section it names replaces the base's whole section, so a variant of a sweep states only
    what differs."""
    if not path.exists():
        where = f"{seen[-1]}: base: " if seen else ""
        raise SweepError(f"{where}sweep file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SweepError(f"{path}: not valid YAML: {err}") from err
    raw = dict(_check_keys(raw, TOP_KEYS, ""))
    if (base := raw.pop("base", None)) is None:
        return raw
    if not isinstance(base, str):
        raise SweepError(f"{path}: base: expected the path of another sweep file, got {base!r}")
    base_path = (path.parent / base).resolve()
    if base_path in (*seen, path.resolve()):
        raise SweepError(f"{path}: base: {base} is the file itself or includes it")
    return {**_with_base(base_path, (*seen, path.resolve())), **raw}


def _sweep_name(raw: dict, path: Path) -> str:
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name):
        raise SweepError(f"name: {name!r} must be a simple name (letters, digits, _ . -)")
    return name


def _data_dirs(datasets: Any, check_data: bool) -> dict[str, Path]:
    """``datasets: {name: dir}`` -> resolved dirs (``${VAR}`` expanded), checked to hold
    binarized data unless ``check_data`` is off (dry runs)."""
    datasets = _check_keys(datasets, set(datasets) if isinstance(datasets, dict) else set(),
                           "datasets")
    data_dirs: dict[str, Path] = {}
    for dname, dpath in datasets.items():
        if not isinstance(dpath, str):
            raise SweepError(f"datasets.{dname}: expected a directory path")
        d = Path(expand_vars(dpath, f"datasets.{dname}")).expanduser().resolve()
        if check_data and not any(data_bin(d).glob("dict*.txt")):
            raise SweepError(f"datasets.{dname}: data dir {d} does not exist or holds no "
                             "binarized data (expected D/bin/dict*.txt from fairseq-preprocess)")
        data_dirs[dname] = d
    return data_dirs


def _grid_points(raw: Any, data_dirs: dict[str, Path], shared: dict[str, Any]) -> list[tuple]:
    """The points of ``grid``: one mapping, or a list of them in priority order."""
    grids = raw if isinstance(raw, list) else [raw]
    if not grids:
        raise SweepError("grid: empty list (give a mapping, or a list of them in priority order)")
    return [p for i, g in enumerate(grids)
            for p in expand_grid(g, i, len(grids), data_dirs, shared)]


def _train_flags(raw: dict, res: Resources) -> tuple[list[str], int, dict[str, Any] | None]:
    """The fairseq-train flags every run shares (``fairseq``, ``batch``, the device and the
    ``stopping`` rule's epoch budget), the update frequency, and the stopping rule."""
    batch = _check_keys(raw.get("batch"), BATCH_KEYS, "batch")
    update_freq = _update_freq(batch, res)
    fp16 = batch.get("fp16", res.gpu)
    if fp16 and not res.gpu:
        raise SweepError("batch.fp16: fp16 needs GPUs (resources.gpus_per_node is 0)")
    common = fairseq_flags(raw.get("fairseq"))
    if "max_tokens" in batch:
        common += ["--max-tokens", str(_int(batch, "max_tokens", "batch", 0, 1))]
    common += ["--update-freq", str(update_freq)]
    common += ["--fp16"] if fp16 else []
    common += [] if res.gpu else ["--cpu"]
    stopping = parse_stopping(raw.get("stopping"), raw.get("fairseq"))
    if stopping:
        common += ["--max-epoch", str(stopping["max_epoch"])]
        if "--update-epoch-batch-itr" not in common:
            # fairseq otherwise freezes the batches of the epoch it starts in: a run resumed at
            # an epoch boundary would see other batches than an uninterrupted one
            common += ["--update-epoch-batch-itr", "True"]
    return common, update_freq, stopping


def _evaluation(raw: Any, res: Resources, task: str) -> dict[str, Any]:
    """The ``evaluation`` section as the ``eval_*`` fields of :class:`Sweep`; its arguments
    are checked against the evaluation of ``task`` (``evaluate`` or ``evaluate-lm``)."""
    ev = _check_keys(raw, EVAL_KEYS, "evaluation")
    eval_args = ev.get("args", [])
    if not isinstance(eval_args, list):
        raise SweepError("evaluation.args: expected a list of command-line arguments")
    _check_eval_args(eval_args, "evaluation.args", task)
    also = _check_keys(ev.get("also"), set(ev.get("also") or {}), "evaluation.also")
    for tag, args in also.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", str(tag)) or not isinstance(args, list):
            raise SweepError(f"evaluation.also.{tag}: expected a lower-case name mapped to a "
                             "list of evaluation arguments, e.g. best: [--checkpoint, "
                             "checkpoint_best.pt]")
        _check_eval_args(args, f"evaluation.also.{tag}", task)
    return {"eval_enabled": bool(ev.get("enabled", True)),
            "eval_args": [str(a) for a in eval_args],
            "eval_also": {t: [str(a) for a in args] for t, args in also.items()},
            "eval_time_min": parse_time(ev.get("time", 60), "evaluation.time"),
            "eval_cpus": _int(ev, "cpus_per_task", "evaluation", res.cpus_per_task, 1),
            "eval_mem_gb": ev.get("mem_gb", res.mem_gb)}


def _check_eval_args(args: list, where: str, task: str) -> None:
    from fairseq_tying.evaluation.cli import evaluate_options

    try:
        evaluate_options([str(a) for a in args], task)
    except ValueError as err:
        tool = "evaluate-lm" if task == LM_TASK else "evaluate"
        raise SweepError(f"{where}: {err} (the flags of `python -m fairseq_tying.evaluation "
                         f"{tool}`, for fairseq's --task {task})") from err


def _runs(points: list[tuple], data_dirs: dict[str, Path], out: Path, common: list[str],
          res: Resources, stopping: dict[str, Any] | None, task: str) -> list[Run]:
    """One :class:`Run` per grid point, named
    ``dataset.arch[.tying][.output_layer][.tag].sSEED``."""
    runs: list[Run] = []
    for priority, d, arch, tying, layer, seed, tag, flags in points:
        parts = [d, arch, tying, layer, tag, f"s{seed}"]
        rname = ".".join(str(p) for p in parts if p is not None)
        if any(r.name == rname for r in runs):
            raise SweepError(f"grid: run {rname} appears in two grids (give one a `tag`)")
        args = ["--arch", arch, "--seed", str(seed)]
        args += ["--tying", tying] if tying is not None else []
        args += ["--output-layer", layer] if layer is not None else []
        runs.append(Run(name=rname, run_dir=out / rname, data_dir=data_dirs[d], dataset=d,
                        arch=arch, tying=tying, output_layer=layer, seed=seed,
                        train_args=args + flags + common, resources=res, stopping=stopping,
                        priority=priority, task=task, tag=tag))
    return runs


def _update_freq(batch: dict, res: Resources) -> int:
    """Gradient accumulation so that ``world_size`` workers simulate ``target_gpus`` of them."""
    if "update_freq" in batch and "target_gpus" in batch:
        raise SweepError("batch.update_freq: give either update_freq or target_gpus, not both")
    if "update_freq" in batch:
        return _int(batch, "update_freq", "batch", 1, 1)
    if "target_gpus" not in batch:
        return 1
    target = _int(batch, "target_gpus", "batch", 1, 1)
    world = res.world_size
    if target % world:
        raise SweepError(f"batch.target_gpus: {target} is not a multiple of the job's world size "
                         f"{world} (resources.nodes x tasks per node)")
    return target // world
