"""The fused chunked loss on one CUDA GPU (``make gpu-fused``): correctness, time and memory.

    python scripts/gpu_fused_loss.py                    # work/gpu_fused/gpu_fused_loss.json
    python scripts/gpu_fused_loss.py --tiny --out X     # CPU, Triton's interpreter, tiny sizes
    python scripts/gpu_fused_loss.py --report-only X --docs docs/performance.md

It needs torch and Triton only. It loads ``core/output_layers.py`` (with ``scoring.py``),
``core/criterions/fused.py`` and ``chunked.py`` from their files, without the package's
``__init__``; the two names chunked.py imports from fairseq (``utils.item``,
``label_smoothed_nll_loss``) are this script's: ``label_smoothed_nll_loss`` below is fairseq's
formula, the built-in reference.

0. Preflight: Triton imported, one tiny launch of the kernel (Triton builds its launcher at run
   time: a C compiler, ``Python.h``, ``libcuda``) checked against fairseq's formula, and the
   probe of the half products with fp32 sums in fp16 and bf16 (``fused.product_path``: which
   implementation computes ∂/∂h and ∂/∂W_out; ``products`` in the JSON). If it fails, the error
   is recorded, every fused measurement is skipped and the built-in's and the eager path's are
   still made.
1. Correctness, fp16 and bf16, every output layer, V = 32k, 2,048 target tokens (every 10th
   padding, every 5th predicting its target), D = 512, ε = 0.1, an output bias b₂: the fused
   path's loss, nll, correct count and the gradients of W, h, b₂ (and fixnorm's g) against
   fairseq's formula in fp64 on the same rounded scores (their gradient the exact one's), with
   the eager chunked path's and the built-in's errors beside them; then one fused step under
   ``torch.cuda.set_sync_debug_mode("error")``: no host synchronisation.
2. The fused step's phases at the largest V and batch (``dot``, 64 MiB): the scores' product,
   the kernel, ∂/∂h = G·W_out and ∂/∂W_out += Gᵀ·h, each summed over the chunks, by CUDA events
   around each (median of the repetitions).
3. Time of the loss and its backward, from the parameters to their gradients, by CUDA events:
   median and quartiles of ``--reps`` (≥ 20) repetitions after 3 warm-ups, and the peak memory
   over the memory before (``max_memory_allocated``), of the built-in (fairseq's formula on
   ``log_softmax(scores.float())``), the fused path and the eager chunked path (64 MiB), in that
   order, fp16: ``dot`` at V ∈ {32k, 64k, 128k, 250k} × {4k, 16k} target tokens, every layer at
   32k and 4k.
4. The fused path at chunk budgets of 64 MiB to 1 GiB for ``dot`` (a budget whose chunks have
   the rows of a smaller one, ``fused.min_rows`` or the batch, is not measured again): the
   fastest per configuration, and overall (the lowest geometric mean of each budget's time over
   the fastest one's).

Goals (issue #81; ``goals`` in the JSON): the fused step at most 0.9× the built-in's time at
V ≥ 32k, and its loss memory at most 1/4 of the built-in's. ``CHUNKED_BY_DEFAULT`` stays off on
CUDA until a measurement meets them.

The JSON is written atomically after each measurement (``status`` says how far it got);
``--time-limit`` (420 s) stops starting new measurements, so a run stays within 8 minutes on an
H100 or H200. ``--report-only`` prints the Markdown tables of a JSON (``markdown``) and with
``--docs`` writes them into that file's ``fused_loss`` block.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "fairseq_tying" / "core"
BLOCK = "fused_loss"  # the docs' generated block
PAD, EPSILON = 1, 0.1
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GOALS = {"time_ratio_max": 0.9, "memory_ratio_max": 0.25, "from_vocab": 32000}
# relative error bounds of the fused path against fp64 on the same rounded scores: (loss and
# nll, each gradient); G is rounded to the half type (2⁻¹¹, 2⁻⁸ of each entry)
BOUNDS = {"fp16": (2e-5, 4e-3), "bf16": (1e-4, 4e-2)}
SIZES = {
    # check_vocab: fairseq pads a dictionary to a multiple of 8, not of 16 (rows then padded)
    "full": {"check_vocab": 32008, "check_tokens": 2048, "dim": 512,
             "vocab": [32000, 64000, 128000, 250000], "tokens": [4096, 16384],
             "layer_vocab": 32000, "layer_tokens": 4096,
             "budgets": [64, 128, 256, 512, 1024],
             "default_budget": 64, "reps": 25, "warmup": 3},
    "tiny": {"check_vocab": 1000, "check_tokens": 16, "dim": 16, "vocab": [300, 1000],
             "tokens": [8, 16], "layer_vocab": 300, "layer_tokens": 8,
             "budgets": [0.01, 0.02], "default_budget": 0.01, "reps": 3, "warmup": 1},
}
METHODS = ("builtin", "fused", "chunked")  # in the order timed: the eager path last
NAMES = {"builtin": "built-in", "fused": "fused", "chunked": "chunked"}
PHASES = ("setup", "scores", "kernel", "grad_h", "grad_w")


def label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=None, reduce=True):
    """fairseq's label-smoothed loss (fairseq/criterions/label_smoothed_cross_entropy.py):
    (1 − ε − ε_i)·nll + ε_i·(−Σ_j log p_j), ε_i = ε/(V − 1), padding rows 0."""
    if target.dim() == lprobs.dim() - 1:
        target = target.unsqueeze(-1)
    nll_loss = -lprobs.gather(dim=-1, index=target)
    smooth_loss = -lprobs.sum(dim=-1, keepdim=True)
    if ignore_index is not None:
        pad_mask = target.eq(ignore_index)
        nll_loss = nll_loss.masked_fill(pad_mask, 0.0)
        smooth_loss = smooth_loss.masked_fill(pad_mask, 0.0)
    nll_loss, smooth_loss = nll_loss.squeeze(-1), smooth_loss.squeeze(-1)
    if reduce:
        nll_loss, smooth_loss = nll_loss.sum(), smooth_loss.sum()
    eps_i = epsilon / (lprobs.size(-1) - 1)
    return (1.0 - epsilon - eps_i) * nll_loss + eps_i * smooth_loss, nll_loss


def load_core() -> types.SimpleNamespace:
    """The output layers, fused and chunked, loaded from the package's files without its
    ``__init__`` (which loads fairseq): chunked.py's fairseq names come from this script."""
    utils = types.ModuleType("fairseq.utils")
    utils.item = lambda t: t.item() if hasattr(t, "item") else t
    smoothed = types.ModuleType("fairseq.criterions.label_smoothed_cross_entropy")
    smoothed.label_smoothed_nll_loss = label_smoothed_nll_loss
    fairseq, criterions = types.ModuleType("fairseq"), types.ModuleType("fairseq.criterions")
    # the criterions' metrics (reduce_metrics), which no loss computed here calls
    logs, metrics = types.ModuleType("fairseq.logging"), types.ModuleType("fairseq.logging.metrics")
    fairseq.__path__, criterions.__path__, logs.__path__ = [], [], []
    fairseq.utils, fairseq.criterions, fairseq.logging = utils, criterions, logs
    criterions.label_smoothed_cross_entropy = smoothed
    logs.metrics = metrics
    for module in (fairseq, utils, criterions, smoothed, logs, metrics):
        sys.modules.setdefault(module.__name__, module)
    # the package's folders without its __init__ (which loads fairseq and the models)
    for name, folder in (("fairseq_tying", CORE.parent), ("fairseq_tying.core", CORE),
                         ("fairseq_tying.core.criterions", CORE / "criterions")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    layers = importlib.import_module("fairseq_tying.core.output_layers")
    chunked = importlib.import_module("fairseq_tying.core.criterions.chunked")
    return types.SimpleNamespace(layers=layers, chunked=chunked, fused=chunked.fused)


# ------------------------------------------------------------------------------ one step


def make_inputs(core, layer: str, vocab: int, tokens: int, dim: int, dtype, device,
                output_bias: bool, predicting: bool, seed: int = 0):
    """(parameters, target): W ~ N(0, 1/D) with a zero padding row, h ~ N(0, 1), b₂, g = √D."""
    g = torch.Generator(device=device).manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=g, device=device) * dim**-0.5
    weight[PAD] = 0
    params = {"weight": weight, "hidden": torch.randn(tokens, dim, generator=g, device=device)}
    if output_bias:
        params["output_bias"] = 0.1 * torch.randn(vocab, generator=g, device=device)
    # fixnorm's g = √D, ngpt's sz (V values)
    for name, value in core.layers.get(layer).initial_values(vocab, dim).items():
        params[name] = torch.as_tensor(value, device=device)
    params = {k: v.to(dtype).requires_grad_() for k, v in params.items()}
    target = torch.randint(2, vocab, (tokens,), generator=g, device=device)
    if predicting:  # a fifth of the rows predict their target: a count to compare
        with torch.no_grad():
            target[2::5] = F.linear(*affine(core, layer, params)).argmax(-1)[2::5]
    target[::10] = PAD
    return params, target


