"""Inference speed and agreement: fairseq-generate against CTranslate2 (float32 and int8).

``python -m fairseq_tying.bench --mode serve --checkpoint CKPT`` in one run, on one test set,
with the same beam, length penalty, batch size and threads:

1. fairseq-generate's generation loop, run in this process (the checkpoint loaded as
   fairseq-generate loads it, the subset batched by length with ``--batch-size`` sentences,
   ``task.inference_step`` with fairseq's SequenceGenerator), timed around generation only;
2. the checkpoint exported with ``python -m fairseq_tying.export --format ctranslate2``, decoded
   with CTranslate2 at ``float32`` and at ``int8`` (weights quantized when loaded, as
   ``--quantization int8`` saves them), timed around ``translate_batch`` only.

Sources are the token sequences fairseq read from the binarized subset, so both decoders see
the same input; tokens/s counts the hypothesis tokens plus ``</s>``, as fairseq does. Reports the
share of sentences with identical hypotheses, BLEU (sacrebleu, detokenized, against the raw
references when ``--refs`` or the prepared data's ``raw/test.<tgt>`` is there) and the ratios.

A language model is scored instead, as ``fairseq-eval-lm`` scores it (the subset in blocks of
the checkpoint's ``--tokens-per-sample``, no extra context): fairseq's forward pass against
CTranslate2's ``Generator.score_batch`` on the same blocks, ``--batch-size`` blocks at a time;
it reports the perplexity each computes and the tokens scored per second.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch
from fairseq import checkpoint_utils, utils
from fairseq.data import data_utils

from fairseq_tying import translate
from fairseq_tying.common import LM_TASK, atomic, blocks, checkpoints
from fairseq_tying.common.extras import require
from fairseq_tying.common.reproducible import cpu_name
from fairseq_tying.export.ct2 import ExportError, Subword, export_ct2, find_subword

ctranslate2 = require("ctranslate2", extra="serve",
                      for_what="python -m fairseq_tying.bench --mode serve")

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
MODEL_KEYS = ("arch", "tying", "output_layer", "tied_projection", "output_bias")


def run_fairseq(opts: argparse.Namespace) -> dict:
    """fairseq-generate's generation loop in this process (load the ensemble, batch the subset,
    ``task.inference_step`` with the task's SequenceGenerator), timed around generation only."""
    torch.set_num_threads(opts.threads)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(opts.checkpoint)], arg_overrides={"data": str(opts.data)})
    for model in models:
        model.eval()
    task.load_dataset(opts.subset)
    generator = task.build_generator(models, argparse.Namespace(
        beam=opts.beam, lenpen=opts.lenpen, max_len_a=0, max_len_b=opts.max_len_b))
    batches = task.get_batch_iterator(
        dataset=task.dataset(opts.subset), max_sentences=opts.batch_size,
        max_positions=(1024, 1024), required_batch_size_multiple=1,
    ).next_epoch_itr(shuffle=False)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    strip = {tgt_dict.eos(), tgt_dict.bos()}
    clock, seconds = CLOCKS[opts.clock], 0.0
    sources, hyps, tokens = {}, {}, 0
    with torch.no_grad():
        for sample in batches:
            start = clock()
            out = task.inference_step(generator, models, sample)
            seconds += clock() - start
            for k, sid in enumerate(sample["id"].tolist()):
                src = utils.strip_pad(sample["net_input"]["src_tokens"][k], src_dict.pad())
                sources[sid] = src_dict.string(src).split()
                hyps[sid] = tgt_dict.string(out[k][0]["tokens"],
                                            extra_symbols_to_ignore=strip).split()
                tokens += len(out[k][0]["tokens"])  # with </s>, as fairseq-generate counts
    return {"sources": sources, "hypotheses": hyps, "seconds": seconds,
            "sentences": len(hyps), "tokens": tokens}


