"""``evaluate-lm RUN_DIR``: the perplexity of a language model on a held-out subset, from the
real ``fairseq-eval-lm``, written to ``RUN_DIR/eval[-SUBSET][.TAG].json``.

The blocks are read as the model was trained (the checkpoint's ``--tokens-per-sample`` and
``--sample-break-mode``; fairseq-eval-lm's own default of 1,024 tokens would skip every block
longer than the model's positions). The checkpoint is chosen as for translation: the best one,
a named one, or the average of the last N epoch checkpoints (``--average-last N``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from fairseq_tying.common import PLUGIN_DIR, checkpoints
from fairseq_tying.common.atomic import write_text
from fairseq_tying.common.reproducible import pinned_env
from fairseq_tying.evaluation.evaluate import (
    eval_json_name,
    existing_run_dir,
    pick_checkpoint,
    run_lines,
)
from fairseq_tying.evaluation.generate import fairseq_exe
from fairseq_tying.evaluation.result import PerplexityResult
from fairseq_tying.evaluation.run import RunFacts

_LOSS = re.compile(r"Loss \(base 2\): ([0-9.]+|inf|nan), Perplexity: ([0-9.]+|inf|nan)")
_TOKENS = re.compile(r"Evaluated ([\d,]+) tokens in")


def parse_eval_lm(output: str, run: str) -> dict[str, Any]:
    """``{"loss", "perplexity", "n_tokens"}`` from fairseq-eval-lm's log (its last result)."""
    losses, tokens = _LOSS.findall(output), _TOKENS.findall(output)
    if not losses or not tokens:
        raise RuntimeError(f"{run}: fairseq-eval-lm printed no 'Evaluated N tokens' and "
                           "'Loss (base 2): …, Perplexity: …' lines; see its output above")
    n_tokens = int(tokens[-1].replace(",", ""))
    if n_tokens == 0:
        raise RuntimeError(f"{run}: fairseq-eval-lm evaluated 0 tokens (its loss of 0 means "
                           "nothing); are the subset's blocks longer than the model's positions "
                           "(--tokens-per-sample), or is the subset empty?")
    loss, ppl = losses[-1]
    return {"loss": float(loss), "perplexity": float(ppl), "n_tokens": n_tokens}


def blocks_as_trained(config: checkpoints.CheckpointConfig) -> dict[str, Any]:
    """The training task's block settings: ``tokens_per_sample``, ``sample_break_mode``."""
    if config.tokens_per_sample is None:
        raise ValueError("the checkpoint names no --tokens-per-sample (not a language model of "
                         "fairseq's language_modeling task?)")
    return {"tokens_per_sample": config.tokens_per_sample,
            "sample_break_mode": config.sample_break_mode or "none"}


def eval_lm_command(bin_dir: Path, ckpt: Path, subset: str, blocks: dict[str, Any],
                    max_tokens: int, cpu: bool, user_dir: str | None) -> list[str]:
    cmd = [fairseq_exe("fairseq-eval-lm"), str(bin_dir), "--user-dir", user_dir or PLUGIN_DIR,
           "--path", str(ckpt), "--gen-subset", subset,
           "--tokens-per-sample", str(blocks["tokens_per_sample"]),
           "--sample-break-mode", blocks["sample_break_mode"],
           "--max-tokens", str(max_tokens), "--required-batch-size-multiple", "1"]
    return cmd + (["--cpu"] if cpu else [])


def run_eval_lm(cmd: list[str], run: str) -> tuple[dict[str, Any], str]:
    """Run fairseq-eval-lm; its parsed result and its whole output."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=pinned_env(), capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.stderr.write(output[-4000:])
        raise RuntimeError(f"{run}: fairseq-eval-lm failed with exit code {proc.returncode}")
    return parse_eval_lm(output, run), output


def data_bin(data: str | os.PathLike) -> Path:
    root = Path(data).resolve()
    folder = root / "bin" if (root / "bin").is_dir() else root
    if not (folder / "dict.txt").is_file():
        raise FileNotFoundError(f"--data {data}: no dict.txt in {folder} (expected a data dir "
                                "made by `prepare --lm`, or its bin/ folder)")
    return folder


def evaluate_lm_run(run_dir: str | os.PathLike, data: str | os.PathLike | None, *,
                    subset: str = "test", checkpoint: str | None = None,
                    average_last: int | None = None, max_tokens: int = 4096, cpu: bool = False,
                    user_dir: str | None = None, tag: str | None = None) -> PerplexityResult:
    """Score ``subset`` with the run's checkpoint; write and return ``eval[-SUBSET][.TAG].json``
    (loss in base 2 per token, perplexity = 2^loss, the token count and the checkpoint(s))."""
    facts = RunFacts.read(existing_run_dir(run_dir))
    run_dir = facts.run_dir
    bin_dir = data_bin(facts.data(data))
    ckpt, averaged = pick_checkpoint(run_dir, checkpoint, average_last)
    facts = facts.with_checkpoint(checkpoints.CheckpointConfig.of(checkpoints.load(ckpt)))
    blocks = blocks_as_trained(facts.config)
    cmd = eval_lm_command(bin_dir, ckpt, subset, blocks, max_tokens, cpu, user_dir)
    scores, output = run_eval_lm(cmd, run_dir.name)
    stem = eval_json_name(subset, tag).removesuffix(".json")
    write_text(run_dir / f"{stem}.log", output)  # fairseq-eval-lm's whole output
    result = PerplexityResult(run=facts.identity, run_dir=str(run_dir), checkpoint=str(ckpt),
                              averaged=averaged, data=str(bin_dir), subset=subset, tag=tag,
                              **blocks, **scores, eval_lm_command=cmd)
    result.save(run_dir / eval_json_name(subset, tag))
    return result


def summary_lines(result: PerplexityResult) -> list[str]:
    return [
        *run_lines(result),
        f"subset       {result.subset} ({result.n_tokens:,} tokens, blocks of "
        f"{result.tokens_per_sample})",
        f"loss         {result.loss:.4f} (base 2)",
        f"perplexity   {result.perplexity:.2f}",
    ]