def affine(core, layer: str, params: dict):
    """(ĥ, W_out, b) of the output layer."""
    found = core.layers.get(layer)
    learned = {name: params[name] for name in found.parameters}
    w_out, bias = found.output_matrix_and_bias(params["weight"], params.get("output_bias"),
                                               **learned)
    return found.scored_hidden(params["hidden"], **learned), w_out, bias


def loss_of(core, method: str, hidden, w_out, bias, target, budget_mb: float,
            accuracy: bool = False):
    """(loss, nll, correct count or None) of ``method``: fairseq's formula on the full scores,
    or the chunked loss with its eager or its fused path."""
    if method == "builtin":
        lprobs = F.log_softmax(F.linear(hidden, w_out, bias).float(), dim=-1)
        loss, nll = label_smoothed_nll_loss(lprobs, target, EPSILON, PAD)
        correct = (lprobs.argmax(-1).eq(target) & target.ne(PAD)).sum() if accuracy else None
        return loss, nll, correct
    os.environ[core.fused.ENV] = "1" if method == "fused" else "0"
    return core.chunked.linear_label_smoothed_nll_loss(
        hidden, w_out, bias, target, EPSILON, PAD, budget_mb=budget_mb, accuracy=accuracy)


def stepper(core, method: str, layer: str, params: dict, target, budget_mb: float):
    """One loss and backward, the parameters' gradients cleared first."""
    def step() -> None:
        for p in params.values():
            p.grad = None
        loss_of(core, method, *affine(core, layer, params), target, budget_mb)[0].backward()
    return step


