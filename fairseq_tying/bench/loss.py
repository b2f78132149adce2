"""Training memory and time of the loss: fairseq's against ``--chunked-loss``.

``python -m fairseq_tying.bench --mode loss --out docs/performance_loss.json --report
docs/performance.md --readme README.md`` trains, for each setup (``--setups``: CPU fp32, and
CUDA fp16 and bf16 when torch sees a GPU), batch of target tokens (``--tokens``: 4k and 16k)
and vocabulary size V (``--vocab``: 8k to 250k), one step of

- ``builtin``: fairseq's ``transformer --share-all-embeddings`` and its own
  ``label_smoothed_cross_entropy`` (ε = 0.1), which holds the N×V scores, their fp32
  log-softmax and both gradients;
- ``chunked_old``: ``transformer_twwt --output-layer dot`` and ``label_smoothed_cross_entropy_pr``
  with the loss as torch's ``F.linear_cross_entropy`` computes it in its own chunks (torch 2.13's
  default options: rows such that a chunk's scores are about the size of the input), the
  smoothing term from the mean row (``torch_op_loss``);
- ``chunked``: the same model with ``--chunked-loss`` (``core/criterions/chunked.py``; chunks of
  ``--chunked-loss-mb``).

The models are one encoder and one decoder layer of width D = 512 (FFN 2048): depth adds the
same memory and time to all three, and the loss is what differs. A step is fairseq-train's:
the criterion, backward, fairseq's Adam (its FP16Optimizer for fp16 and bf16). It is run in two
parts, so that the loss is measured on its own: the model's features h, then the criterion
from h (``loss``: the scores, the loss and their backward to h and W), then the backward of
the rest. Each configuration runs in a fresh process, after one warm-up step on a small batch.

Memory, CPU: the kernel's resident-set high-water mark (VmHWM in /proc/self/status, reset
before each window by writing 5 to /proc/self/clear_refs), over the resident memory at the
window's start. glibc is told to hand every freed block of 64 KiB or more back to the kernel
(``MALLOC_MMAP_THRESHOLD_``), so resident memory is memory in use: no freed buffer is reused
unseen. tracemalloc sees Python's allocations only, not torch's buffers, and a sampled
``mallinfo2`` can miss a short peak; the high-water mark cannot. CUDA: torch's peak allocated.

Time: CPU, the process's CPU time (``--threads`` torch threads, default 1, so that a busy
machine slows the wall clock more than the work); CUDA, the wall time; the fastest of
``--steps`` steps. A CPU configuration predicted (linearly in V from the largest V measured at
the same batch) to need more than 80 % of the available memory is skipped, and so is one that
runs out of CUDA memory.

With ``--peers`` (``--only-peers``: nothing else) it also times, on the CPU, the loss and its
backward alone, from h and W to their gradients, for ``dot`` without smoothing (ε = 0: what the
peers compute), h ~ N(0, 1) and W ~ N(0, 1/D) of width D = 512, every 10th target padding:

- ``cross_entropy``: ``F.cross_entropy(F.linear(h, W), y, reduction="sum")``, the N×V scores
  whole (fairseq's loss without smoothing);
- ``cce``: Apple's Cut Cross-Entropy (``cut-cross-entropy``, the ``dev`` extra),
  ``linear_cross_entropy(h, W, y, impl="torch_compile")``: the scores and cross-entropy in one
  ``torch.compile``'d graph (its ``cce`` implementation is Triton's, for GPUs);
- ``chunked``: ``linear_label_smoothed_nll_loss`` (``--chunked-loss-mb``, the criterion's by
  default).

Each in a fresh process, after one warm-up on 64 rows (CCE's compilation); CPU time and the
resident-set high-water mark over the memory at the start (the inputs allocated), the fastest
and the highest of ``--steps`` (default 3). Results: ``peers`` in the JSON, its table in the
``loss_peers`` block of ``--report``.

Then, per setup, the largest ``--max-tokens`` whose step fits ``--budget-gb`` of peak memory at
``--budget-vocab`` (64k), built-in against chunked: the peak is linear in the number of target
tokens, fitted to steps of 1k and 2k tokens and the ``--tokens`` measured. Results: the JSON
file (``--out``, written after each setup) and its tables beside it (same name, ``.md``),
printed too; ``--report`` and ``--readme`` write them into those files' marked blocks, and
``--report-only JSON...`` writes the blocks from committed reports without measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from fairseq import optim, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks.translation import TranslationTask
from tqdm import tqdm

from fairseq_tying.bench.loss_budget import FIT_TOKENS, available_memory, max_tokens, predicted_peak
from fairseq_tying.bench.loss_peers import measure_peers, peer_worker
from fairseq_tying.bench.loss_report import (
    MODELS,
    PEER_BLOCK,
    PEERS,
    SUMMARY_BLOCK,
    TABLE_BLOCK,
    peer_tables,
    publish,
    tables,
)
from fairseq_tying.bench.memory import Window
from fairseq_tying.common import PLUGIN_DIR, atomic
from fairseq_tying.common.reproducible import cpu_name

SETUPS = ("cpu:fp32", "cuda:fp16", "cuda:bf16")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DIMS = {"layers": 1, "dim": 512, "ffn": 2048, "heads": 8}
SENT_LEN = 32  # source and target tokens of each sentence in the batch
MMAP_THRESHOLD = 64 * 1024


def model_flags(name: str, dtype: str = "fp32", chunked_loss_mb: float | None = None
                ) -> list[str]:
    dims = [f"--{side}-{key}" for side in ("encoder", "decoder")
            for key in ("layers", "embed-dim", "ffn-embed-dim", "attention-heads")]
    values = [str(DIMS[k]) for k in ("layers", "dim", "ffn", "heads")] * 2
    flags = [x for pair in zip(dims, values, strict=True) for x in pair]
    flags += ["--dropout", "0.1", "--label-smoothing", "0.1", "--optimizer", "adam",
              "--lr", "1e-5", "--max-source-positions", "256", "--max-target-positions", "256",
              *([f"--{dtype}"] if dtype != "fp32" else [])]
    if name == "builtin":
        return ["--arch", "transformer", "--share-all-embeddings",
                "--criterion", "label_smoothed_cross_entropy", *flags]
    mb = ["--chunked-loss-mb", str(chunked_loss_mb)] if chunked_loss_mb else []
    return ["--arch", "transformer_twwt", "--output-layer", "dot",
            "--criterion", "label_smoothed_cross_entropy_pr", "--projection-reg", "0", *flags,
            "--chunked-loss", *mb]


# ----------------------------------------------------------------------------- one config


def build(spec: dict):
    """(task, model, criterion, fairseq optimizer) of one configuration."""
    d = Dictionary()
    for i in range(spec["vocab"] - len(d)):
        d.add_symbol(f"t{i}")
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused", "--user-dir", PLUGIN_DIR,
        *model_flags(spec["model"], spec["dtype"], spec.get("chunked_loss_mb"))])
    task = TranslationTask(args, d, d)
    torch.manual_seed(1)
    model, criterion = task.build_model(args), task.build_criterion(args)
    device = torch.device(spec["device"])
    model, criterion = model.to(device), criterion.to(device)
    if spec["dtype"] != "fp32":
        model = model.to(DTYPES[spec["dtype"]])
    params = [p for p in model.parameters() if p.requires_grad]
    cfg = convert_namespace_to_omegaconf(args)
    if spec["dtype"] != "fp32":
        optimizer = optim.FP16Optimizer.build_optimizer(cfg, params)
    else:
        optimizer = optim.build_optimizer(cfg.optimizer, params)
    return task, model, criterion, optimizer


def batch(d, sentences: int, device: torch.device, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)

    def tokens() -> torch.Tensor:
        t = torch.randint(d.nspecial, len(d), (sentences, SENT_LEN), generator=g)
        t[:, -1] = d.eos()
        return t.to(device)

    src, target = tokens(), tokens()
    prev = torch.cat([torch.full_like(target[:, :1], d.eos()), target[:, :-1]], dim=1)
    return {"id": torch.arange(sentences), "nsentences": sentences,
            "ntokens": sentences * SENT_LEN, "target": target,
            "net_input": {"src_tokens": src, "src_lengths": torch.full_like(src[:, 0], SENT_LEN),
                          "prev_output_tokens": prev}}


def torch_op_loss(hidden: torch.Tensor, w_out: torch.Tensor, bias: torch.Tensor | None,
                  target: torch.Tensor, epsilon: float, ignore_index: int) -> torch.Tensor:
    """fairseq's label-smoothed loss with its nll from torch's ``F.linear_cross_entropy`` in
    torch's default chunks and the smoothing term −Σ_j log p_j = V·(nll + s_y − s̄) from the mean
    row (s̄ = h·w̄ + b̄); half inputs summed per token in fp32."""
    half = hidden.dtype != torch.float32
    nll = F.linear_cross_entropy(hidden, w_out, target, linear_bias=bias,
                                 ignore_index=ignore_index,
                                 options=torch.nn.LinearCrossEntropyOptions(),
                                 reduction="none" if half else "sum").float()
    h = hidden.float()
    gap = (h * w_out[target].float()).sum(-1) - h @ w_out.mean(0, dtype=torch.float32)
    if bias is not None:
        gap = gap + bias[target].float() - bias.mean(dtype=torch.float32)
    gap = gap.masked_fill(target.eq(ignore_index), 0.0).sum()
    nll = nll.sum()
    eps_i = epsilon / (w_out.shape[0] - 1)
    return (1.0 - epsilon - eps_i) * nll + eps_i * w_out.shape[0] * (nll + gap)


def loss_part(name: str, model, criterion, features: torch.Tensor, sample: dict
              ) -> torch.Tensor:
    """The criterion from the decoder's features: fairseq's own formula on the output layer's
    scores, torch's op, or the chunked loss."""
    if name == "chunked":
        return criterion.loss_from_features(model, features, sample)[0]
    if name == "chunked_old":
        hidden = features.reshape(-1, features.shape[-1])
        return torch_op_loss(hidden, *model.decoder.scorer.output_matrix_and_bias(),
                             sample["target"].reshape(-1), criterion.eps, criterion.padding_idx)
    return criterion.compute_loss(model, (model.decoder.output_layer(features), None), sample)[0]


