"""The one record type of the across-run views: one finished run.

A study's record is a JSON file, small enough to commit, complete enough to recompute every
table and plot: the run's settings, fairseq's parameter count and validations, the scores with
their signatures, the tied matrix's row norms, and the hypotheses (``NAME.hyp.gz`` beside
``NAME.json``). A language model's record holds its test loss and perplexity (``eval``,
``eval_TAG``) instead, and has no hypotheses. ``collect`` makes the same record from a run's
``eval.json`` without exporting it.

Everything a record says about a run comes from the run folder: ``run.json``
(``evaluation.run``), fairseq's log, the plateau rule's files and the evaluations.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from fairseq_tying.common import CONTINUED_FROM, EVAL_JSON, LM_TASK, TRAIN_DONE, VALID_HISTORY
from fairseq_tying.common.atomic import atomic_write, read_lines, write_json
from fairseq_tying.evaluation import norms
from fairseq_tying.evaluation.run import IDENTITY, read_run_json
from fairseq_tying.studies.significance import metric_stats

EVAL_KEYS = ("bleu", "bleu_signature", "bleu_verbose", "chrf", "chrf_signature", "tok_bleu",
             "tok_bleu_signature", "preset", "beam", "lenpen", "subset", "n_sentences",
             "references_sha256")
RUN_KEYS = ("name", "dataset", "arch", "tying", "output_layer", "seed", "train_args")
LM_RUN_KEYS = (*RUN_KEYS, "task", "tag")
LM_EVAL_KEYS = ("loss", "perplexity", "n_tokens", "subset", "tokens_per_sample",
                "sample_break_mode")
PARAMS = re.compile(r"num\. (?:shared )?model params: ([\d,]+) \(num\. trained: ([\d,]+)\)")
VALID = re.compile(r"\| valid \| (\{.*\})\s*$")
DONE = re.compile(r"done training in ([\d.]+) seconds")
WALL = re.compile(r'"wall": "([\d.]+)"')  # train_inner's seconds since its process started


@dataclass(eq=False)
class Record:
    """One run: what its JSON holds (``data``, read as ``record[key]``), its hypotheses (none
    for a language model) and, for a run read from its folder, that folder."""

    data: dict[str, Any]
    hypotheses: list[str] | None = None
    run_dir: Path | None = None
    _stats: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def is_lm(self) -> bool:
        return self.data.get("task") == LM_TASK

    def sentence_stats(self, metric: str, refs: list[str]) -> np.ndarray:
        """sacrebleu's per-sentence statistics of ``metric``, computed once per record."""
        if metric not in self._stats:
            if self.hypotheses is None:
                raise ValueError(f"{self.name}: no hypotheses to compare sentence by sentence")
            self._stats[metric] = metric_stats(self.hypotheses, refs, metric)
        return self._stats[metric]


def training_summary(log: Path) -> dict[str, Any]:
    """Parameter count, validations ([updates, NLL] pairs, the last in full) and training time
    from fairseq's log (json format). A run resumed after a kill, or continued from another
    run's checkpoints, is logged by several processes, each starting with its parameter count,
    and fairseq's "done training in" times the last one only: each earlier process adds its own
    "done training in", or if it was killed the last wall clock it logged (every
    ``--log-interval`` updates, so up to that many short of where it was killed)."""
    out: dict[str, Any] = {}
    earlier, wall = 0.0, 0.0
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if m := WALL.search(line):
            wall = float(m.group(1))
        if m := PARAMS.search(line):  # a new process
            earlier, wall = earlier + wall, 0.0
            out["params"] = int(m.group(1).replace(",", ""))
            out["params_trained"] = int(m.group(2).replace(",", ""))
        elif m := VALID.search(line):
            stats = json.loads(m.group(1))
            out["valid"] = {k.removeprefix("valid_"): float(v) for k, v in stats.items()
                            if k.startswith("valid_") and k not in ("valid_wps", "valid_wpb",
                                                                    "valid_bsz")}
            updates = int(out["valid"]["num_updates"])
            # a run resumed after a kill may validate the same update again: keep the last
            out["valid_history"] = [h for h in out.get("valid_history", []) if h[0] < updates]
            # a language model's cross_entropy logs its NLL as `loss`
            nll = out["valid"].get("nll_loss", out["valid"]["loss"])
            out["valid_history"].append([updates, nll])
        elif m := DONE.search(line):
            wall = float(m.group(1))
            out["train_seconds"] = round(earlier + wall, 1)
    if "params" not in out or "valid" not in out:
        raise ValueError(f"{log}: no parameter count or validation line; is the run finished "
                         "and logged with --log-format json?")
    return out


