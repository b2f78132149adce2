"""Training memory and time of the loss: fairseq's against ``--chunked-loss``.

``python -m fairseq_tying.bench --mode loss --out docs/performance_loss.json`` trains, for each
vocabulary size V (``--vocab``), one step on a batch of ``--tokens`` target tokens of

- ``builtin``: fairseq's ``transformer --share-all-embeddings`` and its own
  ``label_smoothed_cross_entropy`` (ε = 0.1), which holds the N×V scores, their fp32
  log-softmax and both gradients;
- ``plugin``: ``transformer_twwt --output-layer dot`` and ``label_smoothed_cross_entropy_pr``;
- ``chunked``: the same with ``--chunked-loss``.

The models are one encoder and one decoder layer of width D = 512 (FFN 2048): depth adds the
same memory and time to all three, and the loss is what differs. A step is fairseq-train's:
the criterion, backward, fairseq's Adam (its FP16Optimizer under ``--fp16``). It is run in two
parts, so that the loss is measured on its own: the model's features h, then the criterion
from h (``loss``: the scores, the loss and their backward to h and W), then the backward of
the rest. Each configuration runs in a fresh process, after one warm-up step on a small batch.

Memory, CPU: the kernel's resident-set high-water mark (VmHWM in /proc/self/status, reset
before each window by writing 5 to /proc/self/clear_refs), over the resident memory at the
window's start. glibc is told to hand every freed block of 64 KiB or more back to the kernel
(``MALLOC_MMAP_THRESHOLD_``), so resident memory is memory in use: no freed buffer is reused
unseen. tracemalloc sees Python's allocations only, not torch's buffers, and a sampled
``mallinfo2`` can miss a short peak; the high-water mark cannot. CUDA: torch's peak allocated.

Time: the process's CPU time (``--threads`` torch threads, default 1, so that a busy machine
slows the wall clock more than the work) and the wall time, the fastest of ``--steps`` steps.

Then the largest ``--max-tokens`` whose step fits ``--budget-gb`` of peak resident memory at
``--budget-vocab`` (64k), built-in against chunked: the peak is linear in the number of target
tokens, fitted to steps of 1k, 2k and 4k tokens. Results: a JSON file (``--out``) and a
markdown table beside it (same name, ``.md``), printed too.
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
from fairseq import optim, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks.translation import TranslationTask
from tqdm import tqdm

from fairseq_tying.common import PLUGIN_DIR, atomic

MODELS = ("builtin", "plugin", "chunked")
DIMS = {"layers": 1, "dim": 512, "ffn": 2048, "heads": 8}
SENT_LEN = 32  # source and target tokens of each sentence in the batch
FIT_TOKENS = (1024, 2048)  # with --tokens: the points of the memory-vs-tokens fit
MMAP_THRESHOLD = 64 * 1024
MB = 2**20


def model_flags(name: str) -> list[str]:
    dims = [f"--{side}-{key}" for side in ("encoder", "decoder")
            for key in ("layers", "embed-dim", "ffn-embed-dim", "attention-heads")]
    values = [str(DIMS[k]) for k in ("layers", "dim", "ffn", "heads")] * 2
    flags = [x for pair in zip(dims, values, strict=True) for x in pair]
    flags += ["--dropout", "0.1", "--label-smoothing", "0.1", "--optimizer", "adam",
              "--lr", "1e-5", "--max-source-positions", "256", "--max-target-positions", "256"]
    if name == "builtin":
        return ["--arch", "transformer", "--share-all-embeddings",
                "--criterion", "label_smoothed_cross_entropy", *flags]
    return ["--arch", "transformer_twwt", "--output-layer", "dot",
            "--criterion", "label_smoothed_cross_entropy_pr", "--projection-reg", "0", *flags,
            *(["--chunked-loss"] if name == "chunked" else [])]


# ------------------------------------------------------------------------- memory windows


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}: the CPU memory needs Linux")


class Window:
    """Peak memory over the memory at the start of a ``with`` block (CPU: resident set)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else _status("VmRSS")

    def __enter__(self) -> Window:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := VmRSS
        self.start = self.now()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.peak = torch.cuda.max_memory_allocated() if self.cuda else _status("VmHWM")
        self.extra = self.peak - self.start


