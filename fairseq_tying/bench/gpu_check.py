"""GPU acceptance run (``make gpu-check``): real ``--fp16`` training and decoding on one CUDA GPU.

For each output layer (``--output-layer``, every registered one by default):

1. ``fairseq-train`` of ``transformer_twwt_iwslt_de_en`` with ``--fp16`` (fairseq's
   FP16Optimizer: half weights, fp32 master copy, dynamic loss scale) and fairseq's loss from the
   N×V scores (the training flag ``--no-chunked-loss``) on the embedded Bible
   es→en corpus for ``--updates`` updates (300). Checked from fairseq's JSON log:
   no NaN/inf loss; the loss falls (mean of the last three logged values below 90 % of the first
   three); no overflow loop (at most 10 % of the updates skipped for gradient overflow) and a
   stable loss scale (never below 1, halved at most once in the last half of the run: fairseq
   halves it at each overflow and doubles it back only after ``--fp16-scale-window`` updates,
   so one late overflow is normal and a collapse halves it again and again);
2. ``fairseq-generate --fp16`` (beam 5) from the checkpoint: BLEU, and every hypothesis finite;
3. ``fairseq-train`` again with ``--chunked-loss`` (the loss from the decoder's features in
   chunks, log Z in fp32): the same checks, and its first three logged losses within
   ``CHUNKED_TOLERANCE`` (relative) of step 1's, which computes the same loss from the half scores
   (``--no-chunked-loss`` skips it);
4. CTranslate2 float16 decoding on the GPU of the checkpoint exported with
   ``python -m fairseq_tying.export --format ctranslate2``: BLEU and the share of sentences with
   the same hypothesis as step 2 (reported, not checked: fp16 rounding differs between the two;
   a layer the export refuses, as ``fixnorm``, reports the refusal; ``--no-ctranslate2`` skips it
   and says so in the result, for a machine without CTranslate2's CUDA libraries).

The output layers are checked side by side on the one GPU (``--jobs``, default: all of them;
the data is prepared once), since each small run leaves most of the GPU idle: on an H100 all five
trained and decoded with fairseq within 5 minutes, about what their trainings alone take one
after another. ``--jobs 1`` checks them one at a time, for training times of a run alone.

Then ``python -m fairseq_tying.bench --device cuda --fp16`` once (all output layers against
fairseq's own tied Transformer) and ``--mode loss --setups cuda:fp16 cuda:bf16`` (fairseq's loss
against ``--chunked-loss``, memory and time by V and batch). Everything is written under
``--out``: each output layer's result in ``OUT/layers/LAYER.json`` as soon as steps 1 to 3 are
checked, and again with step 4 (a rerun skips the layers that have a complete result, and for a
layer cut off during step 4 only decodes again), and the summary in ``OUT/gpu_check.json``
(``"passed"`` per check and overall). Without a CUDA device it stops before doing anything,
with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import sacrebleu
import torch

from fairseq_tying import translate
from fairseq_tying.common import PLUGIN_DIR, atomic
from fairseq_tying.common.extras import require
from fairseq_tying.core import output_layers
from fairseq_tying.export.ct2 import export_ct2

BIN = Path(sys.executable).parent
HYPOTHESIS = re.compile(r"^D-(\d+)\t(\S+)\t(.*)$", re.M)  # fairseq-generate's detokenized lines
CHUNKED_TOLERANCE = 0.01  # fp16 scores rounded per element vs the chunked loss's fp32 log Z
OVERFLOW = re.compile(r"gradient overflow detected, ignoring gradient, setting loss scale to: "
                      r"([\d.e+-]+)")


class GpuCheckError(RuntimeError):
    """The machine cannot run the check (no CUDA); nothing was run."""


def require_cuda(with_ctranslate2: bool = True) -> str:
    """The GPU's name; refuses clearly when CTranslate2 (unless step 4 is skipped) is not
    installed, or when torch or CTranslate2 sees no CUDA device."""
    # a missing install is named first: it is the same fix on any machine
    ctranslate2 = require("ctranslate2", extra="serve",
                          for_what="python -m fairseq_tying.bench --mode gpu-check (or skip "
                                   "step 4 with --no-ctranslate2)") if with_ctranslate2 else None
    if not torch.cuda.is_available():
        raise GpuCheckError("make gpu-check needs a CUDA GPU, and torch sees none "
                            f"(torch {torch.__version__}, torch.cuda.is_available() is False): "
                            "run it on a machine with one, with a CUDA build of torch "
                            "(make setup TORCH_VERSION=<version> with that build in .venv)")
    if ctranslate2 is not None and ctranslate2.get_cuda_device_count() < 1:
        raise GpuCheckError("torch sees a CUDA GPU but CTranslate2 does not: install a "
                            "CTranslate2 wheel built for your CUDA version (pip install "
                            "ctranslate2) and CUDA 12's cuBLAS, or skip step 4 with "
                            "--no-ctranslate2")
    return torch.cuda.get_device_name()


def train_log_checks(log: str, updates: int) -> dict:
    """Checks on a ``--log-format json`` fairseq-train log (stdout + stderr)."""
    records = [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})\s*$", log, re.M)]
    losses = [float(r["loss"]) for r in records]
    scales = [float(r["loss_scale"]) for r in records if "loss_scale" in r]
    overflow_scales = [float(s) for s in OVERFLOW.findall(log)]
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    head, tail = losses[:3], losses[-3:]
    falling = finite and len(losses) >= 6 and sum(tail) / 3 < 0.9 * sum(head) / 3
    late = scales[len(scales) // 2:]
    late_halvings = math.log2(late[0] / min(late)) if late and min(late) > 0 else math.inf
    scale_stable = bool(scales) and min(scales + overflow_scales) >= 1.0 and late_halvings <= 1
    no_loop = len(overflow_scales) <= 0.1 * updates
    seconds = re.search(r"done training in ([\d.]+) seconds", log)
    return {"seconds": float(seconds.group(1)) if seconds else None,
            "logged_losses": losses, "loss_scales": scales, "overflows": len(overflow_scales),
            "late_halvings": late_halvings,
            "finite": finite, "loss_falling": falling, "no_overflow_loop": no_loop,
            "loss_scale_stable": scale_stable,
            "passed": finite and falling and no_loop and scale_stable}


def run_logged(cmd: list[str], log: Path) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = proc.stdout + proc.stderr
    atomic.write_text(log, " ".join(cmd) + "\n\n" + text)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}); see {log}")
    return text


def prepare_data(out: Path) -> Path:
    data = out / "data"
    run_logged([sys.executable, "-m", "fairseq_tying.data.prepare", "--corpus", "bible",
                "--src", "es", "--tgt", "en", "--subword", "sentencepiece", "--vocab-size", "4000",
                "--out", str(data)], out / "logs" / "prepare.log")
    return data


def train(data: Path, output_layer: str, run_dir: Path, opts: argparse.Namespace,
          extra: tuple[str, ...] = ()) -> dict:
    cmd = [str(BIN / "fairseq-train"), str(data / "bin"), "--user-dir", PLUGIN_DIR,
           "--arch", "transformer_twwt_iwslt_de_en", "--output-layer", output_layer, "--fp16",
           "--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1",
           "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
           "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--clip-norm", "1.0",
           "--max-tokens", str(opts.max_tokens), "--max-update", str(opts.updates),
           "--save-dir", str(run_dir / "checkpoints"), "--no-epoch-checkpoints",
           "--log-format", "json", "--log-interval", "10", "--seed", "1",
           "--num-workers", "0", *extra]
    log = run_logged(cmd, run_dir / "train.log")
    return train_log_checks(log, opts.updates)


def chunked_train(data: Path, output_layer: str, run_dir: Path, opts: argparse.Namespace,
                  reference: dict) -> dict:
    """Step 3: the same training with ``--chunked-loss``; its first logged losses against
    step 1's."""
    return compare_first_losses(train(data, output_layer, run_dir, opts, ("--chunked-loss",)),
                                reference)