# ---------------------------------------------------------------------------- correctness


def _relative(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def exact(core, layer: str, params: dict, target) -> dict:
    """fairseq's formula in fp64 on the scores rounded as the model's are."""
    wide = {k: v.detach().double().requires_grad_() for k, v in params.items()}
    hidden, w_out, bias = affine(core, layer, wide)
    with torch.no_grad():
        rounded = F.linear(*affine(core, layer, params))
    s = F.linear(hidden, w_out, bias)
    lprobs = F.log_softmax(s + (rounded.double() - s).detach(), dim=-1)
    loss, nll = label_smoothed_nll_loss(lprobs, target, EPSILON, PAD)
    return {"loss": loss, "nll": nll, "grads": torch.autograd.grad(loss, list(wide.values())),
            "n_correct": (rounded.argmax(-1).eq(target) & target.ne(PAD)).sum().item()}


def check(core, layer: str, dtype_name: str, sizes: dict, device, methods: tuple) -> dict:
    """Every method's errors against ``exact``; the fused path's within BOUNDS (not passed
    where it was not run: the preflight failed)."""
    params, target = make_inputs(core, layer, sizes["check_vocab"], sizes["check_tokens"],
                                 sizes["dim"], DTYPES[dtype_name], device, True, True)
    want = exact(core, layer, params, target)
    result = {"exact_n_correct": want["n_correct"]}
    for method in methods:
        loss, nll, n_correct = loss_of(core, method, *affine(core, layer, params), target,
                                       sizes["default_budget"], accuracy=True)
        grads = torch.autograd.grad(loss, list(params.values()))
        result[method] = {
            "loss_error": _relative(loss, want["loss"]), "nll_error": _relative(nll, want["nll"]),
            "n_correct": int(n_correct.item()),
            "grad_errors": {k: _relative(g, w) for k, g, w in zip(params, grads, want["grads"],
                                                                    strict=True)}}
    if "fused" not in result:
        return {**result, "passed": False}
    got, (loss_bound, grad_bound) = result["fused"], BOUNDS[dtype_name]
    result["passed"] = bool(
        got["loss_error"] < loss_bound and got["nll_error"] < loss_bound
        and max(got["grad_errors"].values()) < grad_bound
        and abs(got["n_correct"] - want["n_correct"]) <= max(1, sizes["check_tokens"] // 1000))
    return result


def host_syncs(step, device) -> str:
    """'none' when ``step`` runs under torch's sync debug mode "error", else the error."""
    if device.type != "cuda":
        return "not checked (CPU)"
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        return "none"
    except RuntimeError as e:
        return f"synchronised: {str(e).splitlines()[0]}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------ preflight


def preflight(core, device) -> dict:
    """Triton imported, one launch of the kernel on 3 rows of V = 37 fp16 scores against
    fairseq's formula, and the half products' probe in fp16 and bf16 (its choice recorded)."""
    fused = core.fused
    if not fused.available():
        return {"passed": False, "error": f"Triton cannot be imported ({fused.TRITON_ERROR})"}
    try:
        g = torch.Generator().manual_seed(0)
        scores = torch.randn(3, 37, generator=g).to(device, torch.float16)
        target = torch.tensor([5, PAD, 36], device=device)
        buffer = torch.zeros(3, fused.padded_width(37), dtype=torch.float16, device=device)
        s = buffer[:, :37]
        s.copy_(scores)
        loss, nll = (torch.empty(3, device=device) for _ in range(2))
        correct = torch.empty(3, dtype=torch.int32, device=device)
        fused._launch(s, target, loss, nll, correct, EPSILON, PAD, fused.HALF_SCALE, True)
        want = label_smoothed_nll_loss(F.log_softmax(scores.double(), -1), target, EPSILON,
                                       PAD)[0]
        error = _relative(loss.sum(), want)
        products = {name: fused.product_path(device, dtype) for name, dtype in DTYPES.items()}
    except Exception as e:  # kept in the report: the baselines are measured all the same
        return {"passed": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    return {"passed": error < 1e-3, "kernel_loss_error": error, "products": products,
            "probes": fused.probes()}


# ------------------------------------------------------------------------------ breakdown


class PhaseTimer:
    """``mark(phase)`` ends the interval since the previous mark (or ``start``) and adds it to
    that phase: CUDA events recorded on the stream, read after a synchronisation (CPU: the
    wall clock)."""

    def __init__(self, cuda: bool):
        self.cuda, self.marks = cuda, []

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self.marks = [("start", self._now())]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self._now()))

    def totals(self) -> dict[str, float]:
        """ms per phase, summed over the chunks."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for (_, before), (phase, after) in itertools.pairwise(self.marks):
            ms = before.elapsed_time(after) if self.cuda else 1000 * (after - before)
            out[phase] = out.get(phase, 0.0) + ms
        return out


def breakdown(core, vocab: int, tokens: int, sizes: dict, dtype, device) -> dict:
    """The fused forward-and-gradients of ``dot`` (no bias) by phase: median ms of each over
    ``reps`` repetitions after the warm-ups, the chunks' rows, and which product ran."""
    fused = core.fused
    params, target = make_inputs(core, "dot", vocab, tokens, sizes["dim"], dtype, device, False,
                                 False)
    hidden, w_out = params["hidden"].detach(), params["weight"].detach()
    rows = fused.rows_per_chunk(vocab, dtype, sizes["default_budget"], sizes["dim"])
    timer = PhaseTimer(device.type == "cuda")
    runs = []
    for rep in range(sizes["warmup"] + sizes["reps"]):
        timer.start()
        fused.chunks(hidden, w_out, None, target, EPSILON, PAD, rows, (True, True, False), False,
                     mark=timer.mark)
        if rep >= sizes["warmup"]:
            runs.append(timer.totals())
    median = {phase: statistics.median(r.get(phase, 0.0) for r in runs) for phase in PHASES}
    return {"vocab": vocab, "tokens": tokens, "rows": min(rows, tokens),
            "chunks": -(-tokens // rows), "budget_mb": sizes["default_budget"],
            "product": fused.product_path(device, dtype), "median_ms": median,
            "total_ms": sum(median.values()), "reps": len(runs)}


# --------------------------------------------------------------------------------- timing


def _quartiles(ms: list[float]) -> dict:
    q1, median, q3 = statistics.quantiles(ms, n=4, method="inclusive")
    return {"median_ms": median, "q1_ms": q1, "q3_ms": q3, "reps": len(ms)}


def measure(step, params: dict, sizes: dict, device) -> dict:
    """Median and quartiles of the step's time (CUDA events; CPU: the wall clock) and its peak
    memory over the memory before it (CUDA only); skipped when it runs out of memory."""
    cuda = device.type == "cuda"
    try:
        for _ in range(sizes["warmup"]):
            step()
        if not cuda:
            ms = []
            for _ in range(sizes["reps"]):
                start = time.perf_counter()
                step()
                ms.append(1000 * (time.perf_counter() - start))
            return {**_quartiles(ms), "peak_mb": None}
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(sizes["reps"])]
        for start, end in events:
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        result = _quartiles([start.elapsed_time(end) for start, end in events])
        for p in params.values():
            p.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return {**result, "peak_mb": (torch.cuda.max_memory_allocated() - before) / 2**20}
    except torch.cuda.OutOfMemoryError:
        return {"skipped": "out of memory"}
    finally:
        for p in params.values():
            p.grad = None
        if cuda:
            torch.cuda.empty_cache()


def time_config(core, entry: dict, budgets: list[float], sizes: dict, dtype, device,
                record, methods: tuple) -> None:
    """The methods, and the fused path at every budget, on one set of inputs, into ``entry``
    (its layer, vocab and tokens), which the report holds: ``record`` writes it. A budget whose
    chunks have the rows of a smaller budget's (the floor, or the whole batch) takes its
    result."""
    layer, tokens = entry["layer"], entry["tokens"]
    params, target = make_inputs(core, layer, entry["vocab"], tokens, sizes["dim"], dtype,
                                 device, False, False)
    for method in methods:
        entry[method] = record(lambda m=method: measure(
            stepper(core, m, layer, params, target, sizes["default_budget"]), params, sizes,
            device))
    if budgets and "fused" in methods:
        entry["fused_budgets"], by_rows = {}, {}
        for mb in budgets:
            rows = min(tokens, core.fused.rows_per_chunk(entry["vocab"], dtype, mb, sizes["dim"]))
            if rows in by_rows:
                entry["fused_budgets"][f"{mb:g}"] = {**entry["fused_budgets"][by_rows[rows]],
                                                     "same_rows_as": by_rows[rows]}
                continue
            by_rows[rows] = f"{mb:g}"
            entry["fused_budgets"][f"{mb:g}"] = {"rows": rows, **record(lambda mb=mb: measure(
                stepper(core, "fused", layer, params, target, mb), params, sizes, device))}
        times = {mb: r["median_ms"] for mb, r in entry["fused_budgets"].items()
                 if "median_ms" in r}
        entry["best_budget_mb"] = min(times, key=times.get) if times else None
    entry.update(ratios(entry))


def ratios(entry: dict) -> dict:
    """fused ÷ built-in time and loss memory, and the goals where both were measured."""
    fused, builtin = entry.get("fused", {}), entry.get("builtin", {})
    if "median_ms" not in fused or "median_ms" not in builtin:
        return {}
    out = {"time_ratio": fused["median_ms"] / builtin["median_ms"]}
    if fused.get("peak_mb") and builtin.get("peak_mb"):
        out["memory_ratio"] = fused["peak_mb"] / builtin["peak_mb"]
    if entry["vocab"] >= GOALS["from_vocab"] and "memory_ratio" in out:
        out["goals_met"] = (out["time_ratio"] <= GOALS["time_ratio_max"]
                            and out["memory_ratio"] <= GOALS["memory_ratio_max"])
    return out


def best_budget(timing: dict) -> str | None:
    """The budget whose times over each configuration's fastest have the lowest geometric
    mean, over the configurations where every budget was measured."""
    logs: dict[str, list[float]] = {}
    for entry in timing.values():
        times = {mb: r.get("median_ms") for mb, r in entry.get("fused_budgets", {}).items()}
        if times and all(times.values()):
            for mb, t in times.items():
                logs.setdefault(mb, []).append(math.log(t / min(times.values())))
    return min(logs, key=lambda mb: statistics.fmean(logs[mb])) if logs else None


# --------------------------------------------------------------------------------- driver


def machine(device) -> dict:
    try:  # here: after --tiny has set TRITON_INTERPRET
        import triton
    except Exception as e:  # the preflight records it
        version = f"not importable: {type(e).__name__}"
    else:
        version = triton.__version__
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device.type, "torch": torch.__version__, "triton": version,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
            "python": platform.python_version(), "platform": platform.platform()}


def write_json(path: Path, report: dict) -> None:
    """``report`` onto ``path`` atomically (a temp file beside it, renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)


def run(opts: argparse.Namespace) -> dict:
    """Every measurement in order, the report written after each one."""
    sizes = dict(SIZES["tiny" if opts.tiny else "full"])
    sizes["reps"] = opts.reps or sizes["reps"]
    device = torch.device("cpu" if opts.tiny else "cuda")
    core = load_core()
    report = {"schema": 2, "machine": machine(device), "sizes": sizes, "goals": GOALS,
              "bounds": BOUNDS, "epsilon": EPSILON, "timing_dtype": opts.dtype,
              "status": "running", "preflight": {}, "correctness": {}, "timing": {}}
    deadline = time.monotonic() + opts.time_limit

    def record(measurement):
        if time.monotonic() > deadline:
            report["status"] = f"stopped at the time limit ({opts.time_limit:g} s)"
            return {"skipped": "time limit"}
        try:
            result = measurement()
        except Exception as e:  # kept in the report: the run goes on to the next measurement
            result = {"error": f"{type(e).__name__}: {e}"[:2000]}
            report.setdefault("errors", []).append(result["error"])
            print(f"error: {result['error']}", file=sys.stderr)
        write_json(opts.out, report)
        return result

    report["preflight"] = record(lambda: preflight(core, device))
    fused_ok = report["preflight"].get("passed", False)
    methods = METHODS if fused_ok else tuple(m for m in METHODS if m != "fused")
    if not fused_ok:
        report.setdefault("errors", []).append(
            f"preflight: {report['preflight'].get('error', report['preflight'])}")
        print(f"error: the preflight failed, the fused path is not measured: "
              f"{report['preflight']}", file=sys.stderr)
    layers = tuple(core.layers.OUTPUT_LAYERS)
    for dtype_name in DTYPES:
        by_layer = report["correctness"][dtype_name] = {}
        for layer in layers:
            by_layer[layer] = record(lambda d=dtype_name, la=layer: check(core, la, d, sizes,
                                                                          device, methods))
    if fused_ok:
        params, target = make_inputs(core, "dot", sizes["check_vocab"], sizes["check_tokens"],
                                     sizes["dim"], DTYPES[opts.dtype], device, False, False)
        step = stepper(core, "fused", "dot", params, target, sizes["default_budget"])
        # compiled by a first step, then checked
        report["host_syncs"] = record(lambda: (step(), host_syncs(step, device))[1])
        report["breakdown"] = record(lambda: breakdown(
            core, max(sizes["vocab"]), max(sizes["tokens"]), sizes, DTYPES[opts.dtype], device))
    configs = [("dot", v, t, sizes["budgets"]) for v in sizes["vocab"] for t in sizes["tokens"]]
    configs += [(layer, sizes["layer_vocab"], sizes["layer_tokens"], [])
                for layer in layers if layer != "dot"]
    for layer, vocab, tokens, budgets in configs:
        entry = report["timing"][f"{layer}/{vocab}/{tokens}"] = {
            "layer": layer, "vocab": vocab, "tokens": tokens}
        time_config(core, entry, budgets, sizes, DTYPES[opts.dtype], device, record, methods)
    report["products"] = core.fused.probes()  # which implementation of ∂/∂h and ∂/∂W_out ran
    report["best_budget_mb"] = best_budget(report["timing"])
    met = [e["goals_met"] for e in report["timing"].values() if "goals_met" in e]
    report["goals_met"] = all(met) if met else None  # None: no GPU memory measured
    report["all_correct"] = all(r.get("passed") for by in report["correctness"].values()
                                for r in by.values())
    if report["status"] == "running":
        report["status"] = "done"
    write_json(opts.out, report)
    return report


# ------------------------------------------------------------------------------ the tables


def _ms(result: dict) -> str:
    if "median_ms" not in result:
        return result.get("skipped", "—")
    return f"{result['median_ms']:.1f} ({result['q1_ms']:.1f}–{result['q3_ms']:.1f})"


def _mb(result: dict) -> str:
    return f"{result['peak_mb']:,.0f}" if result.get("peak_mb") is not None else "—"


def _ratio(entry: dict, key: str) -> str:
    return f"{entry[key]:.2f}" if key in entry else "—"


def markdown(report: dict, source: str = "") -> str:
    """The docs' tables of one report: correctness, then time and memory."""
    m = report["machine"]
    where = m["gpu"] or f"{m['device']} (Triton's interpreter)"
    lines = [f"**{where}**, torch {m['torch']}, Triton {m['triton']}, {m['date'][:10]}; "
             f"{report['timing_dtype']}, ε = {report['epsilon']}, D = {report['sizes']['dim']}; "
             f"status: {report['status']}" + (f"; [JSON]({source})" if source else ""), "",
             "| layer | " + " | ".join(f"{d} loss / max gradient error" for d in DTYPES)
             + " | passed |", "|---|" + "---:|" * len(DTYPES) + "---|"]
    for layer in report["correctness"].get("fp16", {}):
        cells, passed = [], []
        for d in DTYPES:
            r = report["correctness"].get(d, {}).get(layer, {})
            fused = r.get("fused")
            cells.append(f"{fused['loss_error']:.1e} / {max(fused['grad_errors'].values()):.1e}"
                         if fused else "—")
            passed.append(r.get("passed"))
        lines.append(f"| {layer} | " + " | ".join(cells) + f" | {all(passed)} |")
    goals = {True: "met", False: "not met", None: "not measured"}[report.get("goals_met")]
    names = " / ".join(NAMES[m] for m in METHODS)
    lines += ["", preflight_line(report.get("preflight", {}))]
    if report.get("breakdown", {}).get("median_ms"):
        b = report["breakdown"]
        lines += ["", f"The fused step's phases at V = {b['vocab']:,}, {b['tokens']:,} tokens "
                  f"(chunks of {b['rows']:,} rows: {b['chunks']}), ms: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in b["median_ms"].items())
                  + f"; total {b['total_ms']:.1f}."]
    lines += ["", f"Host synchronisations in a fused step: {report.get('host_syncs', '—')}. "
              f"Fastest budget overall: {report.get('best_budget_mb') or '—'} MiB. Goals "
              f"(fused ≤ {GOALS['time_ratio_max']}× the built-in's time and ≤ "
              f"{GOALS['memory_ratio_max']}× its loss memory from V = 32k): {goals}.", "",
              f"| layer | target tokens | V | ms, median (quartiles): {names} |"
              f" fused ÷ built-in time | loss MiB: {names} |"
              " fused ÷ built-in memory | fastest budget (MiB) |",
              "|---|---:|---:|---|---:|---|---:|---:|"]
    for e in report["timing"].values():
        vocab = f"{e['vocab'] // 1000}k" if e["vocab"] >= 1000 else str(e["vocab"])
        lines.append(f"| {e['layer']} | {e['tokens']:,} | {vocab} | "
                     + " / ".join(_ms(e.get(k, {})) for k in METHODS) + f" | "
                     f"{_ratio(e, 'time_ratio')} | "
                     + " / ".join(_mb(e.get(k, {})) for k in METHODS) + f" | "
                     f"{_ratio(e, 'memory_ratio')} | {e.get('best_budget_mb') or '—'} |")
    return "\n".join(lines) + "\n"


def preflight_line(pre: dict) -> str:
    if not pre.get("passed"):
        return f"Preflight failed: {pre.get('error', pre)}; the fused path was not measured."
    paths = ", ".join(f"{d} {path}" for d, path in pre["products"].items())
    return (f"Preflight passed (kernel loss error {pre['kernel_loss_error']:.1e}); ∂/∂h and "
            f"∂/∂W_out by: {paths}.")


def write_docs(docs: Path, text: str) -> None:
    """``text`` between the ``fused_loss`` markers of ``docs``."""
    begin, end = f"<!-- {BLOCK}:begin -->", f"<!-- {BLOCK}:end -->"
    old = docs.read_text(encoding="utf-8")
    if begin not in old or end not in old:
        raise SystemExit(f"error: {docs} has no {begin} ... {end} block")
    head, rest = old.split(begin, 1)
    docs.write_text(f"{head}{begin}\n{text.rstrip()}\n{end}{rest.split(end, 1)[1]}",
                    encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "work" / "gpu_fused" /
                   "gpu_fused_loss.json")
    p.add_argument("--tiny", action="store_true",
                   help="tiny sizes on the CPU, the kernel in Triton's interpreter (the tests)")
    p.add_argument("--reps", type=int, help="timed repetitions (default 25; --tiny 3)")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp16", help="of the timings")
    p.add_argument("--time-limit", type=float, default=420.0,
                   help="seconds after which no new measurement starts (420)")
    p.add_argument("--report-only", type=Path, metavar="JSON",
                   help="measure nothing: print the tables of JSON (and write --docs)")
    p.add_argument("--docs", type=Path, help=f"write the tables into its {BLOCK} block")
    opts = p.parse_args(argv)
    if opts.report_only:
        text = markdown(json.loads(opts.report_only.read_text()),
                        os.path.relpath(opts.report_only, (opts.docs or opts.out).parent))
        if opts.docs:
            write_docs(opts.docs, text)
        print(text)
        return 0
    if not opts.tiny and not torch.cuda.is_available():
        p.error(f"no CUDA device (torch {torch.__version__}): run it on a GPU, or --tiny")
    if not opts.tiny and (opts.reps or 25) < 20:
        p.error("--reps: at least 20 on a GPU")
    if opts.tiny:  # before fused.py imports Triton, which reads it then
        os.environ["TRITON_INTERPRET"] = "1"
    report = run(opts)
    print(markdown(report))
    print(f"wrote {opts.out}")
    return 0 if report["all_correct"] and not report.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