# ----------------------------------------------------------------------------- one config


def build(spec: dict):
    """(task, model, criterion, fairseq optimizer) of one configuration."""
    d = Dictionary()
    for i in range(spec["vocab"] - len(d)):
        d.add_symbol(f"t{i}")
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused", "--user-dir", PLUGIN_DIR, *model_flags(spec["model"]),
        *(["--fp16"] if spec["fp16"] else [])])
    task = TranslationTask(args, d, d)
    torch.manual_seed(1)
    model, criterion = task.build_model(args), task.build_criterion(args)
    device = torch.device(spec["device"])
    model, criterion = model.to(device), criterion.to(device)
    if spec["fp16"]:
        model = model.half()
    params = [p for p in model.parameters() if p.requires_grad]
    if spec["fp16"]:
        optimizer = optim.FP16Optimizer.build_optimizer(convert_namespace_to_omegaconf(args),
                                                        params)
    else:
        optimizer = optim.build_optimizer(convert_namespace_to_omegaconf(args).optimizer, params)
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


def loss_part(model, criterion, features: torch.Tensor, sample: dict) -> torch.Tensor:
    """The criterion from the decoder's features: fairseq's own formula on the output layer's
    scores, or the chunked loss."""
    if getattr(criterion, "chunked_loss", False):
        return criterion.loss_from_features(model, features, sample)[0]
    return criterion.compute_loss(model, (model.decoder.output_layer(features), None), sample)[0]