def run_ct2(model: Path, sources: list[list[str]], opts: argparse.Namespace,
            compute_type: str) -> dict:
    """CTranslate2's best hypotheses and the time spent in ``translate_batch``."""
    translator = ctranslate2.Translator(str(model), device="cpu", compute_type=compute_type,
                                        intra_threads=opts.threads, inter_threads=1)
    options = translate.ct2_options(opts.beam, opts.lenpen, max_len_b=opts.max_len_b)
    translator.translate_batch(sources[:opts.batch_size], max_batch_size=opts.batch_size,
                               **options)  # warm-up: first-call allocations
    clock = CLOCKS[opts.clock]
    start = clock()
    results = translator.translate_batch(sources, max_batch_size=opts.batch_size, **options)
    seconds = clock() - start
    hyps = [r.hypotheses[0] for r in results]
    return {"hypotheses": hyps, "seconds": seconds, "sentences": len(hyps),
            "tokens": sum(len(h) + 1 for h in hyps)}  # + </s>, as fairseq counts


def bleu(hyps: list[list[str]], refs: list[str] | None, decode) -> float | None:
    if refs is None:
        return None

    return sacrebleu.corpus_bleu([decode(h) for h in hyps], [refs]).score


def _references(opts: argparse.Namespace, ids: list[int], tgt: str) -> list[str] | None:
    path = opts.refs or opts.data.parent / "raw" / f"{opts.subset}.{tgt}"
    if not path.is_file():
        return None
    lines = atomic.read_lines(path)
    return [lines[i] for i in ids]