def step(name: str, model, criterion, optimizer, sample: dict, device: torch.device) -> dict:
    """One training step; its peak memory, the loss's own peak, its times and its loss."""
    model.train()
    cpu, wall = time.process_time(), time.perf_counter()
    with Window(device) as whole:
        features, _ = model(**sample["net_input"], features_only=True)
        h = features.detach().requires_grad_()
        before_loss = whole.now()
        with Window(device) as loss_window:
            loss = loss_part(name, model, criterion, h, sample)
            optimizer.backward(loss)
        features.backward(h.grad)
        optimizer.multiply_grads(1.0 / sample["ntokens"])
        optimizer.step()
        optimizer.zero_grad()
    if device.type == "cuda":
        torch.cuda.synchronize()
    # the loss window reset the high-water mark: the forward's peak is the memory it kept
    peak = max(whole.peak, before_loss)
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
            "loss": loss.item(), "loss_extra": loss_window.extra,
            "step_extra": peak - whole.start, "peak": peak,
            "forward_extra": before_loss - whole.start}


def worker(spec: dict) -> dict:
    """Warm-up on a small batch, then ``steps`` steps of ``tokens`` target tokens."""
    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    task, model, criterion, optimizer = build(spec)
    name = spec["model"]
    step(name, model, criterion, optimizer, batch(task.target_dictionary, 4, device), device)
    sample = batch(task.target_dictionary, spec["tokens"] // SENT_LEN, device)
    runs = [step(name, model, criterion, optimizer, sample, device)
            for _ in range(spec["steps"])]
    fastest = min(runs, key=lambda r: r["cpu_s"] if device.type == "cpu" else r["wall_s"])
    return {**fastest, "loss": runs[0]["loss"],  # the loss of the same weights in every config
            "loss_extra": max(r["loss_extra"] for r in runs),
            "step_extra": max(r["step_extra"] for r in runs),
            "peak": max(r["peak"] for r in runs)}


def measure(spec: dict, keep_error: bool = False) -> dict:
    """``worker(spec)`` (``peer_worker`` for a peer's) in a fresh process (glibc handing freed
    blocks back, see the top); a configuration that runs out of CUDA memory is reported as
    skipped, and with ``keep_error`` a failure as its error's last line."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
           "OMP_NUM_THREADS": str(spec["threads"])}
    proc = subprocess.run([sys.executable, "-m", "fairseq_tying.bench", "--mode", "loss",
                           "--worker", json.dumps(spec)], capture_output=True, text=True, env=env)
    if proc.returncode != 0 and "OutOfMemoryError" in proc.stderr:
        return {"skipped": "out of CUDA memory"}
    if proc.returncode != 0 and keep_error:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1][:1000] if lines else f"exit status {proc.returncode}"}
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['model']} at V={spec['vocab']}, {spec['tokens']} tokens "
                           f"({spec['device']} {spec['dtype']}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------- driver


def measure_setup(opts, setup: str, report: dict, write, bar) -> None:
    """Every batch, V and model of one setup ("cpu:fp32", ...) into ``report``."""
    device, dtype = setup.split(":")
    steps = opts.steps or (3 if device == "cuda" else 1)
    entry = report["setups"][setup] = {"device": device, "dtype": dtype, "steps": steps,
                                       "results": {}}
    if device == "cuda":
        entry["gpu"] = torch.cuda.get_device_name()

    def run(model: str, vocab: int, tokens: int) -> dict:
        return measure({"model": model, "vocab": vocab, "tokens": tokens, "steps": steps,
                        "device": device, "dtype": dtype, "threads": opts.threads,
                        "chunked_loss_mb": opts.chunked_loss_mb})

    for tokens in opts.tokens:
        by_vocab = entry["results"][str(tokens)] = {}
        for vocab in sorted(opts.vocab):
            res = by_vocab[str(vocab)] = {}
            for model in MODELS:
                need, free = predicted_peak(by_vocab, model, vocab), available_memory()
                if model == "chunked_old" and not hasattr(F, "linear_cross_entropy"):
                    res[model] = {"skipped": f"torch {torch.__version__} has no "
                                             "F.linear_cross_entropy"}
                elif device == "cpu" and need and free and need > 0.8 * free:
                    res[model] = {"skipped": f"predicted peak {need / 2**30:.1f} GiB, "
                                             f"{free / 2**30:.1f} GiB available"}
                else:
                    res[model] = run(model, vocab, tokens)
                bar.update()
            write()
    if not opts.no_max_tokens:
        entry["max_tokens"] = max_tokens(entry["results"], lambda *a: (run(*a), bar.update())[0],
                                         opts.budget_gb, opts.budget_vocab, opts.tokens)
    write()


# ------------------------------------------------------------------------------------ CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.bench --mode loss",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["loss"], default="loss", help=argparse.SUPPRESS)
    p.add_argument("--setups", nargs="+", choices=SETUPS, default=None,
                   help="device:dtype to measure (default: cpu:fp32, and cuda:fp16 cuda:bf16 "
                        "when torch sees a CUDA device)")
    p.add_argument("--vocab", type=int, nargs="+",
                   default=[8000, 32000, 64000, 128000, 250000],
                   help="vocabulary sizes V (default: 8k 32k 64k 128k 250k)")
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384],
                   help="target tokens per batch (default: 4096 16384)")
    p.add_argument("--chunked-loss-mb", type=float, default=None,
                   help="chunked: --chunked-loss-mb (default: the criterion's)")
    p.add_argument("--steps", type=int, default=None,
                   help="measured steps per configuration (default: 1 on CPU, 3 on CUDA)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--budget-gb", type=float, default=4.0,
                   help="peak memory (GiB) for the largest-batch comparison (4)")
    p.add_argument("--budget-vocab", type=int, default=64000,
                   help="V of the largest-batch comparison (64000; must be in --vocab)")
    p.add_argument("--no-max-tokens", action="store_true",
                   help="skip the largest-batch comparison")
    p.add_argument("--peers", action="store_true",
                   help="also time the loss alone of dot without smoothing on the CPU: "
                        "F.linear + cross_entropy, Cut Cross-Entropy (torch_compile), chunked")
    p.add_argument("--only-peers", action="store_true",
                   help="--peers and nothing else (no setups, no largest-batch fit)")
    p.add_argument("--out", type=Path, default=Path("bench_results/loss.json"),
                   help="the JSON file; the tables go beside it (.md)")
    p.add_argument("--report", type=Path,
                   help=f"write the tables into this file's <!-- {TABLE_BLOCK}:begin --> block "
                        f"(the peers' into its {PEER_BLOCK} block)")
    p.add_argument("--readme", type=Path,
                   help=f"write the summary into this file's <!-- {SUMMARY_BLOCK}:begin --> "
                        "block")
    p.add_argument("--report-only", type=Path, nargs="+", metavar="JSON",
                   help="measure nothing: write --report and --readme from these reports")
    p.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.worker:
        return opts
    cuda = torch.cuda.is_available()
    opts.setups = opts.setups or ["cpu:fp32", *(["cuda:fp16", "cuda:bf16"] if cuda else [])]
    if opts.only_peers:
        opts.peers, opts.setups, opts.no_max_tokens = True, [], True
    if any(s.startswith("cuda") for s in opts.setups) and not cuda:
        p.error("--setups cuda:...: no CUDA device is visible to torch")
    if any(t < SENT_LEN or t % SENT_LEN for t in opts.tokens):
        p.error(f"--tokens {opts.tokens}: each a multiple of the sentence length {SENT_LEN}")
    if min(opts.vocab) < 16:
        p.error("--vocab: sizes must be at least 16")
    if opts.chunked_loss_mb is not None and not opts.chunked_loss_mb > 0:
        p.error(f"--chunked-loss-mb {opts.chunked_loss_mb}: give a positive number of MiB")
    if not opts.no_max_tokens and opts.budget_vocab not in opts.vocab:
        p.error(f"--budget-vocab {opts.budget_vocab} is not in --vocab; add it or give "
                "--no-max-tokens")
    if missing := [str(f) for f in opts.report_only or [] if not f.is_file()]:
        p.error(f"--report-only: no such report: {', '.join(missing)}")
    return opts


def run(opts: argparse.Namespace) -> int:  # the mode with parsed options
    if opts.worker:
        spec = json.loads(opts.worker)
        print(json.dumps(peer_worker(spec) if "peer" in spec else worker(spec)))
        return 0
    if opts.report_only:
        reports = [(path, json.loads(path.read_text())) for path in opts.report_only]
        publish(reports, opts.report, opts.readme)
        print(tables(reports, Path.cwd()) + peer_tables(reports, Path.cwd()))
        return 0

    report = {"schema": 2,
              "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(opts).items()
                         if k not in ("worker", "report_only", "report", "readme")},
              "model": {**DIMS, "sent_len": SENT_LEN, "label_smoothing": 0.1},
              "machine": machine(), "setups": {}}

    def write() -> None:
        report["machine"]["load_avg_end"] = os.getloadavg()
        atomic.write_json(opts.out, report, indent=1, ensure_ascii=True)

    runs = len(opts.setups) * (len(opts.tokens) * len(opts.vocab) * len(MODELS)
                               + (0 if opts.no_max_tokens else 2 * len(FIT_TOKENS)))
    runs += len(opts.tokens) * len(opts.vocab) * len(PEERS) if opts.peers else 0
    with tqdm(total=runs, desc="bench loss", unit="run", file=sys.stderr) as bar:
        for setup in opts.setups:
            measure_setup(opts, setup, report, write, bar)
        if opts.peers:
            measure_peers(opts, report, write, bar, measure)
    reports = [(opts.out, report)]
    text = tables(reports, opts.out.parent) + peer_tables(reports, opts.out.parent)
    atomic.write_text(opts.out.with_suffix(".md"), text)
    publish(reports, opts.report, opts.readme)
    print(text)
    print(f"wrote {opts.out} and {opts.out.with_suffix('.md')}")
    return 0


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "load_avg_start": os.getloadavg(), "memory_available": available_memory()}


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))
