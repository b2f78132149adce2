"""The one record of a run, typed: what a study commits and what every view reads.

A record is a JSON file (``NAME.json``, hypotheses in ``NAME.hyp.gz`` beside it), written and
read here only (:meth:`Record.save`, :meth:`Record.load`). Its layout, schema 1 (a file without
``schema`` is schema 1)::

    {"schema": 1, "name", "method", "dataset", "arch", "tying", "output_layer", "seed",
     "train_args", ["task"]: a language model's, ["tag"]: a tagged grid block's, "checkpoint",
     "train": Training, "eval": Evaluation, "eval_TAG": Evaluation ..., "output_row_norms"}

``eval`` is the test set's evaluation (BLEU, chrF and their signatures for a translation model,
loss and perplexity for a language model), ``eval_TAG`` a tagged one (``eval_best``: the best
checkpoint's), ``output_row_norms`` the evaluated checkpoint's output matrix (a translation
model's; null where its checkpoint was not at hand). A field that is None is left out, except
those a record of that kind always writes (``KEEP``). A new field is one line in its class;
the evaluations' parts are ``evaluation/result.py``'s types less what a record leaves out
(``NOT_RECORDED``), so a new evaluation field is one line there.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field, fields, make_dataclass, replace
from pathlib import Path
from typing import Any

from fairseq_tying.common import LM_TASK
from fairseq_tying.common.atomic import atomic_write, write_json
from fairseq_tying.common.run_spec import Identity
from fairseq_tying.common.typed import checked
from fairseq_tying.evaluation.result import PerplexityResult, TranslationResult

SCHEMA = 1  # the layout above; a record without "schema" is schema 1


def _parts(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` checked against ``cls``'s fields: none unknown, none required missing."""
    return checked(cls, data, where, unknown=f"a record of a newer fairseq_tying than this one "
                   f"(schema {SCHEMA})? Update fairseq_tying")


def _plain(obj: Any, keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A part as JSON: its fields in order, None left out but for ``keep``."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)
            if getattr(obj, f.name) is not None or f.name in keep}


@dataclass(frozen=True)
class Stop:
    """When and why the stopping rule ended training (``train.done``'s ``stop``)."""

    epoch: int
    reason: str  # "plateau", "cap" or "budget"
    update: int


@dataclass(frozen=True)
class Training:
    """What training says of the run: fairseq's log, the stopping rule's files and the machine
    (``records.train_facts``)."""

    params: int
    params_trained: int
    valid: dict[str, float]  # fairseq's last validation: loss, nll_loss, num_updates, ...
    valid_history: list[list[float]]  # [updates, validation NLL] of every validation
    train_seconds: float | None = None
    stop: Stop | None = None  # under a stopping rule
    valid_metric: str | None = None  # the metric it watched ...
    valid_epochs: list[list[float]] | None = None  # ... as [epoch, update, value] per epoch
    device: str | None = None  # "cpu" or the GPU's name
    cpu: str | None = None  # the processor model and torch's kernels (reproducible.cpu_name)
    torch: str | None = None  # torch's version
    date: str | None = None  # the day training ended (ISO 8601, UTC)
    continued_from: dict[str, Any] | None = None  # the run its first epochs are from

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> Training:
        data = _parts(cls, data, where)
        stop = data.get("stop")
        return cls(**{**data, "stop": None if stop is None else
                      Stop(**_parts(Stop, stop, f"{where}.stop"))})

    def to_dict(self) -> dict[str, Any]:
        out = _plain(self)
        if self.stop is not None:
            out["stop"] = _plain(self.stop)
        return out

    @property
    def valid_nll(self) -> float:
        """The last validation's NLL (a language model's cross entropy logs it as ``loss``)."""
        return self.valid.get("nll_loss", self.valid["loss"])

    def valid_at(self, epoch: int) -> float | None:
        """The watched metric after ``epoch`` (None where it was not validated then)."""
        return next((v for e, _update, v in self.valid_epochs or () if e == epoch), None)


# What a record leaves out of an evaluation (evaluation/result.py): which run it was (the
# record's own identity), where it ran, and what only that folder holds (its hypotheses'
# file, the commands, sacrebleu's verbose tokenized score and its splitting option).
NOT_RECORDED = frozenset({"run", "run_dir", "data", "tag", "task", "hypotheses",
                          "generate_command", "eval_lm_command", "tok_bleu_verbose",
                          "compound_split"})
# the record's key order of the fields it has always kept (schema 1); a field new in
# result.py follows them, recorded without an edit here
TRANSLATION_LAYOUT = ("checkpoint", "bleu", "bleu_signature", "bleu_verbose", "chrf",
                      "chrf_signature", "tok_bleu", "tok_bleu_signature", "preset", "beam",
                      "lenpen", "subset", "n_sentences", "references_sha256", "averaged",
                      "corpus", "src", "tgt", "references")
PERPLEXITY_LAYOUT = ("checkpoint", "loss", "perplexity", "n_tokens", "subset",
                     "tokens_per_sample", "sample_break_mode", "averaged")