def score_fairseq(opts: argparse.Namespace) -> dict:
    """fairseq-eval-lm's sum of log-probabilities over the subset's blocks (context window 0),
    timed around the forward passes only; also the blocks as token rows for CTranslate2."""
    torch.set_num_threads(opts.threads)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(opts.checkpoint)], arg_overrides={"data": str(opts.data)})
    model = models[0].eval()
    task.load_dataset(opts.subset)
    batches = task.get_batch_iterator(
        dataset=task.dataset(opts.subset), max_sentences=opts.batch_size,
        required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    pad, symbols = task.dictionary.pad(), task.dictionary.symbols
    clock, seconds, total, rows = CLOCKS[opts.clock], 0.0, 0.0, []
    with torch.no_grad():
        for sample in batches:
            source, target = sample["net_input"]["src_tokens"], sample["target"]
            start = clock()
            lprobs = model.get_normalized_probs(model(source), log_probs=True)
            scores = lprobs.double().gather(-1, target.unsqueeze(-1)).squeeze(-1)
            total += float(scores.masked_fill(target.eq(pad), 0).sum())
            seconds += clock() - start
            rows += [_row(src, tgt, pad, symbols) for src, tgt in zip(source, target, strict=True)]
    return {"log_prob": total, "rows": rows, "seconds": seconds}


def _row(source, target, pad: int, symbols: list[str]) -> list[str]:
    """One block as CTranslate2 scores it: the first input token, then the targets."""
    src, tgt = source[source.ne(pad)].tolist(), target[target.ne(pad)].tolist()
    if src[1:] != tgt[:-1]:
        raise ExportError("the LM task's targets are not its inputs shifted by one token "
                          "(--output-dictionary-size, --self-target or --past-target?): "
                          "CTranslate2 scores the next token only")
    return [symbols[i] for i in (src[0], *tgt)]


def score_ct2(model: Path, rows: list[list[str]], opts: argparse.Namespace,
              compute_type: str) -> dict:
    """CTranslate2's sum of log-probabilities of the same blocks, timed around scoring."""
    generator = ctranslate2.Generator(str(model), device="cpu", compute_type=compute_type,
                                      intra_threads=opts.threads, inter_threads=1)
    generator.score_batch(rows[:opts.batch_size])  # warm-up: first-call allocations
    clock = CLOCKS[opts.clock]
    start = clock()
    results = generator.score_batch(rows, max_batch_size=opts.batch_size)
    seconds = clock() - start
    return {"log_prob": float(sum(sum(r.log_probs) for r in results)), "seconds": seconds}


def measure_lm(opts: argparse.Namespace, model: Path, meta: dict) -> dict:
    fs = score_fairseq(opts)
    tokens = sum(len(row) - 1 for row in fs["rows"])
    rows = {"fairseq": {"log_prob": fs["log_prob"], "seconds": fs["seconds"]}}
    for compute_type in ("float32", "int8"):
        rows[f"ct2_{compute_type}"] = score_ct2(model, fs["rows"], opts, compute_type)
    for row in rows.values():
        row["tokens"] = tokens
        row["perplexity"] = math.exp(-row["log_prob"] / tokens)
        row["tokens_per_s"] = tokens / row["seconds"]
        row["speedup"] = rows["fairseq"]["seconds"] / row["seconds"]
    return {"model": {k: meta[k] for k in MODEL_KEYS}, "task": LM_TASK,
            "blocks": len(fs["rows"]), "tokens": tokens, "results": rows}


def measure(opts: argparse.Namespace, workdir: Path) -> dict:
    try:
        subword = find_subword(opts.data)
    except ExportError:  # pre-tokenized data: BLEU on the tokens
        subword = Subword("none")
    model = workdir / "ct2"
    meta = export_ct2(opts.checkpoint, model, opts.data, "none", subword)
    if meta["task"] == LM_TASK:
        return measure_lm(opts, model, meta)
    _, decode = translate.text_processors(model, meta)
    fs = run_fairseq(opts)
    ids = sorted(fs["sources"])
    sources = [fs["sources"][i] for i in ids]
    fs_hyps = [fs["hypotheses"][i] for i in ids]
    # a checkpoint trained without --target-lang names none: fairseq reads the pair off the files
    tgt = meta["target_lang"] or data_utils.infer_language_pair(str(opts.data))[1]
    refs = _references(opts, ids, tgt)
    rows = {"fairseq": {**{k: fs[k] for k in ("seconds", "sentences", "tokens")},
                        "bleu": bleu(fs_hyps, refs, decode), "same_as_fairseq": 1.0}}
    for compute_type in ("float32", "int8"):
        ct = run_ct2(model, sources, opts, compute_type)
        pairs = list(zip(ids, ct["hypotheses"], fs_hyps, strict=True))
        differ = [(i, a, b) for i, a, b in pairs if a != b]
        cap = opts.max_len_b  # tokens before fairseq's forced </s>: a hypothesis cut by the bound
        rows[f"ct2_{compute_type}"] = {
            **{k: ct[k] for k in ("seconds", "sentences", "tokens")},
            "bleu": bleu(ct["hypotheses"], refs, decode),
            "same_as_fairseq": 1 - len(differ) / len(ids), "same_count": len(ids) - len(differ),
            "differ_at_length_bound": sum(max(len(a), len(b)) >= cap for _, a, b in differ),
            "differing": [{"id": i, "ct2_tokens": len(a), "fairseq_tokens": len(b)}
                          for i, a, b in differ[:20]]}
    for row in rows.values():
        row["sentences_per_s"] = row["sentences"] / row["seconds"]
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        row["speedup_sentences"] = row["sentences_per_s"] / (
            rows["fairseq"]["sentences"] / rows["fairseq"]["seconds"])
    return {"model": {k: meta[k] for k in MODEL_KEYS}, "task": "translation",
            "sentences": len(ids), "results": rows}


def table(report: dict) -> str:
    if report["task"] == LM_TASK:
        lines = ["| scorer | tokens/s | speed-up | perplexity |", "|---|---:|---:|---:|"]
        lines += [f"| {name} | {row['tokens_per_s']:.0f} | {row['speedup']:.2f}× | "
                  f"{row['perplexity']:.2f} |" for name, row in report["results"].items()]
        return "\n".join(lines)
    lines = ["| decoder | sentences/s | tokens/s | speed-up | same hypotheses | BLEU |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, row in report["results"].items():
        bleu_text = "–" if row["bleu"] is None else f"{row['bleu']:.2f}"
        lines.append(f"| {name} | {row['sentences_per_s']:.1f} | {row['tokens_per_s']:.0f} | "
                     f"{row['speedup_sentences']:.2f}× | {100 * row['same_as_fairseq']:.2f} % | "
                     f"{bleu_text} |")
    return "\n".join(lines)


def summary_table(reports: list[dict]) -> str:
    """One table of several translation reports (``--summarize``): a row per model and decoder,
    with the share of hypotheses equal to fairseq's and the BLEU difference."""
    lines = ["| model (tying, output layer) | decoder | sentences/s | speed-up "
             "| same hypotheses as fairseq | BLEU | Δ BLEU |", "|---|---|---:|---:|---:|---:|---:|"]
    for report in reports:
        if report["task"] == LM_TASK:
            raise ValueError("--summarize: language-model reports have their own table "
                             "(python -m fairseq_tying.bench --mode serve --checkpoint LM)")
        model = f"{report['model']['tying']}, {report['model']['output_layer']}"
        base = report["results"]["fairseq"]["bleu"]
        for name, row in report["results"].items():
            same = ("–" if name == "fairseq" else
                    f"{row['same_count']:,}/{row['sentences']:,} "
                    f"({100 * row['same_as_fairseq']:.2f} %)")
            delta = "–" if name == "fairseq" else f"{round(row['bleu'] - base, 2) + 0.0:+.2f}"
            lines.append(f"| {model} | {DECODERS[name]} | {row['sentences_per_s']:.1f} | "
                         f"{row['speedup_sentences']:.2f}× | {same} | {row['bleu']:.2f} | "
                         f"{delta} |")
    return "\n".join(lines) + "\n"


DECODERS = {"fairseq": "fairseq", "ct2_float32": "CTranslate2 float32",
            "ct2_int8": "CTranslate2 int8"}


def summarize(paths: list[Path], into: Path | None) -> str:
    """The table of the reports at ``paths``, printed, and written into ``into``'s ``serving``
    block."""
    reports = [json.loads(p.read_text()) for p in paths]
    cpus = sorted({r["machine"].get("cpu", "not recorded") for r in reports})
    text = summary_table(reports)
    text += ("\nFrom " + ", ".join(f"[{p.name}]({p.parent.name}/{p.name})" for p in paths)
             + f"; processor: {'; '.join(cpus)}.\n")
    print(text)
    if into is not None:
        blocks.replace_block(into, "serving", text)
        print(f"wrote the serving block of {into}")
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.bench --mode serve",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path,
                   help="a transformer_{dwt,twwt}* or transformer_lm_tied* checkpoint")
    p.add_argument("--data", type=Path, help="fairseq-preprocess folder (default: the one the "
                   "model was trained on)")
    p.add_argument("--subset", default="test")
    p.add_argument("--refs", type=Path, help="raw references (default: DATA/../raw/SUBSET.TGT)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64,
                   help="sentences (a language model: blocks) per batch, both sides")
    p.add_argument("--threads", type=int, default=1, help="CPU threads, both decoders")
    p.add_argument("--clock", choices=CLOCKS, default="wall",
                   help="wall time, or this process's CPU time (steadier on a shared machine "
                        "with --threads 1) (default: wall)")
    p.add_argument("--out", type=Path, help="write the report (JSON) here")
    p.add_argument("--summarize", type=Path, nargs="+", metavar="JSON",
                   help="no decoding: one table of these --out reports (translation models)")
    p.add_argument("--into", type=Path,
                   help="with --summarize: write the table into this file's <!-- serving:begin "
                        "--> block (docs/serving.md)")
    opts = p.parse_args(argv)
    if opts.summarize:
        missing = [str(x) for x in opts.summarize if not x.is_file()]
        if missing:
            p.error(f"--summarize: no such report: {', '.join(missing)}")
        if opts.into is not None and not opts.into.is_file():
            p.error(f"--into {opts.into}: no such file")
        return opts
    if opts.into is not None:
        p.error("--into goes with --summarize")
    if opts.checkpoint is None:
        p.error("--checkpoint is required (or --summarize JSON... to tabulate reports)")
    if not opts.checkpoint.is_file():
        p.error(f"--checkpoint {opts.checkpoint} does not exist")
    if opts.data is None:
        data = checkpoints.CheckpointConfig.of(checkpoints.load(opts.checkpoint)).data
        if data is None:
            p.error(f"--checkpoint {opts.checkpoint} names no data folder: pass --data")
        opts.data = Path(data)
    return opts


def run(opts: argparse.Namespace) -> dict:
    """The mode with parsed options (``python -m fairseq_tying.bench --mode ...``)."""
    if opts.summarize:
        return {"table": summarize(opts.summarize, opts.into)}
    with tempfile.TemporaryDirectory(prefix="serve-bench.") as tmp:
        report = measure(opts, Path(tmp))
    report["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(opts).items()}
    report["machine"] = {"cpu": cpu_name(), "platform": platform.platform(),
                         "cpu_count": os.cpu_count(),
                         "load_avg": os.getloadavg()}
    print(table(report))
    if opts.out is not None:
        atomic.write_json(opts.out, report)
        print(f"wrote {opts.out}")
    return report


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args(argv))
