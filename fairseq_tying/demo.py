"""The main job: prepare the embedded Bible es→en corpus, train a small three-way-tied
Transformer with the ``dot`` output layer and one with a normalized layer, evaluate both with
sacrebleu, print the table and write the plots.

    python -m fairseq_tying.demo [--out work/demo] [--max-update N] [--output-layers dot l2norm]
                                 [--record docs/demo/demo.json --readme README.md]

The models train side by side, one single-threaded process each, their fairseq logs prefixed with
the output layer. Finished steps are skipped on a rerun (fairseq resumes from
``checkpoint_last.pt``). Every run ends with ``OUT/results/demo.json``: per output layer BLEU,
chrF and the row norms of the tied matrix, and the minutes the whole command took; ``--record``
copies it (the repository's is ``docs/demo/demo.json``) and ``--readme`` writes its table into
that file's ``demo`` block; ``--report-only`` does the last from an existing record.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from fairseq_tying.common import PLUGIN_DIR
from fairseq_tying.common.atomic import write_json
from fairseq_tying.common.blocks import replace_block
from fairseq_tying.common.extras import run_main
from fairseq_tying.common.reproducible import cpu_name_under, pinned_env
from fairseq_tying.common.run_spec import Identity, RunSpec, write_run_json
from fairseq_tying.evaluation.evaluate import evaluate_run, summary_lines
from fairseq_tying.evaluation.norms import norms_report, row_norms
from fairseq_tying.evaluation.result import TranslationResult

ARCH = "transformer_twwt"
MODEL = ["--encoder-layers", "2", "--decoder-layers", "2",
         "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
         "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--dropout", "0.1"]
OPTIMIZATION = ["--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1",
                "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0",
                "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "200",
                "--max-tokens", "4096", "--required-batch-size-multiple", "1"]


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _run(cmd: list[str]) -> None:
    """Run a step with its output (fairseq's progress log) going straight to the terminal."""
    env = {**pinned_env(), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"step failed ({proc.returncode}): {' '.join(cmd)}")


def prepare(out: Path, corpus: str, vocab: int) -> Path:
    data = out / "data"
    _run([sys.executable, "-m", "fairseq_tying.data.prepare", "--corpus", corpus,
          "--src", "es", "--tgt", "en", "--subword", "sentencepiece",
          "--vocab-size", str(vocab), "--out", str(data)])
    return data


def demo_identity(corpus: str, output_layer: str, seed: int) -> Identity:
    """A demo run, named as a sweep's (``Identity.named``) after its corpus: ``bible``, or the
    folder of the corpus given."""
    return Identity.named(dataset=Path(corpus).name, arch=ARCH, tying="three_way",
                          output_layer=output_layer, seed=seed,
                          method=f"{ARCH}:{output_layer}")


def train_command(data: Path, run: Path, identity: Identity, max_update: int) -> list[str]:
    run.mkdir(parents=True, exist_ok=True)
    write_run_json(RunSpec(identity, run_dir=str(run), data_dir=str(data)))
    output_layer, seed = identity.output_layer, identity.seed
    return [
        _tool("fairseq-train"),
        str(data / "bin"),
        "--user-dir",
        PLUGIN_DIR,
        "--arch",
        ARCH,
        "--output-layer",
        output_layer,
        *MODEL,
        *OPTIMIZATION,
        "--max-update",
        str(max_update),
        "--seed",
        str(seed),
        "--cpu",
        "--save-dir",
        str(run / "checkpoints"),
        "--no-epoch-checkpoints",
        "--log-interval",
        "25",
        "--log-format",
        "simple",
    ]


def train_env() -> dict[str, str]:
    # one thread each whatever the core count: the thread count changes the numbers
    return {**pinned_env(threads=None), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def train_in_parallel(commands: dict[str, list[str]]) -> None:
    """One single-threaded fairseq-train each, their logs interleaved line by line with a
    prefix."""
    env = train_env()
    procs = {
        name: subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for name, cmd in commands.items()
    }

    def relay(name: str, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            print(f"[{name}] {line}", end="", flush=True)

    relays = [threading.Thread(target=relay, args=item) for item in procs.items()]
    for t in relays:
        t.start()
    for t in relays:
        t.join()
    failed = [name for name, proc in procs.items() if proc.wait() != 0]
    if failed:
        raise SystemExit(f"training failed for {failed}: see the [{failed[0]}] lines above")


def demo_record(run_dirs: dict[str, Path], results: list[TranslationResult],
                args: argparse.Namespace, seconds: float) -> dict:
    """What the README's demo block shows, and how it was made: the machine's processor with
    the kernels its training processes ran (the numbers move with them)."""
    layers = {}
    for (layer, run), res in zip(run_dirs.items(), results, strict=True):
        norms = row_norms(run / "checkpoints" / "checkpoint_best.pt")[1]
        layers[layer] = {"run": run.name, "bleu": round(res.bleu, 2),
                         "chrf": round(res.chrf, 2), "bleu_signature": res.bleu_signature,
                         "sentences": res.n_sentences, "checkpoint": "checkpoint_best.pt",
                         "row_norm_mean": round(float(norms.mean()), 3),
                         "row_norm_std": round(float(norms.std()), 3)}
    return {"command": "python -m fairseq_tying.demo " + " ".join(args.argv),
            "minutes": round(seconds / 60, 1), "max_update": args.max_update,
            "seed": args.seed, "layers": layers,
            "machine": {"cpu": cpu_name_under(train_env()), "cpus": os.cpu_count(),
                        "platform": platform.platform(),
                        "python": platform.python_version(), "torch": torch.__version__}}


def readme_block(record: dict) -> str:
    """The README's demo block: the table of ``record`` and how it was made."""
    rows = ["| output layer | BLEU | chrF | row norms of W: mean ± std |", "|---|---:|---:|---|"]
    rows += [f"| `{layer}` | {r['bleu']:.2f} | {r['chrf']:.2f} | "
             f"{r['row_norm_mean']:.3f} ± {r['row_norm_std']:.3f} |"
             for layer, r in record["layers"].items()]
    cpus, cpu = record["machine"]["cpus"], record["machine"].get("cpu", "not recorded")
    cpu = "processor not recorded" if cpu == "not recorded" else cpu
    sentences = next(iter(record["layers"].values()))["sentences"]
    return ("\n".join(rows) + f"\n\n`{record['command']}`: {record['minutes']:g} min on "
            f"{cpus} CPU core{'s' * (cpus != 1)} ({cpu}), {record['max_update']} updates each, "
            f"seed {record['seed']}, test set of {sentences:,} verses; from "
            "[docs/demo/demo.json](docs/demo/demo.json).\n")


def publish(record: dict, path: Path | None, readme: Path | None) -> None:
    if path:
        write_json(path, record)
        print(f"wrote {path}", flush=True)
    if readme:
        replace_block(readme, "demo", readme_block(record))
        print(f"wrote the demo block of {readme}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_tying.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("work/demo"))
    parser.add_argument(
        "--corpus", default="bible", help="'bible' or a folder with {train,valid,test}.{es,en}"
    )
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--max-update", type=int, default=600)
    parser.add_argument("--output-layers", "--rules", nargs="+", default=["dot", "l2norm"],
                        help="output layers to train and compare (default: dot l2norm; "
                             "--rules is the old name of this flag)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--record", type=Path,
                        help="copy the run's demo.json here (the repository's record: "
                             "docs/demo/demo.json)")
    parser.add_argument("--readme", type=Path,
                        help="write the record's table into this file's <!-- demo:begin --> block")
    parser.add_argument("--report-only", action="store_true",
                        help="no training: write --readme's block from the --record file")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.report_only:
        if not (args.record and args.readme):
            parser.error("--report-only needs --record (the record to read) and --readme")
        if not args.record.is_file():
            parser.error(f"--record {args.record}: no such file; run the demo with --record "
                         "first")
        publish(json.loads(args.record.read_text()), None, args.readme)
        return 0
    if args.readme and not args.readme.is_file():
        parser.error(f"--readme {args.readme}: no such file")
    # imported before training: without the analysis extra (the comparison's statistics and
    # plots) the demo stops at once, with the extra to install (run_main)
    from fairseq_tying.studies.collect import collect

    start = time.time()
    data = prepare(args.out, args.corpus, args.vocab_size)
    runs = args.out / "runs"
    identities = {output_layer: demo_identity(args.corpus, output_layer, args.seed)
                  for output_layer in args.output_layers}
    run_dirs = {output_layer: runs / identity.name
                for output_layer, identity in identities.items()}
    print(
        f"\n== training {ARCH} with --output-layer {' and '.join(args.output_layers)} "
        f"({args.max_update} updates each, side by side) ==",
        flush=True,
    )
    train_in_parallel(
        {
            output_layer: train_command(data, run, identities[output_layer], args.max_update)
            for output_layer, run in run_dirs.items()
        }
    )
    evaluated = []
    for run in run_dirs.values():
        print(f"\n== evaluating {run.name} ==", flush=True)
        evaluated.append(evaluate_run(run, data, cpu=True))
        print("\n".join(summary_lines(evaluated[-1])), flush=True)
    results = args.out / "results"
    print(collect(runs, results)["markdown"], flush=True)
    checkpoints = [run / "checkpoints" / "checkpoint_best.pt" for run in run_dirs.values()]
    print(norms_report(checkpoints, results / "norms.png", args.output_layers), flush=True)
    record = demo_record(run_dirs, evaluated, args, time.time() - start)
    write_json(results / "demo.json", record)
    publish(record, args.record, args.readme)
    print(f"\ndemo finished in {record['minutes']:.1f} min; table, JSON and plots in {results}/",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
