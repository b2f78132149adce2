"""An evaluation's JSON (``eval.json``; ``eval-SUBSET.json``, ``eval.TAG.json``), typed: written
by ``evaluate`` and ``evaluate-lm`` (:meth:`Evaluated.save`), read back by every tool
(:func:`read_result`). A key the file lacks that a type requires, or holds that it does not
declare, is refused with the file's name."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fairseq_tying.common import LM_TASK
from fairseq_tying.common.atomic import write_json
from fairseq_tying.common.run_spec import Identity
from fairseq_tying.common.typed import checked


@dataclass(frozen=True, kw_only=True)
class Evaluated:
    """What every evaluation says: which run, which checkpoint, on which data and subset."""

    run: Identity
    subset: str
    run_dir: str | None = None
    checkpoint: str | None = None
    averaged: list[str] | None = None  # the checkpoints averaged into the one evaluated
    data: str | None = None
    tag: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "run": self.run.to_dict()}

    def save(self, path: str | os.PathLike) -> Path:
        return write_json(Path(path), self.to_dict())


@dataclass(frozen=True, kw_only=True)
class TranslationResult(Evaluated):
    """A translation model's test: decoding, references and sacrebleu's scores
    (``metrics.Scores``)."""

    bleu: float
    tok_bleu: float
    chrf: float
    src: str
    tgt: str
    hypotheses: str  # their file, in the run folder
    references: str
    references_sha256: str
    corpus: str | None = None
    preset: str | None = None
    beam: int | None = None
    lenpen: float | None = None
    generate_command: list[str] | None = None
    bleu_signature: str | None = None
    bleu_verbose: str | None = None
    tok_bleu_signature: str | None = None
    tok_bleu_verbose: str | None = None
    compound_split: bool | None = None
    chrf_signature: str | None = None
    n_sentences: int | None = None


@dataclass(frozen=True, kw_only=True)
class PerplexityResult(Evaluated):
    """A language model's test: fairseq-eval-lm's loss (base 2, per token) and perplexity."""

    loss: float
    perplexity: float
    n_tokens: int
    task: str = LM_TASK
    tokens_per_sample: int | None = None
    sample_break_mode: str | None = None
    eval_lm_command: list[str] | None = None


Result = TranslationResult | PerplexityResult


def result_from_dict(data: dict[str, Any], where: str) -> Result:
    kind = PerplexityResult if data.get("task") == LM_TASK else TranslationResult
    checked(kind, data, where, unknown="it was not written by this fairseq_tying's `evaluate` "
            "(`evaluate-lm`): run it again on that run", missing="it was not written by "
            "`evaluate` (`evaluate-lm`); run it again on that run")
    if not isinstance(data["run"], dict):
        raise ValueError(f"{where}: its run must be a JSON object; run `evaluate` again")
    return kind(**{**data, "run": Identity.from_dict(data["run"], f"{where}: run")})


def read_result(path: str | os.PathLike) -> Result:
    """The evaluation in ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); run `evaluate` again") from e
    return result_from_dict(data, str(path))