def compare_first_losses(checks: dict, reference: dict) -> dict:
    """``checks`` of a ``--chunked-loss`` training, failed unless its first three logged losses
    are within ``CHUNKED_TOLERANCE`` of the reference training's."""
    pairs = list(zip(checks["logged_losses"][:3], reference["logged_losses"][:3], strict=False))
    gaps = [abs(a - b) / abs(b) for a, b in pairs]
    same = len(gaps) == 3 and max(gaps) <= CHUNKED_TOLERANCE
    return {**checks, "first_losses_rel_gap": max(gaps) if gaps else None,
            "same_first_losses": same, "passed": checks["passed"] and same}


def generate(data: Path, run_dir: Path) -> dict:
    cmd = [str(BIN / "fairseq-generate"), str(data / "bin"), "--user-dir", PLUGIN_DIR,
           "--path", str(run_dir / "checkpoints" / "checkpoint_last.pt"), "--fp16",
           "--beam", "5", "--lenpen", "1", "--batch-size", "128", "--gen-subset", "test",
           "--required-batch-size-multiple", "1", "--post-process", "sentencepiece",
           "--scoring", "sacrebleu"]
    log = run_logged(cmd, run_dir / "generate.log")
    hyps = HYPOTHESIS.findall(log)
    bleu = re.search(r"BLEU = ([\d.]+)", log)
    finite = bool(hyps) and all(math.isfinite(float(score)) for _, score, _ in hyps)
    return {"sentences": len(hyps), "bleu": float(bleu.group(1)) if bleu else None,
            "finite_scores": finite, "passed": finite and bleu is not None}


