"""``python -m fairseq_tying.launch new-sweep --data DIR ...``: write the equal-training sweep
file that answers "which tying mode and output layer?" on a prepared data dir.

    python -m fairseq_tying.launch new-sweep --data work/mine/data --pilot --out mine_pilot.yaml
    python -m fairseq_tying.launch new-sweep --data work/mine/data --epochs 40 --out mine.yaml

The sweep follows the equal-training study's protocol (slurm/bible_equal.yaml): every run
trains exactly ``--epochs`` epochs (no early stopping), keeps its last ``--average-last`` epoch
checkpoints and is scored on the data dir's test set as their average (beam 5), the
best-validation checkpoint beside it; logs are JSON, which the answer (``python -m
fairseq_tying.studies answer``) reads. Its grid, per family: the tying table with ``dot``
(each of ``--tying``), then three-way tying with every other ``--output-layers``, and with
``--z-loss λ`` three-way ``dot`` trained with PaLM's z-loss (a block tagged ``zloss``: a cell of
its own, "dot+zloss" in the answer); ``--seeds`` of each. ``--pilot`` writes the first seed
of every cell of that grid, each trained until its validation NLL flattens (the plateau rule,
at most ``--max-epochs``): a tied model may still learn when the untied one has flattened, so
the budget is the latest of their stop epochs, not the baseline's. ``--budget-from PILOT.yaml``
reads that budget from the finished pilot and lets the pilot's runs go on from their
checkpoints (``continue_from:``; the learning-rate schedule does not depend on the budget).
The file is plain YAML with comments: edit it before launching.

The model is a ``--model`` preset (``tiny``: a smoke test of the whole path;
``small``: the studies'; ``iwslt``), each of its sizes overridden by ``--embed-dim``,
``--ffn-dim``, ``--layers``, ``--heads`` and ``--max-tokens``. Once the file is written, a
short timed sample of training (the first run of each family) on the data dir estimates what an
epoch, a run and the whole sweep cost on this machine (``launch/cost.py``; ``--no-estimate``
skips it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fairseq_tying.common.atomic import write_text
from fairseq_tying.core.models.tying import TYING_MODES
from fairseq_tying.core.output_layers import BASELINE, OUTPUT_LAYERS
from fairseq_tying.launch import cost
from fairseq_tying.studies.statistics.stats import detectable, seeds_for_equivalence
from fairseq_tying.studies.statistics.verdicts import ALPHA, MARGIN
from fairseq_tying.sweeps.config import Run, Sweep, SweepError, load_sweep
from fairseq_tying.sweeps.plateau import Plateau, stop_epoch

FAMILIES = {"transformer": "transformer_twwt", "dynamicconv": "dynamicconv_twwt"}
TIED = "three_way"  # the tying mode every output layer is compared under
# model sizes: a smoke test's, the studies' small model, and fairseq's transformer_iwslt_de_en
MODELS = {
    "tiny": {"layers": 1, "embed_dim": 16, "ffn_embed_dim": 32, "attention_heads": 2,
             "dropout": 0.1, "lr": 0.005, "warmup_updates": 5, "max_tokens": 400},
    "small": {"layers": 2, "embed_dim": 128, "ffn_embed_dim": 512, "attention_heads": 4,
              "dropout": 0.1, "lr": 0.003, "warmup_updates": 200, "max_tokens": 4096},
    "iwslt": {"layers": 6, "embed_dim": 512, "ffn_embed_dim": 1024, "attention_heads": 4,
              "dropout": 0.3, "lr": 0.0005, "warmup_updates": 4000, "max_tokens": 4096},
}
PILOT = {"patience": 3, "min_gain": 0.005}  # the converged study's plateau rule
# the flags that override a preset's size: (flag, its key in MODELS)
SIZE_FLAGS = (("embed_dim", "embed_dim"), ("ffn_dim", "ffn_embed_dim"), ("layers", "layers"),
              ("heads", "attention_heads"), ("max_tokens", "max_tokens"))


class NewSweepError(ValueError):
    """A bad option of new-sweep; the message names the flag and the fix."""


Z_LOSS_TAG = "zloss"  # the tag of the --z-loss block: its cell is "dot+zloss"


def grid_blocks(families: list[str], tyings: list[str], layers: list[str],
                seeds: list[int], z_loss: float | None = None) -> list[dict]:
    """The grid: per family, the tying table with ``dot``, three-way tying with each other
    layer and, with ``z_loss``, three-way ``dot`` with the z-loss, in that priority order."""
    blocks = []
    for family in families:
        arch = FAMILIES[family]
        if BASELINE in layers:
            blocks.append({"arch": arch, "tying": tyings, "output_layer": [BASELINE]})
        others = [la for la in layers if la != BASELINE]
        if others:
            blocks.append({"arch": arch, "tying": [TIED], "output_layer": others})
        if z_loss is not None:
            blocks.append({"arch": arch, "tying": [TIED], "output_layer": [BASELINE],
                           "tag": Z_LOSS_TAG, "flags": f"{{z_loss: {z_loss:g}}}"})
    return [dict(b, seed=seeds) for b in blocks]


def _flow(values: list) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def model_of(args: argparse.Namespace) -> dict:
    """The ``--model`` preset with the sizes given on the command line; a new width keeps the
    preset's ratio of feed-forward to width unless ``--ffn-dim`` is given."""
    model = dict(MODELS[args.model])
    if args.embed_dim is not None and args.ffn_dim is None:
        ratio = model["ffn_embed_dim"] // model["embed_dim"]
        model["ffn_embed_dim"] = ratio * args.embed_dim
    for flag, key in SIZE_FLAGS:
        if getattr(args, flag) is not None:
            model[key] = getattr(args, flag)
    return model