def step(model, criterion, optimizer, sample: dict, device: torch.device) -> dict:
    """One training step; its peak memory, the loss's own peak, its times and its loss."""
    model.train()
    cpu, wall = time.process_time(), time.perf_counter()
    with Window(device) as whole:
        features, _ = model(**sample["net_input"], features_only=True)
        h = features.detach().requires_grad_()
        before_loss = whole.now()
        with Window(device) as loss_window:
            loss = loss_part(model, criterion, h, sample)
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
    step(model, criterion, optimizer, batch(task.target_dictionary, 4, device), device)
    sample = batch(task.target_dictionary, spec["tokens"] // SENT_LEN, device)
    runs = [step(model, criterion, optimizer, sample, device) for _ in range(spec["steps"])]
    fastest = min(runs, key=lambda r: r["cpu_s"] if device.type == "cpu" else r["wall_s"])
    return {**fastest, "loss": runs[0]["loss"],  # the loss of the same weights in every config
            "loss_extra": max(r["loss_extra"] for r in runs),
            "step_extra": max(r["step_extra"] for r in runs),
            "peak": max(r["peak"] for r in runs)}


def measure(spec: dict) -> dict:
    """``worker(spec)`` in a fresh process (glibc handing freed blocks back, see the top)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
           "OMP_NUM_THREADS": str(spec["threads"])}
    proc = subprocess.run([sys.executable, "-m", "fairseq_tying.bench", "--mode", "loss",
                           "--worker", json.dumps(spec)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['model']} at V={spec['vocab']}, {spec['tokens']} tokens "
                           f"failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------- driver


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemAvailable"]
    except (OSError, KeyError):
        return None


def predicted_peak(results: dict, model: str, vocab: int) -> int | None:
    """Peak of ``model`` at ``vocab`` extrapolated linearly in V from the largest measured V."""
    done = [(int(v), r[model]["peak"]) for v, r in results.items() if "peak" in r.get(model, {})]
    if not done:
        return None
    v0, p0 = max(done)
    return int(p0 * vocab / v0)


def fit(points: list[tuple[int, int]]) -> dict:
    """Least-squares line peak = a + b·tokens, and its largest residual."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    a = my - b * mx
    return {"fixed_bytes": a, "bytes_per_token": b, "points": points,
            "max_residual_bytes": max(abs(y - a - b * x) for x, y in points)}


def max_tokens(opts, results: dict, run) -> dict:
    """The largest batch (target tokens) whose step peak fits the budget, per model."""
    budget = int(opts.budget_gb * 2**30)
    out = {"budget_bytes": budget, "vocab": opts.budget_vocab}
    for model in ("builtin", "chunked"):
        points = [(t, run(model, opts.budget_vocab, t)["peak"]) for t in FIT_TOKENS]
        points.append((opts.tokens, results[str(opts.budget_vocab)][model]["peak"]))
        line = fit(points)
        line["max_tokens"] = int((budget - line["fixed_bytes"]) / line["bytes_per_token"])
        out[model] = line
    out["ratio"] = out["chunked"]["max_tokens"] / out["builtin"]["max_tokens"]
    return out


def _cells(res: dict, field: str, names=MODELS, scale: float = MB, fmt: str = "{:.0f}") -> str:
    return " / ".join(fmt.format(res[m][field] / scale) if field in res[m] else "—"
                      for m in names)


def _ratio(res: dict, field: str, fmt: str) -> str:
    if field not in res["builtin"] or field not in res["chunked"]:
        return "—"
    return fmt.format(res["chunked"][field] / res["builtin"][field])


def table(report: dict) -> str:
    """The markdown table of the report."""
    clock = "CPU" if report["config"]["device"] == "cpu" else "wall"
    key = "cpu_s" if clock == "CPU" else "wall_s"
    rows = ["| V | loss extra MB: built-in / plugin / chunked | chunked ÷ built-in "
            "| step extra MB: built-in / plugin / chunked | step peak MB: built-in / chunked "
            f"| step {clock} ms: built-in / plugin / chunked | chunked ÷ built-in time |",
            "|---:|---|---:|---|---|---|---:|"]
    for vocab, res in report["results"].items():
        rows.append(f"| {int(vocab) // 1000}k | {_cells(res, 'loss_extra')} "
                    f"| {_ratio(res, 'loss_extra', '{:.3f}')} | {_cells(res, 'step_extra')} "
                    f"| {_cells(res, 'peak', ('builtin', 'chunked'))} "
                    f"| {_cells(res, key, scale=1e-3, fmt='{:.1f}')} "
                    f"| {_ratio(res, key, '{:.2f}')} |")
    skipped = [f"{m} at V = {int(v) // 1000}k: {r[m]['skipped']}"
               for v, r in report["results"].items() for m in MODELS if "skipped" in r[m]]
    lines = ["\n".join(rows)]
    if skipped:
        lines.append("Not measured: " + "; ".join(skipped) + ".")
    if "max_tokens" in report:
        mt = report["max_tokens"]
        memory = "resident memory" if clock == "CPU" else "CUDA memory allocated"
        lines.append(
            f"Largest batch within {mt['budget_bytes'] / 2**30:g} GiB of peak {memory} "
            f"at V = {mt['vocab'] // 1000}k: built-in {mt['builtin']['max_tokens']:,} target "
            f"tokens, chunked {mt['chunked']['max_tokens']:,} ({mt['ratio']:.1f}×); "
            f"{mt['builtin']['bytes_per_token'] / 1024:.0f} KiB against "
            f"{mt['chunked']['bytes_per_token'] / 1024:.0f} KiB per target token (fitted to "
            f"{', '.join(str(t) for t, _ in mt['chunked']['points'])} tokens).")
    return "\n\n".join(lines) + "\n"


def summary(cpu: dict, cuda: dict | None) -> str:
    """The README's table: the loss's extra memory, built-in → chunked, and the step-time ratio,
    by V, on the CPU (fp32) and on CUDA (fp16) when ``cuda`` is given."""
    head = "| V | CPU fp32: loss extra MB, built-in → chunked | CPU time, chunked ÷ built-in |"
    rule = "|---:|---|---:|"
    if cuda:
        head += " CUDA fp16: loss extra MB | CUDA time ratio |"
        rule += "---|---:|"
    rows = [head, rule]
    for vocab in sorted({*cpu["results"], *(cuda or {}).get("results", {})}, key=int):
        cells = [f"{int(vocab) // 1000}k"]
        for report, key in ((cpu, "cpu_s"), *(((cuda, "wall_s"),) if cuda else ())):
            res = report["results"].get(vocab)
            if res is None or "loss_extra" not in res["chunked"] or "loss_extra" not in res[
                    "builtin"]:
                cells += ["not measured", "—"]
                continue
            cells += [f"{res['builtin']['loss_extra'] / MB:,.0f} → "
                      f"{res['chunked']['loss_extra'] / MB:,.0f}",
                      f"{res['chunked'][key] / res['builtin'][key]:.2f}×"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.bench --mode loss",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["loss"], default="loss", help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, nargs="+",
                   default=[8000, 32000, 64000, 128000, 250000],
                   help="vocabulary sizes V (default: 8k 32k 64k 128k 250k; a configuration "
                        "predicted not to fit in the available memory is skipped)")
    p.add_argument("--tokens", type=int, default=4096, help="target tokens per batch (4096)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--fp16", action="store_true",
                   help="CUDA only: half model and fairseq's FP16Optimizer, as --fp16 trains")
    p.add_argument("--steps", type=int, default=None,
                   help="measured steps per configuration (default: 1 on CPU, 3 on CUDA)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--budget-gb", type=float, default=4.0,
                   help="peak resident memory (GiB) for the largest-batch comparison (4)")
    p.add_argument("--budget-vocab", type=int, default=64000,
                   help="V of the largest-batch comparison (64000; must be in --vocab)")
    p.add_argument("--no-max-tokens", action="store_true",
                   help="skip the largest-batch comparison")
    p.add_argument("--out", type=Path, default=Path("bench_results/loss.json"),
                   help="the JSON file; the markdown table goes beside it (.md)")
    p.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.fp16 and opts.device != "cuda":
        p.error("--fp16 needs --device cuda (fairseq's FP16Optimizer keeps its master copy on "
                "CUDA)")
    if opts.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible to torch")
    if opts.tokens < SENT_LEN or opts.tokens % SENT_LEN:
        p.error(f"--tokens {opts.tokens}: a multiple of the sentence length {SENT_LEN}")
    if min(opts.vocab) < 16:
        p.error("--vocab: sizes must be at least 16")
    if not opts.no_max_tokens and opts.budget_vocab not in opts.vocab:
        p.error(f"--budget-vocab {opts.budget_vocab} is not in --vocab; add it or give "
                "--no-max-tokens")
    opts.steps = opts.steps or (3 if opts.device == "cuda" else 1)
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.worker:
        print(json.dumps(worker(json.loads(opts.worker))))
        return 0

    def run(model: str, vocab: int, tokens: int) -> dict:
        return measure({"model": model, "vocab": vocab, "tokens": tokens, "steps": opts.steps,
                        "device": opts.device, "fp16": opts.fp16, "threads": opts.threads})

    report = {"config": {k: str(v) if isinstance(v, Path) else v
                         for k, v in vars(opts).items() if k != "worker"},
              "model": {**DIMS, "sent_len": SENT_LEN, "label_smoothing": 0.1},
              "machine": machine(opts.device), "results": {}}
    fits = 0 if opts.no_max_tokens else 2 * len(FIT_TOKENS)
    with tqdm(total=len(opts.vocab) * len(MODELS) + fits, desc="bench loss", unit="run",
              file=sys.stderr) as bar:
        for vocab in sorted(opts.vocab):
            res = report["results"][str(vocab)] = {}
            for model in MODELS:
                need, free = predicted_peak(report["results"], model, vocab), available_memory()
                if opts.device == "cpu" and need and free and need > 0.8 * free:
                    res[model] = {"skipped": f"predicted peak {need / 2**30:.1f} GiB, "
                                             f"{free / 2**30:.1f} GiB available"}
                else:
                    res[model] = run(model, vocab, opts.tokens)
                bar.update()
        if not opts.no_max_tokens:
            report["max_tokens"] = max_tokens(opts, report["results"],
                                              lambda *a: (run(*a), bar.update())[0])
    report["machine"]["load_avg_end"] = os.getloadavg()
    atomic.write_json(opts.out, report, indent=1, ensure_ascii=True)
    text = table(report)
    atomic.write_text(opts.out.with_suffix(".md"), text)
    print(text)
    print(f"wrote {opts.out} and {opts.out.with_suffix('.md')}")
    return 0


def machine(device: str) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "load_avg_start": os.getloadavg(), "memory_available": available_memory()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info