def generated_hypotheses(run_dir: Path) -> dict[int, str]:
    """fairseq-generate's detokenized hypotheses (``D-`` lines of its log) by sentence id."""
    log = (run_dir / "generate.log").read_text()
    return {int(i): h for i, _score, h in HYPOTHESIS.findall(log)}


def ct2_fp16(data: Path, run_dir: Path, reference: dict[int, str]) -> dict:
    model = run_dir / "ct2-float16"
    export_ct2(run_dir / "checkpoints" / "checkpoint_last.pt", model, data / "bin", "float16")
    sources = atomic.read_lines(data / "raw" / "test.es")
    refs = atomic.read_lines(data / "raw" / "test.en")
    start = time.perf_counter()
    hyps = translate.translate_lines(model, sources, translate.ct2_options(beam=5), 128,
                                     device="cuda", compute_type="float16")
    seconds = time.perf_counter() - start
    same = sum(reference.get(i) == h for i, h in enumerate(hyps))
    return {"bleu": sacrebleu.corpus_bleu(hyps, [refs]).score, "seconds": seconds,
            "sentences_per_s": len(hyps) / seconds, "same_as_fairseq_fp16": same / len(hyps)}


def layer_path(out: Path, output_layer: str) -> Path:
    return out / "layers" / f"{output_layer}.json"


def check_output_layer(data: Path, output_layer: str, out: Path, opts: argparse.Namespace,
                       settings: dict) -> dict:
    """Steps 1 and 2 (the checked ones), kept on disk before step 3 (reported only)."""
    run_dir = out / "runs" / output_layer
    result = {"train": train(data, output_layer, run_dir, opts, ("--no-chunked-loss",))}
    with ThreadPoolExecutor(max_workers=2) as pool:  # step 3 beside step 2: the GPU is idle
        decoded = pool.submit(generate, data, run_dir)
        if opts.chunked_loss:
            result["chunked_loss"] = chunked_train(data, output_layer, out / "runs" /
                                                   f"{output_layer}-chunked", opts,
                                                   result["train"])
        result["generate"] = decoded.result()
    result["passed"] = all(result[k]["passed"] for k in ("train", "generate", "chunked_loss")
                           if k in result)
    atomic.write_json(layer_path(out, output_layer), {"settings": settings, "result": result})
    return result