def model_line(args: argparse.Namespace, model: dict) -> str:
    """``--model small, --embed-dim 256: 2+2 layers, width 256, feed-forward 1024, 4 heads,
    4096 tokens a batch``, for the file's header."""
    given = "".join(f", --{flag.replace('_', '-')} {getattr(args, flag)}"
                    for flag, _ in SIZE_FLAGS if getattr(args, flag) is not None)
    return (f"--model {args.model}{given}: {model['layers']}+{model['layers']} layers, width "
            f"{model['embed_dim']}, feed-forward {model['ffn_embed_dim']}, "
            f"{model['attention_heads']} heads, {model['max_tokens']} tokens a batch")


def render(args: argparse.Namespace, prep: dict) -> str:
    """The sweep file's text."""
    model = model_of(args)
    dataset = args.dataset
    blocks = grid_blocks(args.families, args.tying, args.output_layers,
                         args.seeds[:1] if args.pilot else args.seeds, args.z_loss)
    continued = ""
    if args.pilot:
        stopping = (f"stopping:                 # the pilot: until the validation NLL flattens\n"
                    f"  patience: {PILOT['patience']}\n  min_gain: {PILOT['min_gain']}\n"
                    f"  min_epoch: {args.average_last}\n  max_epoch: {args.max_epochs}\n")
        what = ("The pilot: the first seed of every cell, each until its validation NLL "
                "flattens; the latest\n# epoch they stop at is the sweep's budget "
                "(new-sweep --budget-from THIS_FILE).")
    else:
        stopping = (f"stopping:                 # equal training: exactly max_epoch epochs\n"
                    f"  max_epoch: {args.epochs}\n  plateau: false\n")
        what = (f"Equal training: every run {args.epochs} epochs, scored as the average of "
                f"its last {args.average_last} epoch\n# checkpoints.")
        if args.budget_from is not None:
            what += (f"\n# The budget is the latest stop epoch of the pilot {args.budget_from}"
                     f" ({args.pilot_stops});\n# its runs go on from the pilot's checkpoints.")
            continued = f"continue_from: {args.pilot_dir}\n"
    grid = "\n".join(
        f"  - {{dataset: [{dataset}], arch: [{b['arch']}], tying: {_flow(b['tying'])}, "
        f"output_layer: {_flow(b['output_layer'])}, seed: {_flow(b['seed'])}, "
        + "".join(f"{k}: {b[k]}, " for k in ("tag", "flags") if k in b)
        + f"priority: {i + 1}}}" for i, b in enumerate(blocks))
    gpus = args.gpus
    resources = (f"  nodes: 1\n  gpus_per_node: {gpus}\n  tasks_per_node: {gpus}\n"
                 f"  cpus_per_task: 8\n  mem_gb: 32\n  time: \"24:00:00\"\n") if gpus else \
        "  nodes: 1\n  gpus_per_node: 0\n  tasks_per_node: 1\n  cpus_per_task: 1\n" \
        "  mem_gb: 4\n  time: \"24:00:00\"\n"
    batch = f"  max_tokens: {model['max_tokens']}\n  update_freq: 1\n" + \
        ("  fp16: true\n" if gpus else "")
    src, tgt = prep["src"], prep["tgt"]
    dims = "".join(f"  {side}_{k}: {model[k]}\n" for side in ("encoder", "decoder")
                   for k in ("layers", "embed_dim", "ffn_embed_dim", "attention_heads"))
    return f"""# {args.name}: tying and output layer on {dataset} ({src}->{tgt}); written by
#   python -m fairseq_tying.launch new-sweep {' '.join(args.argv)}
# {what}
# Model:   {model_line(args, model)}
# Train:   python -m fairseq_tying.launch THIS_FILE --local --workers {args.workers or 'N'}
#          (on SLURM: no --local)
# Answer:  python -m fairseq_tying.studies answer THIS_FILE
name: {args.name}
output_dir: {args.output_dir}
datasets:
  {dataset}: {args.data}
grid:
{grid}
{stopping}{continued}fairseq:
  task: translation
  source_lang: {src}
  target_lang: {tgt}
{dims}  dropout: {model['dropout']}
  criterion: label_smoothed_cross_entropy_pr
  label_smoothing: 0.1
  optimizer: adam
  adam_betas: "(0.9, 0.98)"
  clip_norm: 1.0
  lr: {args.lr or model['lr']}
  lr_scheduler: inverse_sqrt
  warmup_updates: {model['warmup_updates']}
  best_checkpoint_metric: nll_loss  # checkpoint_best.pt and the pilot's plateau rule follow it
  keep_last_epochs: {args.average_last}               # the epoch checkpoints that are averaged
  update_epoch_batch_itr: "True"    # a run resumed at an epoch boundary trains as one that was not
  required_batch_size_multiple: 1
  num_workers: 0
  log_format: json                  # the answer reads the parameter count and validation lines
  log_interval: 100
batch:
{batch}resources:
{resources}evaluation:
  # fixed before training: the average of the last {args.average_last} epoch checkpoints is the
  # run's score, the best single checkpoint is recorded beside it (beam 5, length penalty 1)
  args: [--average-last, "{args.average_last}", --preset, transformer_iwslt]
  also:
    best: [--checkpoint, checkpoint_best.pt, --preset, transformer_iwslt]
  time: 60
"""