def plateau_summary(run_dir: Path) -> dict[str, Any]:
    """Under the plateau rule: ``stop`` (epoch, update, reason) from ``train.done`` and the
    per-epoch validations ``valid_epochs`` ([epoch, update, value] of the watched metric)."""
    done = run_dir / TRAIN_DONE
    stop = json.loads(done.read_text()).get("stop") if done.is_file() else None
    if stop is None:
        return {}
    history = json.loads((run_dir / VALID_HISTORY).read_text())
    return {"stop": stop, "valid_metric": history["metric"],
            "valid_epochs": [[h["epoch"], h["update"], h["value"]] for h in history["epochs"]]}


def train_facts(run_dir: Path) -> dict[str, Any]:
    """A record's ``train``: what fairseq's log and the plateau rule's files say, and the
    device and processor that trained it (``ranks/rank0.json``; records made before it kept
    them have none)."""
    logs = sorted((run_dir / "logs").glob("train.rank0*.log"))
    if not logs:
        raise FileNotFoundError(f"{run_dir}/logs/train.rank0.log: missing")
    rank0 = run_dir / "ranks" / "rank0.json"
    where = json.loads(rank0.read_text()) if rank0.is_file() else {}
    out = {**training_summary(logs[-1]), **plateau_summary(run_dir),
           **{k: where[k] for k in ("device", "cpu") if where.get(k)}}
    if (continued := run_dir / CONTINUED_FROM).is_file():  # its first epochs: another run's
        out["continued_from"] = {k: v for k, v in json.loads(continued.read_text()).items()
                                 if k in ("run", "epochs")}
    return out


def _evaluations(run_dir: Path, result: dict[str, Any], keys: tuple[str, ...]
                 ) -> dict[str, Any]:
    """``eval`` (``keys`` of ``eval.json``, and the checkpoints it averaged) and one
    ``eval_TAG`` per tagged evaluation (e.g. ``eval.best.json``)."""
    out = {"eval": {k: result.get(k) for k in keys}}
    if result.get("averaged"):
        out["eval"]["averaged"] = result["averaged"]
    for extra in sorted(run_dir.glob("eval.*.json")):
        with open(extra, encoding="utf-8") as f:
            tagged = json.load(f)
        out[f"eval_{tagged['tag']}"] = {"checkpoint": Path(tagged["checkpoint"]).name,
                                        **{k: tagged.get(k) for k in keys}}
    return out


def _row_norms(ckpt: Path, required: bool) -> list[float] | None:
    """The output matrix's row norms in the evaluated checkpoint; None (recorded as null) when
    it is not on this machine and the caller accepted that (``--without-row-norms``)."""
    if not ckpt.is_file():
        if not required:
            return None
        raise FileNotFoundError(
            f"{ckpt}: the evaluated checkpoint is not here, and the record needs its output row "
            "norms; export on the machine that holds the checkpoints, or pass "
            "--without-row-norms to record them as null (no norm histogram for that run)")
    _, row_norms = norms.row_norms(ckpt)
    return [round(float(x), 4) for x in row_norms]