def checked_layer(data: Path, output_layer: str, opts: argparse.Namespace) -> dict:
    """The layer's result, from ``OUT/layers/LAYER.json`` if an earlier run checked it with the
    same settings (decoding again with CTranslate2 if it was cut off or failed there), else
    checked now."""
    path = layer_path(opts.out, output_layer)
    settings = {"updates": opts.updates, "max_tokens": opts.max_tokens,
                "chunked_loss": opts.chunked_loss}
    kept = json.loads(path.read_text()) if path.is_file() else {"settings": None}
    decoded = kept["settings"] and kept["result"].get("ct2_float16", {"error": "not reached"})
    if kept["settings"] == settings and (not opts.ctranslate2 or not
                                         {"error", "skipped"} & decoded.keys()):
        print(f"[gpu-check] {output_layer}: checked before ({path})", file=sys.stderr)
        return kept["result"]
    if kept["settings"] == settings:
        print(f"[gpu-check] {output_layer}: steps 1-2 checked before, CTranslate2 float16",
              file=sys.stderr)
        result = kept["result"]
    else:
        print(f"[gpu-check] {output_layer}: fp16 training, fairseq-generate, CTranslate2 "
              "float16", file=sys.stderr)
        result = check_output_layer(data, output_layer, opts.out, opts, settings)
    run_dir = opts.out / "runs" / output_layer
    if not opts.ctranslate2:
        result["ct2_float16"] = {"skipped": "--no-ctranslate2"}
        atomic.write_json(path, {"settings": settings, "result": result})
        return result
    try:
        result["ct2_float16"] = ct2_fp16(data, run_dir, generated_hypotheses(run_dir))
    # reported, not checked: steps 1-2's verdict stands (ValueError: the export's refusal)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"[gpu-check] {output_layer}: CTranslate2 float16 failed: {e}", file=sys.stderr)
        result["ct2_float16"] = {"error": str(e)}
    atomic.write_json(path, {"settings": settings, "result": result})
    return result


def checked_layers(data: Path, opts: argparse.Namespace) -> dict[str, dict]:
    """Every output layer's result, ``opts.jobs`` layers at a time (threads: each step is a
    subprocess, or CTranslate2, which releases the GIL)."""
    with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        results = pool.map(lambda layer: checked_layer(data, layer, opts), opts.output_layers)
        return dict(zip(opts.output_layers, results, strict=True))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.bench --mode gpu-check",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("work/gpu_check"))
    p.add_argument(
        "--output-layer",
        nargs="+",
        choices=output_layers.OUTPUT_LAYERS,
        default=list(output_layers.OUTPUT_LAYERS),
        dest="output_layers",
    )
    p.add_argument("--updates", type=int, default=300, help="training updates per output layer")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--jobs", type=int, default=None,
                   help="output layers checked side by side on the GPU (default: all)")
    p.add_argument("--no-chunked-loss", dest="chunked_loss", action="store_false",
                   help="skip step 3, the training with --chunked-loss")
    p.add_argument("--no-ctranslate2", dest="ctranslate2", action="store_false",
                   help="skip step 4, CTranslate2 float16 decoding (recorded as skipped)")
    p.add_argument("--no-bench", action="store_true",
                   help="skip bench --device cuda --fp16 (layers) and --mode loss (CUDA)")
    opts = p.parse_args(argv)
    if opts.jobs is None:
        opts.jobs = len(opts.output_layers)
    if opts.jobs < 1:
        p.error(f"--jobs {opts.jobs}: at least 1 (1 checks the output layers one at a time)")
    if opts.updates < 60:
        p.error(f"--updates {opts.updates}: at least 60 (six logged losses) to judge the trend")
    return opts


def run(opts: argparse.Namespace) -> int:
    """The mode with parsed options (``python -m fairseq_tying.bench --mode ...``)."""
    try:
        gpu = require_cuda(opts.ctranslate2)
    except GpuCheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary: dict = {
        "gpu": gpu,
        "config": {k: str(v) for k, v in vars(opts).items()},
    }
    data = prepare_data(opts.out)
    summary["output_layers"] = checked_layers(data, opts)
    if not opts.no_bench:
        bench_dir = opts.out / "bench"
        run_logged([sys.executable, "-m", "fairseq_tying.bench", "--device", "cuda", "--fp16",
                    "--out", str(bench_dir)], opts.out / "logs" / "bench.log")
        summary["bench"] = str(bench_dir / "bench.json")
        run_logged([sys.executable, "-m", "fairseq_tying.bench", "--mode", "loss", "--setups",
                    "cuda:fp16", "cuda:bf16", "--out", str(bench_dir / "loss.json")],
                   opts.out / "logs" / "loss.log")
        summary["bench_loss"] = str(bench_dir / "loss.json")
    summary["passed"] = all(r["passed"] for r in summary["output_layers"].values())
    atomic.write_json(opts.out / "gpu_check.json", summary)
    print(f"wrote {opts.out / 'gpu_check.json'}: {'PASSED' if summary['passed'] else 'FAILED'}")
    return 0 if summary["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))