def check_model(args: argparse.Namespace) -> None:
    """Refuse sizes fairseq cannot build: a count below one, a width the heads do not divide."""
    for flag in ("embed_dim", "ffn_dim", "layers", "heads", "max_tokens"):
        if (value := getattr(args, flag)) is not None and value < 1:
            raise NewSweepError(f"--{flag.replace('_', '-')} {value}: at least 1")
    model = model_of(args)
    width, heads = model["embed_dim"], model["attention_heads"]
    if width % heads:
        fits = [h for h in range(1, min(width, 16) + 1) if width % h == 0]
        given = " ".join(f"--{f.replace('_', '-')} {getattr(args, f)}"
                         for f in ("embed_dim", "heads") if getattr(args, f) is not None)
        raise NewSweepError(f"{given}: a width of {width} does not split into {heads} "
                            f"attention heads (--model {args.model} has "
                            f"{MODELS[args.model]['attention_heads']}); give --heads dividing "
                            f"it ({', '.join(map(str, fits))}) or a width that {heads} divides")


def read_prep(data: Path) -> dict:
    """The data dir's prep.json (a translation pair), or a NewSweepError saying how to make
    one."""
    path = data / "prep.json"
    if not path.is_file():
        raise NewSweepError(f"--data {data}: no prep.json; prepare it first: python -m "
                            "fairseq_tying.data.prepare --corpus DIR --src SRC --tgt TGT "
                            f"--vocab-size 8000 --out {data}")
    prep = json.loads(path.read_text())
    if not prep.get("src") or not prep.get("tgt"):
        raise NewSweepError(f"--data {data}: a language-model data dir; the sweep compares "
                            "translation models (prepare with --src and --tgt)")
    return prep


