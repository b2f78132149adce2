"""Reading a sweep file: YAML (``yaml.safe_load``), ``base:`` inheritance, ``${VAR:-default}``
expansion, and the checks of each section's keys and values.

The keys of ``resources:``, ``batch:`` and ``evaluation:`` and the checks of their values come
from the fields of :mod:`.sweep`'s dataclasses, those of ``stopping:`` from
:class:`~fairseq_tying.sweeps.plateau.Plateau`'s. Nothing here imports fairseq: the grid and
the flags it becomes are :mod:`.grid`'s. Every error is a :class:`SweepError` naming the key.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any

import yaml

from fairseq_tying.sweeps.plateau import Plateau
from fairseq_tying.sweeps.sweep import (
    EVALUATION,
    Batch,
    Resources,
    Sweep,
    SweepError,
    data_bin,
    section_fields,
)

TOP_KEYS = {"name", "output_dir", "datasets", "grid", "fairseq", "batch", "resources",
            "evaluation", "stopping", "base", "continue_from"}
# the plateau rule's settings; `maximize` follows fairseq's --maximize-best-checkpoint-metric
STOPPING_FIELDS = {f.name: f for f in fields(Plateau) if f.name != "maximize"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


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


def check_keys(section: Any, allowed: Any, where: str) -> dict:
    """``section`` as a mapping (None: empty) whose keys are all in ``allowed``."""
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise SweepError(f"{where}: expected a mapping, got {type(section).__name__}")
    for key in section:
        if key not in allowed:
            at = f"{where}.{key}" if where else key
            raise SweepError(f"{at}: unknown key (allowed: {', '.join(sorted(allowed))})")
    return section


def check_int(value: Any, key: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SweepError(f"{key}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise SweepError(f"{key}: must be >= {minimum}, got {value}")
    return value


def _positive(value: Any, key: str, meta: dict) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        unit = f" of {meta['unit']}" if meta.get("unit") else ""
        raise SweepError(f"{key}: expected a positive number{unit}, got {value!r}")
    return value


def _string(value: Any, key: str, meta: dict) -> str:
    if not isinstance(value, str):
        raise SweepError(f"{key}: expected a string, got {value!r}")
    return value


def _bool(value: Any, key: str, meta: dict) -> bool:
    if not isinstance(value, bool):
        raise SweepError(f"{key}: expected true or false, got {value!r}")
    return value


def _path(value: Any, key: str, meta: dict) -> Path:
    if not isinstance(value, str) or not value:
        raise SweepError(f"{key}: expected a path, got {value!r}")
    return Path(value)


def _args(value: Any, key: str, meta: dict) -> list[str]:
    if not isinstance(value, list):
        raise SweepError(f"{key}: expected a list of command-line arguments")
    return [str(a) for a in value]


def _tagged_args(value: Any, key: str, meta: dict) -> dict[str, list[str]]:
    section = check_keys(value, set(value) if isinstance(value, dict) else set(), key)
    for tag, args in section.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", str(tag)) or not isinstance(args, list):
            raise SweepError(f"{key}.{tag}: expected a lower-case name mapped to a list of "
                             "evaluation arguments, e.g. best: [--checkpoint, "
                             "checkpoint_best.pt]")
    return {t: [str(a) for a in args] for t, args in section.items()}


Check = Callable[[Any, str, dict], Any]  # (value, its key, the setting's metadata) -> value
# how a value is checked: a setting's `kind`, else its type (without `| None`)
CHECKS: dict[str, Check] = {"int": lambda v, key, meta: check_int(v, key, meta.get("minimum")),
          "float": _positive, "str": _string, "bool": _bool, "path": _path,
          "time": lambda v, key, meta: parse_time(v, key),
          "args": _args, "tagged_args": _tagged_args}


def check_value(f: Field, value: Any, key: str, checks: Mapping[str, Check] = CHECKS) -> Any:
    """``value`` of the setting ``f``, checked as its kind or type says."""
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if value is None and annotation.endswith(" | None"):
        return None
    kind = f.metadata.get("kind") or annotation.removesuffix(" | None")
    return checks[kind](value, key, f.metadata)


def read_section(raw: Any, cls: type, where: str, section: str | None = None,
                 checks: Mapping[str, Check] = CHECKS) -> dict[str, Any]:
    """``{field name: checked value}`` of the keys ``raw`` gives, for the fields of ``cls`` that
    ``section`` sets; a key that is no such field is refused, naming the allowed ones, and a
    field without a default must be given (its check names what it expects). ``checks``: the
    checks by kind, for a file whose kinds are its own (the study manifest's)."""
    settings = section_fields(cls, section)
    given = check_keys(raw, settings, where)
    for key, f in settings.items():
        if key not in given and f.default is MISSING and f.default_factory is MISSING:
            check_value(f, None, f"{where}.{key}", checks)  # refused: names what it expects
            raise SweepError(f"{where}.{key}: missing")
    return {settings[k].name: check_value(settings[k], v, f"{where}.{k}", checks)
            for k, v in given.items()}


def parse_resources(raw: Any) -> Resources:
    where = "resources"
    given = read_section(raw, Resources, where)
    gpus = given.get("gpus_per_node", 0)
    res = Resources(**{"tasks_per_node": max(gpus, 1), **given})
    if gpus and res.tasks_per_node != gpus:
        raise SweepError(f"{where}.tasks_per_node: GPU jobs run one task per GPU, so it must equal"
                         f" gpus_per_node ({gpus}), got {res.tasks_per_node}")
    if res.signal_delay_s >= res.time_min * 60:
        raise SweepError(f"{where}.signal_delay_s: {res.signal_delay_s}s leaves no time to train "
                         f"in a {res.time_min} min job")
    return res


def parse_batch(raw: Any, res: Resources) -> Batch:
    batch = Batch(**read_section(raw, Batch, "batch"))
    if batch.update_freq is not None and batch.target_gpus is not None:
        raise SweepError("batch.update_freq: give either update_freq or target_gpus, not both")
    if batch.fp16 and not res.gpu:
        raise SweepError("batch.fp16: fp16 needs GPUs (resources.gpus_per_node is 0)")
    return batch


def parse_evaluation(raw: Any, res: Resources) -> dict[str, Any]:
    """The ``evaluation`` section as the ``eval_*`` fields of :class:`Sweep` (its job's CPUs
    and memory default to the training job's)."""
    given = read_section(raw, Sweep, EVALUATION, EVALUATION)
    return {"eval_cpus": res.cpus_per_task, "eval_mem_gb": res.mem_gb, **given}


def parse_stopping(raw: Any, fairseq: Any) -> dict[str, Any] | None:
    """``stopping: {patience, min_gain, min_epoch, max_epoch, plateau}``: train each run to a
    validation plateau (:mod:`fairseq_tying.sweeps.plateau`), with a checkpoint every epoch."""
    if raw is None:
        return None
    where = "stopping"
    section = check_keys(raw, STOPPING_FIELDS, where)
    fairseq = fairseq if isinstance(fairseq, dict) else {}
    for key in ("max_epoch", "max_update", "patience"):
        if fairseq.get(key) or fairseq.get(key.replace("_", "-")):
            raise SweepError(f"fairseq.{key}: the stopping section decides when runs end; "
                             "remove it (or remove `stopping:` for a fixed budget)")
    for key in ("no_epoch_checkpoints", "disable_validation", "no_save"):
        if fairseq.get(key):
            raise SweepError(f"fairseq.{key}: the plateau rule needs a validation and a "
                             "checkpoint at every epoch's end; remove it")
    if not isinstance(on := section.get("plateau", Plateau.plateau), bool):
        raise SweepError(f"{where}.plateau: expected true or false (false: every run trains "
                         f"to max_epoch), got {on!r}")
    gain = section.get("min_gain", Plateau.min_gain)
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 <= gain < 1:
        raise SweepError(f"{where}.min_gain: expected a fraction in [0, 1), e.g. 0.005 for "
                         f"0.5 %, got {gain!r}")
    epochs = {key: check_int(section.get(key, getattr(Plateau, key)), f"{where}.{key}", 1)
              for key in ("patience", "min_epoch", "max_epoch")}
    out = {"patience": epochs["patience"], "min_gain": float(gain),
           "min_epoch": epochs["min_epoch"], "max_epoch": epochs["max_epoch"], "plateau": on}
    if out["min_epoch"] > out["max_epoch"]:
        raise SweepError(f"{where}.min_epoch: {out['min_epoch']} is after max_epoch "
                         f"{out['max_epoch']}")
    return out


def read_sweep_file(path: Path) -> dict:
    """The file's top-level mapping on top of its ``base:`` files', with its keys checked and
    the required sections present."""
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
    raw = dict(check_keys(raw, TOP_KEYS, ""))
    if (base := raw.pop("base", None)) is None:
        return raw
    if not isinstance(base, str):
        raise SweepError(f"{path}: base: expected the path of another sweep file, got {base!r}")
    base_path = (path.parent / base).resolve()
    if base_path in (*seen, path.resolve()):
        raise SweepError(f"{path}: base: {base} is the file itself or includes it")
    return {**_with_base(base_path, (*seen, path.resolve())), **raw}


def sweep_name(raw: dict, path: Path) -> str:
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name):
        raise SweepError(f"name: {name!r} must be a simple name (letters, digits, _ . -)")
    return name


