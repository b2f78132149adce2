"""Cost of the output layers against fairseq's own tied Transformer.

``python -m fairseq_tying.bench`` builds, in one process, fairseq's ``transformer`` with
``--share-all-embeddings`` and the plugin's ``transformer_twwt`` with every output layer, all
with the same dimensions and the same initial parameters, and measures for each vocabulary size:

- the training step (forward, backward, Adam step) on a fixed batch of random tokens;
- beam-5 generation with fairseq's ``SequenceGenerator`` (incremental decoding) on fixed source
  sentences, forced to a fixed output length so that every model does the same number of steps;
- the peak memory of training and of generation over the memory before the model was built, each
  model in a fresh subprocess (CPU: bytes allocated by the C allocator, glibc's ``mallinfo2``,
  sampled every 0.2 ms, or the resident set size without glibc; CUDA: peak allocated).

Repetitions interleave the models (rotating order) after a warm-up; each model's time is divided
by the built-in model's time in the same repetition and the ratios are summarized by their median
and quartiles (:mod:`.measure`). Results go to a table (stdout), a JSON file and a PNG plot of
ratio against V (:mod:`.layers_report`).

``python -m fairseq_tying.bench --mode serve --checkpoint CKPT`` instead measures a trained
model's decoding speed: fairseq-generate against CTranslate2 float32 and int8
(``fairseq_tying/bench/serve.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from fairseq import options
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
)
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationTask
from tqdm import tqdm

from fairseq_tying.bench.layers_report import BUILTIN, PLOT_FOR, model_names, plot, table
from fairseq_tying.bench.measure import (
    CLOCKS,
    PeakMemory,
    current_rss,
    heap_in_use,
    interleaved,
    summarize,
    timed,
    use_clock,
)
from fairseq_tying.common import PLUGIN_DIR, atomic
from fairseq_tying.common.extras import pyplot
from fairseq_tying.core import names, output_layers


@dataclass(frozen=True)
class Size:
    layers: int
    dim: int
    ffn: int
    heads: int
    batch_tokens: int  # target tokens per training batch
    sent_len: int  # source and target length of the training sentences
    gen_sents: int  # source sentences decoded with beam 5
    gen_len: int  # forced output length


SIZES = {
    "tiny": Size(1, 32, 64, 2, 256, 16, 4, 6),
    "small": Size(2, 128, 512, 4, 1024, 32, 8, 16),
    "iwslt": Size(6, 512, 1024, 4, 4096, 32, 32, 30),
    "wmt_big": Size(6, 1024, 4096, 16, 8192, 32, 64, 30),
}


def model_flags(name: str, p: Size) -> list[str]:
    dims = ["--encoder-layers", str(p.layers), "--decoder-layers", str(p.layers),
            "--encoder-embed-dim", str(p.dim), "--decoder-embed-dim", str(p.dim),
            "--encoder-ffn-embed-dim", str(p.ffn), "--decoder-ffn-embed-dim", str(p.ffn),
            "--encoder-attention-heads", str(p.heads), "--decoder-attention-heads", str(p.heads),
            "--dropout", "0.1", "--max-source-positions", "256", "--max-target-positions", "256"]
    if name == BUILTIN:
        return ["--arch", "transformer", "--share-all-embeddings", *dims]
    return ["--arch", "transformer_twwt", "--output-layer", name, *dims]


class Bench:
    """The task, models and fixed inputs for one vocabulary size."""

    def __init__(self, vocab: int, size: Size, device: str, fp16: bool, seed: int = 1):
        self.size, self.device, self.fp16, self.seed = size, torch.device(device), fp16, seed
        d = Dictionary()
        for i in range(vocab - len(d)):
            d.add_symbol(f"t{i}")
        self.dict = d
        self.args = self._args(BUILTIN)
        self.task = TranslationTask(self.args, d, d)
        g = torch.Generator().manual_seed(seed)
        n_sents = max(1, size.batch_tokens // size.sent_len)
        self.sample = self._batch(g, n_sents, size.sent_len, with_target=True)
        self.gen_sample = self._batch(g, size.gen_sents, size.sent_len, with_target=False)

    def _args(self, name: str) -> argparse.Namespace:
        parser = options.get_training_parser()
        return options.parse_args_and_arch(parser, ["unused", "--user-dir", PLUGIN_DIR,
                                                    *model_flags(name, self.size)])

    def _batch(self, g: torch.Generator, n: int, length: int, with_target: bool) -> dict:
        d = self.dict

        def tokens() -> torch.Tensor:
            t = torch.randint(d.nspecial, len(d), (n, length), generator=g)
            t[:, -1] = d.eos()
            return t

        src = tokens()
        net_input = {"src_tokens": src, "src_lengths": torch.full((n,), length)}
        sample = {"id": torch.arange(n), "nsentences": n, "ntokens": n * length,
                  "net_input": net_input}
        if with_target:
            target = tokens()
            net_input["prev_output_tokens"] = torch.cat(
                [torch.full((n, 1), d.eos()), target[:, :-1]], dim=1)
            sample["target"] = target
        return _to(sample, self.device)

    def build(self, name: str, reference: torch.nn.Module | None = None) -> torch.nn.Module:
        """The model ``name``; its parameters copied from ``reference`` (the built-in model)."""
        torch.manual_seed(self.seed)
        model = self.task.build_model(self._args(name))
        if reference is not None:
            state = dict(reference.state_dict())
            state[names.SCORER_WEIGHT] = state.pop(names.OUTPUT_PROJECTION)
            model.load_state_dict(state, strict=True)
        return model.to(self.device)

    def trainer(self, model: torch.nn.Module) -> Callable[[], None]:
        """One training step: label-smoothed cross-entropy, backward, Adam (AMP under --fp16)."""
        criterion = LabelSmoothedCrossEntropyCriterion(self.task, False, 0.1)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.fp16)

        def step() -> None:
            model.train()
            with torch.autocast(self.device.type, torch.float16, enabled=self.fp16):
                loss, _, _ = criterion(model, self.sample)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)

        return step

    def generator(self, model: torch.nn.Module) -> Callable[[], list]:
        """Beam-5 decoding of the fixed sources, exactly ``gen_len`` steps for every model."""
        length = self.size.gen_len
        gen = SequenceGenerator([model], self.dict, beam_size=5, max_len_a=0, max_len_b=length,
                                min_len=length)

        def decode() -> list:
            if model.training:  # eval() once, as fairseq-generate does (it refreshes caches)
                model.eval()
            return self.task.inference_step(gen, [model], self.gen_sample)

        return decode


def _to(obj, device: torch.device):
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def ratios(times: dict[str, list[float]]) -> dict[str, dict]:
    base = times[BUILTIN]
    out = {}
    for name, ts in times.items():
        r = [t / b for t, b in zip(ts, base, strict=True)]
        out[name] = {"ratio": summarize(r), "seconds_median": statistics.median(ts)}
    return out


def memory_worker(spec: dict) -> dict:
    """Peak memory (bytes over the memory before the model was built) of generation, then
    training, for one model; run in a fresh process."""
    bench = Bench(spec["vocab"], Size(**spec["size"]), spec["device"], spec["fp16"])
    cuda = bench.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    else:
        gc.collect()
        base = heap_in_use()
    model = bench.build(spec["model"])
    result = {}
    for phase in ("generate", "train"):
        if phase == "generate":
            gen_model = model.half() if bench.fp16 else model
            fn = bench.generator(gen_model)
        else:
            model = model.float()
            fn = bench.trainer(model)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            result[phase] = torch.cuda.max_memory_allocated() - base
        else:
            with PeakMemory() as peak:
                for _ in range(2):
                    fn()
            result[phase] = peak.peak - base
    return result


def measure_memory(vocab: int, size: Size, device: str, fp16: bool, progress) -> dict:
    out = {}
    for name in model_names():
        spec = {"vocab": vocab, "size": asdict(size), "device": device, "fp16": fp16,
                "model": name}
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run([sys.executable, "-m", "fairseq_tying.bench", "--memory-worker",
                               json.dumps(spec)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"memory measurement of {name} (V={vocab}) failed:\n"
                               f"{proc.stderr[-3000:]}")
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        progress()
    elem = 2 if fp16 else 4
    unit = vocab * size.dim * elem  # bytes of one V x D buffer
    result = {}
    for name, peaks in out.items():
        result[name] = {phase: {"bytes": b, "extra_over_builtin": b - out[BUILTIN][phase],
                                "extra_VxD_buffers": (b - out[BUILTIN][phase]) / unit}
                        for phase, b in peaks.items()}
    return result


# ----------------------------------------------------------------------------------- driver


def run_vocab(vocab: int, size: Size, opts, progress) -> dict:
    bench = Bench(vocab, size, opts.device, opts.fp16)
    builtin = bench.build(BUILTIN)
    models = {BUILTIN: builtin}
    layers = output_layers.names()
    for name in layers:
        models[name] = bench.build(name, reference=builtin)
    train = interleaved({n: bench.trainer(m) for n, m in models.items()}, bench.device,
                        opts.reps, opts.train_steps, opts.warmup, progress)
    isolated = {name: 1 + extra_work(models[name], name, bench.device, opts.reps)
                / min(train[BUILTIN]) for name in layers}
    # Generation starts from identical parameters again: training moved them apart.
    for name in layers:
        state = dict(builtin.state_dict())
        state[names.SCORER_WEIGHT] = state.pop(names.OUTPUT_PROJECTION)
        models[name].load_state_dict(state)
    if opts.fp16:
        models = {n: m.half() for n, m in models.items()}
    decoders = {n: bench.generator(m) for n, m in models.items()}
    # fairseq's own layer over the same parameters: the same search, the same hypotheses
    same = _hypotheses(decoders[BUILTIN]()) == _hypotheses(decoders[output_layers.BASELINE]())
    generate = interleaved(decoders, bench.device, opts.reps, opts.gen_calls, opts.warmup,
                           progress)
    result = {"train": ratios(train), "generate": ratios(generate),
              "train_isolated_estimate": isolated,
              "dot_hypotheses_identical_to_builtin": same}
    del models, decoders, builtin
    if not opts.no_memory:
        result["memory"] = measure_memory(vocab, size, opts.device, opts.fp16, progress)
    return result


def extra_work(model: torch.nn.Module, output_layer: str, device: torch.device, reps: int) -> float:
    """Seconds (fastest of ``reps``) of what ``output_layer`` adds to a training step: computing
    (W_out, b) from W and back-propagating through it (nothing where W_out is W and there is no
    b). The fastest run is little disturbed by other processes, so 1 + this / (fastest
    built-in step) estimates the ratio steadily."""
    layer = output_layers.get(output_layer)
    weight = model.decoder.scorer.weight.detach().clone().requires_grad_()
    learned = {name: p.detach() for name, p in model.decoder.scorer.layer_parameters().items()}
    w_out, bias = layer.affine(weight, **learned)
    if w_out is weight and bias is None:
        return 0.0
    grads = [torch.randn_like(w_out), None if bias is None else torch.randn_like(bias)]

    def step() -> None:
        outs = layer.affine(weight, **learned)
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if o is not None]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])

    step()
    return min(timed(step, device, 1) for _ in range(reps))


def _hypotheses(hypos: list) -> list[list[int]]:
    return [h[0]["tokens"].tolist() for h in hypos]


def machine(device: str) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_avg_start": os.getloadavg(),
            "cpu_memory": "glibc mallinfo2" if heap_in_use is not current_rss else "rss"}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="layers",
                   help="layers: this benchmark (default); serve: fairseq-generate vs "
                        "CTranslate2 on a trained checkpoint (--mode serve --help); gpu-check: "
                        "the GPU acceptance run (--mode gpu-check --help)")
    p.add_argument("--size", choices=SIZES, default=None,
                   help="model and batch size (default: small on CPU, iwslt on CUDA)")
    p.add_argument("--vocab", type=int, nargs="+", default=[8000, 32000, 64000],
                   help="vocabulary sizes V (default: 8000 32000 64000)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--fp16", action="store_true",
                   help="CUDA only: train with fp16 autocast, generate with a half model")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default: 5)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up calls per model (default: 1)")
    p.add_argument("--train-steps", type=int, default=1,
                   help="training steps per repetition (default: 1)")
    p.add_argument("--gen-calls", type=int, default=2,
                   help="generation calls per repetition (default: 2)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--clock", choices=CLOCKS, default="wall",
                   help="wall time, or the process's CPU time (steadier on a shared machine with "
                        "--threads 1; CPU only) (default: wall)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument("--out", type=Path, default=Path("bench_results"),
                   help="folder for bench.json and bench.png (default: bench_results)")
    p.add_argument("--memory-worker", metavar="JSON", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.fp16 and opts.device != "cuda":
        p.error("--fp16 needs --device cuda (fp16 matrix products on CPU are not representative)")
    if opts.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible to torch")
    if opts.clock == "cpu" and opts.device == "cuda":
        p.error("--clock cpu: GPU work is not process CPU time; use --clock wall with cuda")
    if min(opts.vocab) < 16:
        p.error("--vocab: sizes must be at least 16")
    if opts.reps < 2:
        p.error("--reps: at least 2 repetitions are needed for a spread")
    if opts.warmup < 0:
        p.error(f"--warmup {opts.warmup}: give 0 (no warm-up) or more calls")
    for flag in ("train_steps", "gen_calls"):
        if getattr(opts, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} {getattr(opts, flag)}: at least 1 call is timed")
    opts.size = opts.size or ("iwslt" if opts.device == "cuda" else "small")
    return opts


def run(opts: argparse.Namespace) -> dict | None:
    """The mode with parsed options (``python -m fairseq_tying.bench --mode ...``)."""
    if opts.threads:
        torch.set_num_threads(opts.threads)
    use_clock(opts.clock)
    if opts.memory_worker:
        print(json.dumps(memory_worker(json.loads(opts.memory_worker))))
        return None

    pyplot(PLOT_FOR)  # the figure needs matplotlib: fail before the measurements
    size = SIZES[opts.size]
    n_models = len(model_names())
    total = len(opts.vocab) * n_models * (2 * opts.reps + (0 if opts.no_memory else 1))
    report = {"config": {**{k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(opts).items() if k != "memory_worker"},
                         "size_dims": asdict(size)},
              "machine": machine(opts.device), "results": {}}
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr) as bar:
        for vocab in opts.vocab:
            report["results"][str(vocab)] = run_vocab(vocab, size, opts, lambda: bar.update())
    report["machine"]["load_avg_end"] = os.getloadavg()
    opts.out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(opts.out / "bench.json", report, indent=1, ensure_ascii=True)
    title = (f"fairseq_tying output layers vs fairseq transformer ({opts.size}, {opts.device}"
             f"{', fp16' if opts.fp16 else ''})")
    plot(report["results"], opts.out / "bench.png", title)
    print(table(report["results"]))
    print(f"wrote {opts.out / 'bench.json'} and {opts.out / 'bench.png'}")
    return report


def main(argv: list[str] | None = None) -> dict | None:
    return run(parse_args(argv))