def check(args: argparse.Namespace) -> None:
    """Refuse contradictory options before anything is written."""
    budgets = sum([args.pilot, args.epochs is not None, args.budget_from is not None])
    if budgets != 1:
        raise NewSweepError("give one of --pilot (train every cell until it flattens), "
                            "--budget-from PILOT.yaml (the finished pilot's budget) or "
                            "--epochs E (a budget of your own)")
    if args.lr is not None and not args.lr > 0:
        raise NewSweepError(f"--lr {args.lr}: a learning rate is positive")
    if args.z_loss is not None and not args.z_loss > 0:
        raise NewSweepError(f"--z-loss {args.z_loss:g}: λ is positive (PaLM's: 1e-4)")
    check_model(args)
    if args.workers is not None and args.workers < 1:
        raise NewSweepError(f"--workers {args.workers}: at least 1")
    if args.sample_seconds <= 0:
        raise NewSweepError(f"--sample-seconds {args.sample_seconds:g}: a positive time (or "
                            "--no-estimate)")
    if args.epochs is not None and args.epochs < args.average_last:
        raise NewSweepError(f"--epochs {args.epochs}: fewer than --average-last "
                            f"{args.average_last} epoch checkpoints to average")
    if args.max_epochs < args.average_last:
        raise NewSweepError(f"--max-epochs {args.max_epochs}: below --average-last")
    if not args.pilot and TIED not in args.tying and set(args.output_layers) - {BASELINE}:
        raise NewSweepError(f"--output-layers are compared under --tying {TIED}: add it to "
                            "--tying or keep --output-layers dot")
    for flag in ("tying", "output_layers", "seeds", "families"):
        values = getattr(args, flag)
        if len(set(values)) != len(values):
            raise NewSweepError(f"--{flag.replace('_', '-')} {' '.join(map(str, values))}: a "
                                "value twice")
    if args.out.exists() and not args.force:
        raise NewSweepError(f"--out {args.out} exists; give another file or --force")


def _cell(run: Run) -> tuple[str, str, str]:
    """A pilot run's cell: family, tying and output layer (with its tag, e.g. "dot+zloss")."""
    ident = run.identity
    return ident.arch, ident.tying, ident.cell_layer()