def output_dir(raw: dict, name: str, override: str | Path | None) -> Path:
    """``override``, else ``output_dir`` (``${VAR}`` expanded), else ``runs/NAME``; absolute."""
    out = override or raw.get("output_dir") or f"runs/{name}"
    return Path(expand_vars(str(out), "output_dir")).expanduser().resolve()


def data_dirs(datasets: Any, check_data: bool) -> dict[str, Path]:
    """``datasets: {name: dir}`` -> resolved dirs (``${VAR}`` expanded), checked to hold
    binarized data unless ``check_data`` is off (dry runs)."""
    datasets = check_keys(datasets, set(datasets) if isinstance(datasets, dict) else set(),
                          "datasets")
    dirs: dict[str, Path] = {}
    for dname, dpath in datasets.items():
        if not isinstance(dpath, str):
            raise SweepError(f"datasets.{dname}: expected a directory path")
        d = Path(expand_vars(dpath, f"datasets.{dname}")).expanduser().resolve()
        if check_data:
            check_data_dir(dname, d)
        dirs[dname] = d
    return dirs


def check_data_dir(dname: str, d: Path) -> None:
    """The dataset ``dname``'s folder ``d`` holds binarized data."""
    if not any(data_bin(d).glob("dict*.txt")):
        raise SweepError(f"datasets.{dname}: data dir {d} does not exist or holds no "
                         "binarized data (expected D/bin/dict*.txt from fairseq-preprocess)")


def continue_from(raw: Any, stopping: dict[str, Any] | None, out: Path) -> Path | None:
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
