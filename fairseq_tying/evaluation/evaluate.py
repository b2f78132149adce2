"""``evaluate RUN_DIR``: generate, detokenize, score, write ``eval.json`` and hypotheses."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairseq_tying.common import checkpoints
from fairseq_tying.common.atomic import read_lines, write_lines, write_text
from fairseq_tying.common.eval_options import resolve_preset
from fairseq_tying.evaluation import average, metrics
from fairseq_tying.evaluation.generate import generate
from fairseq_tying.evaluation.result import Evaluated, TranslationResult
from fairseq_tying.evaluation.run import RunFacts

PREP_KEYS = ("src", "tgt", "post_process")


@dataclass
class DataDir:
    root: Path
    prep: dict[str, Any]

    @property
    def src(self) -> str:
        return self.prep["src"]

    @property
    def tgt(self) -> str:
        return self.prep["tgt"]

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def reference(self, subset: str) -> Path:
        return self.root / "raw" / f"{subset}.{self.tgt}"


def load_data_dir(path: str | os.PathLike) -> DataDir:
    root = Path(path).resolve()
    prep_path = root / "prep.json"
    if not prep_path.is_file():
        raise FileNotFoundError(
            f"--data {path}: no prep.json there; pass a data dir made by the data preparation step"
        )
    with open(prep_path, encoding="utf-8") as f:
        prep = json.load(f)
    missing = [k for k in PREP_KEYS if k not in prep]
    if missing:
        raise ValueError(f"{prep_path} lacks keys {missing}")
    if not (root / "bin").is_dir():
        raise FileNotFoundError(f"--data {path}: no bin/ folder (fairseq-preprocess output)")
    return DataDir(root, prep)


def eval_json_name(subset: str, tag: str | None = None) -> str:
    """``eval.json`` for the test set, ``eval-SUBSET.json`` otherwise; ``.TAG`` before
    ``.json`` for a tagged evaluation (e.g. ``eval.best.json``)."""
    stem = "eval" if subset == "test" else f"eval-{subset}"
    return f"{stem}.{tag}.json" if tag else f"{stem}.json"


def existing_run_dir(run_dir: str | os.PathLike) -> Path:
    path = Path(run_dir).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"RUN_DIR {path} is not a directory")
    return path


def checkpoint_dir(run_dir: Path) -> Path:
    """``RUN_DIR/checkpoints`` (the launcher's layout) if it exists, else RUN_DIR itself."""
    sub = run_dir / "checkpoints"
    return sub if sub.is_dir() else run_dir


def pick_checkpoint(run_dir: Path, checkpoint: str | None, average_last: int | None) -> tuple[
    Path, list[str]
]:
    """The checkpoint to evaluate, averaging the last N first when asked."""
    run_dir = checkpoint_dir(run_dir)
    if average_last:
        if checkpoint:
            raise ValueError("give either --checkpoint or --average-last, not both")
        inputs = average.last_checkpoints(run_dir, average_last)
        out = run_dir / f"checkpoint.avg{average_last}.pt"
        average.average_checkpoints(inputs, out)
        return out, [p.name for p in inputs]
    if checkpoint:
        path = Path(checkpoint)
        path = path if path.is_absolute() or path.exists() else run_dir / checkpoint
        if not path.is_file():
            raise FileNotFoundError(f"--checkpoint {checkpoint}: not found (also not in {run_dir})")
        return path, []
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        if (run_dir / name).is_file():
            return run_dir / name, []
    raise FileNotFoundError(
        f"{run_dir} has no checkpoint_best.pt or checkpoint_last.pt; pass --checkpoint"
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def decoding(config: checkpoints.CheckpointConfig, preset: str, beam: int | None,
             lenpen: float | None) -> tuple[str, int, float]:
    """(preset name, beam, lenpen): the preset for the checkpoint's arch unless given;
    ``custom`` when ``beam``/``lenpen`` override it."""
    chosen = resolve_preset(preset, config.arch)
    beam = beam if beam is not None else chosen.beam
    lenpen = lenpen if lenpen is not None else chosen.lenpen
    name = chosen.name if (beam, lenpen) == (chosen.beam, chosen.lenpen) else "custom"
    return name, beam, lenpen


def translate(data_dir: DataDir, ckpt: Path, subset: str, beam: int, lenpen: float,
              expected: int, **generate_opts: Any) -> tuple[list[str], str, list[str]]:
    """Detokenized hypotheses of ``subset`` (in corpus order), fairseq-generate's output and
    its command."""
    hyps, raw, cmd = generate(
        dict(bin_dir=data_dir.bin, checkpoint=ckpt, src=data_dir.src, tgt=data_dir.tgt,
             subset=subset, beam=beam, lenpen=lenpen, post_process=data_dir.prep["post_process"],
             **generate_opts),
        expected=expected,
    )
    if data_dir.prep.get("detokenizer") == "moses":
        hyps = metrics.moses_detokenize(hyps, data_dir.tgt)
    return hyps, raw, cmd


def write_outputs(run_dir: Path, stem: str, tgt: str, hyps: list[str], raw: str) -> str:
    """``generate-STEM.txt`` and ``STEM.hyp.TGT``; returns the latter's name."""
    hyp_name = f"{stem}.hyp.{tgt}"
    write_text(run_dir / f"generate-{stem}.txt", raw)
    write_lines(run_dir / hyp_name, hyps)
    return hyp_name


def evaluate_run(
    run_dir: str | os.PathLike,
    data: str | os.PathLike | None,
    *,
    subset: str = "test",
    checkpoint: str | None = None,
    average_last: int | None = None,
    preset: str = "auto",
    beam: int | None = None,
    lenpen: float | None = None,
    batch_size: int | None = 64,
    max_tokens: int | None = None,
    cpu: bool = False,
    user_dir: str | None = None,
    tag: str | None = None,
) -> TranslationResult:
    """Translate ``subset`` with the run's checkpoint, score it, write ``eval[-SUBSET][.TAG].json``
    and the hypotheses into the run folder; returns what the JSON holds."""
    facts = RunFacts.read(existing_run_dir(run_dir))
    run_dir = facts.run_dir
    data_dir = load_data_dir(facts.data(data))
    ref_path = data_dir.reference(subset)
    if not ref_path.is_file():
        raise FileNotFoundError(f"reference {ref_path} missing (--data/--subset)")
    refs = read_lines(ref_path)

    ckpt, averaged = pick_checkpoint(run_dir, checkpoint, average_last)
    facts = facts.with_checkpoint(checkpoints.CheckpointConfig.of(checkpoints.load(ckpt)))
    preset_name, beam, lenpen = decoding(facts.config, preset, beam, lenpen)
    hyps, raw, cmd = translate(data_dir, ckpt, subset, beam, lenpen, len(refs),
                               batch_size=batch_size, max_tokens=max_tokens, cpu=cpu,
                               user_dir=user_dir)
    scores = metrics.score(hyps, refs, data_dir.src, data_dir.tgt)
    hyp_name = write_outputs(run_dir, f"{subset}.{tag}" if tag else subset, data_dir.tgt, hyps,
                             raw)
    result = TranslationResult(
        run=facts.identity, run_dir=str(run_dir), checkpoint=str(ckpt), averaged=averaged,
        data=str(data_dir.root), corpus=data_dir.prep.get("corpus"), src=data_dir.src,
        tgt=data_dir.tgt, subset=subset, tag=tag, preset=preset_name, beam=beam, lenpen=lenpen,
        hypotheses=hyp_name, references=str(ref_path), references_sha256=sha256(ref_path),
        generate_command=cmd, **scores.as_dict())
    result.save(run_dir / eval_json_name(subset, tag))
    return result


def run_lines(result: Evaluated) -> list[str]:
    """The summary's first lines: the run and its checkpoint (or the checkpoints averaged)."""
    averaged = result.averaged
    return [f"run          {result.run_dir}",
            f"checkpoint   {result.checkpoint}"
            + (f"  (average of {', '.join(averaged)})" if averaged else "")]


def summary_lines(result: TranslationResult) -> list[str]:
    return [
        *run_lines(result),
        f"preset       {result.preset} (beam {result.beam}, lenpen {result.lenpen})",
        f"BLEU         {result.bleu:.2f}  {result.bleu_signature}",
        f"tok. BLEU    {result.tok_bleu:.2f}  {result.tok_bleu_signature}",
        f"chrF         {result.chrf:.2f}  {result.chrf_signature}",
        f"sentences    {result.n_sentences}",
    ]