def recorded(result: type, name: str, layout: tuple[str, ...], doc: str) -> type:
    """The part of the evaluation type ``result`` that a record keeps: its fields but
    ``NOT_RECORDED``, each optional (a tagged evaluation, an older record, lack some), in the
    order ``layout`` then ``result``'s."""
    kept = [f for f in fields(result) if f.name not in NOT_RECORDED]
    if missing := set(layout) - {f.name for f in kept}:
        raise TypeError(f"{result.__name__} has no field(s) {sorted(missing)} of the record")
    kept.sort(key=lambda f: layout.index(f.name) if f.name in layout else len(layout))
    cls = make_dataclass(name, [(f.name, f"{f.type} | None", field(default=None))
                                for f in kept], frozen=True)
    cls.__module__, cls.__doc__ = __name__, doc
    return cls


Translation = recorded(TranslationResult, "Translation", TRANSLATION_LAYOUT,
                       "A translation model's evaluation (``evaluate``'s ``eval.json``).")
Perplexity = recorded(PerplexityResult, "Perplexity", PERPLEXITY_LAYOUT,
                      "A language model's evaluation (``evaluate-lm``'s ``eval.json``).")
Evaluation = Translation | Perplexity


KEEP = frozenset({"dataset", "arch", "tying", "output_layer", "seed", "train_args"})
LM_KEEP = KEEP | {"task", "tag"}


@dataclass(frozen=True, eq=False)
class Record:
    """One run: its identity, training, evaluations and output row norms; its hypotheses (none
    for a language model) and, for a run read from its folder, that folder."""

    run: Identity
    eval: Evaluation | None = None
    checkpoint: str | None = None  # the evaluated checkpoint's file name
    train: Training | None = None
    tagged: dict[str, Evaluation] = field(default_factory=dict)  # eval_TAG by TAG
    output_row_norms: list[float] | None = None
    hypotheses: list[str] | None = field(default=None, repr=False)
    run_dir: Path | None = None
    # significance.sentence_stats's cache: per-sentence statistics by metric
    stats_cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def is_lm(self) -> bool:
        return self.run.task == LM_TASK

    @property
    def eval_best(self) -> Evaluation | None:
        """The best checkpoint's evaluation (``eval_best``), if it had one."""
        return self.tagged.get("best")

    def renamed(self, name: str) -> Record:
        return replace(self, run=replace(self.run, name=name), stats_cache={})

    def value(self, path: tuple[str, ...], optional: bool = False) -> Any:
        """The value at ``path`` (fields, then keys: ``("train", "valid", "nll_loss")``); None
        where an ``optional`` one is missing."""
        value: Any = self
        for i, key in enumerate(path):
            value = value.get(key) if isinstance(value, dict) else getattr(value, key, None)
            if value is None:
                if optional:
                    return None
                raise KeyError(f"{self.name}: no {'.'.join(path[:i + 1])} in its record")
        return value

    # --- the JSON file ------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "record") -> Record:
        schema = data.get("schema", SCHEMA)
        if schema != SCHEMA:
            raise ValueError(f"{where}: schema {schema}, this fairseq_tying reads schema "
                             f"{SCHEMA}; use the fairseq_tying that wrote it")
        kinds = {"eval", "train", "checkpoint", "output_row_norms", "schema"}
        tagged = {k: v for k, v in data.items() if k.startswith("eval_")}
        run = {k: v for k, v in data.items() if k not in kinds and k not in tagged}
        identity = Identity(**_parts(Identity, run, where))
        kind = Perplexity if identity.task == LM_TASK else Translation

        def evaluation(part: dict[str, Any] | None, key: str) -> Evaluation | None:
            return None if part is None else kind(**_parts(kind, part, f"{where}.{key}"))

        train = data.get("train")
        return cls(identity, evaluation(data.get("eval"), "eval"), data.get("checkpoint"),
                   None if train is None else Training.from_dict(train, f"{where}.train"),
                   {k.removeprefix("eval_"): evaluation(v, k) for k, v in tagged.items()},
                   data.get("output_row_norms"))

    def to_dict(self) -> dict[str, Any]:
        """The record as its JSON file holds it (schema ``SCHEMA``)."""
        out = {"schema": SCHEMA, **_plain(self.run, LM_KEEP if self.is_lm else KEEP),
               "checkpoint": self.checkpoint}
        if self.train is not None:
            out["train"] = self.train.to_dict()
        if self.eval is not None:
            out["eval"] = _plain(self.eval)
        out.update({f"eval_{tag}": _plain(ev) for tag, ev in self.tagged.items()})
        if not self.is_lm:
            out["output_row_norms"] = self.output_row_norms
        return out

    @classmethod
    def load(cls, path: str | os.PathLike, hypotheses: bool = True) -> Record:
        """``NAME.json`` and, for a translation model, the hypotheses ``NAME.hyp.gz`` (not
        read without ``hypotheses``)."""
        path = Path(path)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); restore it from git") from e
        record = cls.from_dict(data, str(path))
        if record.is_lm or not hypotheses:
            return record
        hyp = path.with_suffix(".hyp.gz")
        if not hyp.is_file():
            raise FileNotFoundError(f"{hyp}: missing (each record has its hypotheses beside it)")
        text = gzip.decompress(hyp.read_bytes()).decode("utf-8")
        return replace(record, hypotheses=text.removesuffix("\n").split("\n") if text else [])

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``NAME.json`` (and the hypotheses first), each atomically."""
        path = Path(path)
        if self.hypotheses is not None:
            data = ("\n".join(self.hypotheses) + "\n").encode("utf-8")
            atomic_write(path.with_suffix(".hyp.gz"),
                         lambda tmp: Path(tmp).write_bytes(gzip.compress(data, mtime=0)))
        return write_json(path, self.to_dict(), indent=1)