def read_pilot(args: argparse.Namespace) -> None:
    """Set ``args.epochs`` to the latest stop epoch of the pilot ``args.budget_from`` (every
    run finished, one for each cell of this sweep), and the pilot's runs to continue from."""
    try:
        pilot = load_sweep(args.budget_from, check_data=False)
    except SweepError as err:
        raise NewSweepError(f"--budget-from {args.budget_from}: {err}") from err
    cells = {(FAMILIES[f], t, BASELINE) for f in args.families for t in args.tying}
    cells |= {(FAMILIES[f], TIED, la) for f in args.families for la in args.output_layers
              if la != BASELINE}
    if args.z_loss is not None:
        cells |= {(FAMILIES[f], TIED, f"{BASELINE}+{Z_LOSS_TAG}") for f in args.families}
    # a tagged run is a cell of its own (--z-loss's, or a block added by hand: no cell here)
    plain = [r for r in pilot.runs if not r.identity.tag or r.identity.tag == Z_LOSS_TAG]
    piloted = {_cell(r) for r in plain}
    if missing := sorted(cells - piloted, key=str):
        raise NewSweepError(f"--budget-from {args.budget_from}: no pilot run of "
                            + ", ".join("/".join(c) for c in missing) + "; the budget is the "
                            "latest of every cell's plateau (write the pilot with the same "
                            "--tying, --output-layers and --families)")
    stops = {r.name: stop_epoch(r) for r in plain if _cell(r) in cells}
    if unfinished := [name for name, epoch in stops.items() if epoch is None]:
        raise NewSweepError(f"--budget-from {args.budget_from}: not finished: "
                            + ", ".join(unfinished) + f"; train it first: python -m "
                            f"fairseq_tying.launch {args.budget_from} --local")
    args.epochs = max(stops.values())
    args.pilot_epochs = stops
    args.pilot_dir = pilot.output_dir
    args.pilot_stops = ", ".join(f"{name.split('.', 2)[-1]} {epoch}"
                                 for name, epoch in stops.items())
    if args.epochs < args.average_last:
        raise NewSweepError(f"--budget-from {args.budget_from}: its budget {args.epochs} is "
                            f"below --average-last {args.average_last}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.launch new-sweep",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True,
                   help="a data dir of python -m fairseq_tying.data.prepare (a pair)")
    p.add_argument("--out", type=Path, required=True, help="the sweep file to write (YAML)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--epochs", type=int, help="every run's epoch budget")
    budget.add_argument("--pilot", action="store_true",
                        help="the first seed of every cell, each until its validation NLL "
                        "flattens")
    budget.add_argument("--budget-from", type=Path, metavar="PILOT.yaml",
                        help="the budget: the latest stop epoch of this finished pilot, whose "
                        "runs go on from their checkpoints")
    p.add_argument("--max-epochs", type=int, default=100,
                   help="--pilot: stop a run there if it has not flattened (default 100)")
    p.add_argument("--name", help="the sweep's name (default: --out's stem)")
    p.add_argument("--dataset", help="the dataset's name in run names (default: --data's name)")
    p.add_argument("--output-dir", help="the run folders (default: runs/NAME)")
    p.add_argument("--families", nargs="+", choices=list(FAMILIES), default=["transformer"])
    p.add_argument("--tying", nargs="+", choices=TYING_MODES, default=list(TYING_MODES),
                   help="the tying table (with dot); the first is the baseline")
    p.add_argument("--output-layers", nargs="+", choices=OUTPUT_LAYERS,
                   default=list(OUTPUT_LAYERS), help=f"compared under {TIED} tying")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--z-loss", type=float, metavar="λ",
                   help="also three-way dot trained with the z-loss λ·(log Z)² (PaLM: 1e-4), "
                   f"a block tagged {Z_LOSS_TAG}, answered against dot")
    p.add_argument("--average-last", type=int, default=5,
                   help="epoch checkpoints averaged into the scored model (default 5)")
    p.add_argument("--model", choices=list(MODELS), default="small",
                   help="tiny: 1+1 layers of width 16, 400 tokens a batch (a smoke test of "
                   "the whole path, fast; its scores answer nothing); small: 2+2 layers of "
                   "128 (the studies', default); iwslt: fairseq's transformer_iwslt_de_en "
                   "sizes (6+6 layers of 512)")
    size = p.add_argument_group("the model's size (each overrides the --model preset's)")
    size.add_argument("--embed-dim", type=int, metavar="D",
                      help="the width: embeddings and hidden states, encoder and decoder")
    size.add_argument("--ffn-dim", type=int, metavar="F",
                      help="the feed-forward layers' width (default: --embed-dim times the "
                      "preset's ratio: 2 for tiny and iwslt, 4 for small)")
    size.add_argument("--layers", type=int, metavar="L", help="encoder and decoder layers each")
    size.add_argument("--heads", type=int, metavar="H",
                      help="attention heads; they must divide the width")
    size.add_argument("--max-tokens", type=int, metavar="T",
                      help="tokens in a batch (an update: update_freq 1)")
    p.add_argument("--lr", type=float,
                   help="the peak learning rate (default: the --model's, e.g. 0.003 for small)")
    p.add_argument("--gpus", type=int, default=0,
                   help="GPUs per run (fp16 on SLURM); 0: a CPU run (default)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    est = p.add_argument_group("the cost estimate (printed once the file is written)")
    est.add_argument("--no-estimate", action="store_true",
                     help="skip the timed sample of training and its estimate")
    est.add_argument("--sample-seconds", type=float, default=5, metavar="S",
                     help="seconds of updates timed after the warm-up (default 5; at least 5 "
                     "updates, whatever their time)")
    est.add_argument("--workers", type=int, metavar="N",
                     help="runs you will train side by side (launch --local --workers N): the "
                     "sweep's time divides by them, if this machine has a core for each "
                     "(default 1; written into the file's command)")
    return p


# The spread of a claim's per-seed BLEU differences: the median standard deviation over the
# claims of the equal-training study (docs/equal/summary.json; a test recomputes it)
TYPICAL_SD = 0.26


def what_seeds_show(seeds: int, sd: float = TYPICAL_SD) -> str:
    """What ``seeds`` seeds of each cell can show if a claim's per-seed differences spread as
    the committed studies' did."""
    need = seeds_for_equivalence(sd, MARGIN, ALPHA)
    return (f"What {seeds} seed{'s' * (seeds != 1)} can show, if a claim's per-seed differences "
            f"spread as in the equal-training study (sd {sd:.2f} BLEU, its median): a Δ of "
            f"±{detectable(sd, seeds, ALPHA):.2f} BLEU or more is shown 8 times in 10 (the "
            f"t-test over seeds at α = {ALPHA}, before Holm), and equivalence within ±{MARGIN:g} "
            f"needs {need} seeds; more seeds: --seeds.")


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv
    args.name = args.name or args.out.stem
    args.dataset = args.dataset or args.data.name
    args.output_dir = args.output_dir or f"runs/{args.name}"
    try:
        check(args)
        prep = read_prep(args.data)
        if args.budget_from is not None:
            read_pilot(args)
    except NewSweepError as err:
        print(f"error: new-sweep: {err}", file=sys.stderr)
        return 2
    write_text(args.out, render(args, prep))
    print(f"wrote {args.out}; train: python -m fairseq_tying.launch {args.out} --local"
          + (f" --workers {args.workers}" if args.workers else ""), flush=True)
    if not args.pilot:
        print(what_seeds_show(len(args.seeds)), flush=True)
    if args.no_estimate:
        return 0
    return estimate(args)


def run_epochs(args: argparse.Namespace, sweep: Sweep) -> list[tuple[str, int, int]]:
    """Each run's architecture and (fewest, most) epochs to train: a pilot's from the plateau
    rule's earliest stop to its cap; a budget's less the epochs a pilot run it goes on from has
    trained."""
    if args.pilot:
        return [(r.identity.arch, Plateau(**r.stopping).earliest_stop, args.max_epochs)
                for r in sweep.runs]
    done = getattr(args, "pilot_epochs", {})
    return [(r.identity.arch, *(args.epochs - done.get(r.name, 0),) * 2) for r in sweep.runs]


def estimate(args: argparse.Namespace) -> int:
    """Time a sample of the first run of each architecture of the written sweep and print
    what the sweep costs."""
    try:
        sweep = load_sweep(args.out)  # the data checked now: the sample trains on it
    except SweepError as err:
        print(f"error: new-sweep: {args.out} is written, but its runs cannot train: {err}",
              file=sys.stderr)
        return 1
    if sweep.resources.gpu and not torch.cuda.is_available():
        print(f"no estimate: --gpus {args.gpus} runs train on GPUs and this machine has none "
              "to time them on; run new-sweep where they will train (or give --no-estimate)")
        return 0
    firsts: dict[str, Run] = {}
    for run in sweep.runs:
        firsts.setdefault(run.identity.arch, run)
    busy = cost.machine()
    try:
        samples = {arch: cost.time_sample(run, args.sample_seconds)
                   for arch, run in firsts.items()}
    except cost.CostError as err:
        print(f"error: new-sweep: {args.out} is written, but {err}\n(--no-estimate skips the "
              "sample)", file=sys.stderr)
        return 1
    print(cost.report(samples, run_epochs(args, sweep), sweep.resources.world_size,
                      args.workers or 1, args.sample_seconds, busy))
    return 0