def build_record(run_dir: Path, row_norms: bool = True) -> Record:
    """The record of one evaluated run with its hypotheses (none for a language model);
    ``row_norms=False`` accepts a run whose checkpoints were left on another machine."""
    meta = read_run_json(run_dir)
    with open(run_dir / EVAL_JSON, encoding="utf-8") as f:
        result = json.load(f)
    lm = result.get("task") == LM_TASK
    ckpt = Path(result["checkpoint"])
    data = {k: meta.get(k) for k in (LM_RUN_KEYS if lm else RUN_KEYS)}
    data["checkpoint"] = ckpt.name
    data["train"] = train_facts(run_dir)
    data.update(_evaluations(run_dir, result, LM_EVAL_KEYS if lm else EVAL_KEYS))
    if lm:
        return Record(data, run_dir=run_dir)
    data["output_row_norms"] = _row_norms(ckpt, required=row_norms)
    hyps = (run_dir / result["hypotheses"]).read_text(encoding="utf-8").splitlines()
    return Record(data, hyps, run_dir)


def export(runs_root: str | os.PathLike, records_dir: str | os.PathLike,
           row_norms: bool = True) -> list[str]:
    """Write a record for every evaluated run under ``runs_root`` not yet in ``records_dir``
    (written atomically, hypotheses first); return the names written."""
    records = Path(records_dir)
    records.mkdir(parents=True, exist_ok=True)
    written = []
    for ev in sorted(Path(runs_root).glob(f"*/{EVAL_JSON}")):
        run_dir = ev.parent
        if (records / f"{run_dir.name}.json").exists():
            continue
        record = build_record(run_dir, row_norms)
        if record.hypotheses is not None:
            data = ("\n".join(record.hypotheses) + "\n").encode("utf-8")
            atomic_write(records / f"{run_dir.name}.hyp.gz",
                         lambda tmp, data=data: Path(tmp).write_bytes(gzip.compress(data, mtime=0)))
        write_json(records / f"{run_dir.name}.json", record.data, indent=1)
        written.append(run_dir.name)
    return written


def load(records_dir: str | os.PathLike, allow_empty: bool = False) -> list[Record]:
    """Every record of a study with its hypotheses (a language model has none)."""
    out = []
    for path in sorted(Path(records_dir).glob("*.json")):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("task") == LM_TASK:
            out.append(Record(data))
            continue
        hyp = path.with_suffix(".hyp.gz")
        if not hyp.is_file():
            raise FileNotFoundError(f"{hyp}: missing (each record has its hypotheses beside it)")
        out.append(Record(data, gzip.decompress(hyp.read_bytes()).decode("utf-8").splitlines()))
    if not out and not allow_empty:
        raise FileNotFoundError(f"{records_dir}: no study records (*.json)")
    return out


EVAL_REQUIRED = ("run", "bleu", "tok_bleu", "chrf", "src", "tgt", "subset", "hypotheses",
                 "references", "references_sha256")


def from_eval_json(path: Path) -> Record:
    """A run's ``eval.json`` as a record, not exported: the run's identity (``run.json``
    overriding what the evaluation read from the checkpoint), ``eval`` and the hypotheses."""
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    missing = [k for k in EVAL_REQUIRED if k not in result]
    if missing or not isinstance(result.get("run"), dict):
        raise ValueError(f"{path} lacks {missing or ['run']}: it was not written by "
                         "`evaluate`; run `python -m fairseq_tying.evaluation evaluate` again")
    run = dict(result["run"])
    run.update({k: v for k, v in read_run_json(path.parent).items() if k in run})
    data = {k: run.get(k) for k in IDENTITY}
    return Record({**data, "eval": result}, read_lines(path.parent / result["hypotheses"]),
                  path.parent)


def load_evaluated(root: str | os.PathLike) -> list[Record]:
    """The records of every ``eval.json`` under ``root``, named by their folder (relative to
    ``root`` when two folders share a name)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"RUNS_ROOT {root} is not a directory")
    paths = sorted(root.rglob(EVAL_JSON))
    if not paths:
        raise FileNotFoundError(f"no {EVAL_JSON} under {root}; run `evaluate` on the runs first")
    records = [from_eval_json(p) for p in tqdm(paths, desc=f"reading {EVAL_JSON}", unit="run")]
    names = [r.name for r in records]
    if len(set(names)) != len(names):  # same folder name in two places: use relative paths
        for r in records:
            r.data["name"] = str(r.run_dir.relative_to(root))
    return records
