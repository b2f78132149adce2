"""Shared fixtures: a tiny generated parallel corpus binarized with the real fairseq-preprocess."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from fairseq_tying.common import PLUGIN_DIR

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY_MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--dropout", "0",
]
TINY_LM = ["--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
           "--decoder-input-dim", "16", "--decoder-output-dim", "16",  # stock says 512
           "--decoder-attention-heads", "2", "--tokens-per-sample", "32"]
LM_TRAIN = ["--task", "language_modeling", "--user-dir", PLUGIN_DIR, *TINY_LM, "--cpu",
            "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "512", "--max-update", "30",
            "--required-batch-size-multiple", "1",  # fairseq drops batches of < 8 blocks
            "--seed", "1", "--no-epoch-checkpoints", "--no-progress-bar", "--log-format", "simple"]


def cli_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def run_cli(tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one of fairseq's console scripts from this environment; output captured."""
    proc = subprocess.run([str(BIN / tool), *args], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def run_module(module: str, *args: str | os.PathLike, check: bool = True,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m MODULE ARGS`` (one of the package's tools, as a user runs it) from this
    environment; output captured."""
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env=cli_env(), cwd=REPO, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def generate(data: Path, ckpt: Path, *flags: str) -> dict[int, str]:
    """fairseq-generate's hypotheses ``{sentence id: text}`` for a plugin checkpoint, batches of
    8 (the last one too: fairseq otherwise drops a short last batch)."""
    proc = run_cli("fairseq-generate", str(data), "--user-dir", PLUGIN_DIR, "--path", str(ckpt),
                   "--batch-size", "8", "--required-batch-size-multiple", "1", "--cpu", *flags)
    return {int(i): h for i, h in re.findall(r"^H-(\d+)\t\S+\t(.*)$", proc.stdout, re.M)}


def write_corpus(folder: Path, seed: int = 0) -> None:
    """A toy 'translation' task: the target is the reversed, upper-cased source."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]
    for split, n in (("train", 300), ("valid", 20), ("test", 20)):
        sents = [[rng.choice(words) for _ in range(rng.randint(3, 9))] for _ in range(n)]
        (folder / f"{split}.src").write_text("".join(" ".join(s) + "\n" for s in sents))
        (folder / f"{split}.tgt").write_text(
            "".join(" ".join(reversed(s)).upper() + "\n" for s in sents))


def binarize(folder: Path, dest: Path, joined: bool) -> Path:
    run_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
            "--trainpref", str(folder / "train"), "--validpref", str(folder / "valid"),
            "--testpref", str(folder / "test"), "--destdir", str(dest), "--workers", "1",
            *(["--joined-dictionary"] if joined else []))
    return dest


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder)
    return folder


@pytest.fixture(scope="session")
def joined_bin(tiny_corpus, tmp_path_factory) -> Path:
    return binarize(tiny_corpus, tmp_path_factory.mktemp("joined") / "bin", joined=True)


@pytest.fixture(scope="session")
def separate_bin(tiny_corpus, tmp_path_factory) -> Path:
    return binarize(tiny_corpus, tmp_path_factory.mktemp("separate") / "bin", joined=False)


def binarize_lm(folder: Path, side: str, dest: Path) -> Path:
    """``fairseq-preprocess --only-source`` of FOLDER/{train,valid,test}.SIDE."""
    splits = [arg for split in ("train", "valid", "test")
              for arg in (f"--{split}pref", str(folder / f"{split}.{side}"))]
    run_cli("fairseq-preprocess", "--only-source", *splits, "--destdir", str(dest),
            "--workers", "1")
    return dest


@pytest.fixture(scope="session")
def lm_bin(tiny_corpus, tmp_path_factory) -> Path:
    """The toy corpus's target side as a language-modelling set."""
    return binarize_lm(tiny_corpus, "tgt", tmp_path_factory.mktemp("lm") / "bin")


@pytest.fixture(scope="session")
def trained_lms(lm_bin, tmp_path_factory):
    """``get(output_layer, *flags)``: the checkpoint of one short fairseq-train run of a tiny
    ``transformer_lm_tied`` (cached per session, shared by the LM test modules)."""
    cache: dict[tuple[str, ...], Path] = {}

    def get(output_layer: str, *flags: str) -> Path:
        key = (output_layer, *flags)
        if key not in cache:
            save = tmp_path_factory.mktemp(f"lm-{output_layer}")
            run_cli("fairseq-train", str(lm_bin), "--arch", "transformer_lm_tied",
                    "--output-layer", output_layer, "--save-dir", str(save), *LM_TRAIN,
                    *flags)  # last: they override LM_TRAIN's sizes
            cache[key] = save / "checkpoint_last.pt"
        return cache[key]

    return get


def build_model(data: Path, arch: str, *flags: str):
    """Parse flags with fairseq's own training parser and build the model in-process."""
    from fairseq import options, tasks

    import fairseq_tying  # noqa: F401  (registration)

    parser = options.get_training_parser()
    args: Namespace = options.parse_args_and_arch(
        parser, [str(data), "--arch", arch, "--user-dir", PLUGIN_DIR, *TINY_MODEL, *flags])
    task = tasks.setup_task(args)
    return task.build_model(args), task


def build_on_meta(data: Path, arch: str, *flags: str) -> tuple:
    """(task, model config as fairseq-train saves it, model) for exactly these flags, built on
    the meta device: the shapes of any preset, the big ones too, without their memory."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--arch", arch, "--user-dir", PLUGIN_DIR, *flags])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    with torch.device("meta"):
        return task, cfg.model, task.build_model(cfg.model)


def decode_full_and_incremental(model, task) -> tuple:
    """(encoder output, random target prefixes, the decoder's scores in one full pass, the same
    scores step by step through fairseq's incremental state) for a translation model in eval
    mode: the two must agree, since fairseq-generate decodes incrementally."""
    import torch

    d = task.target_dictionary
    src = torch.randint(d.nspecial, len(d), (2, 6))
    prev = torch.cat([torch.full((2, 1), d.eos()), torch.randint(d.nspecial, len(d), (2, 4))], 1)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.tensor([6, 6]))
        full, _ = model.decoder(prev, encoder_out=enc)
        state: dict = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
                 for t in range(prev.shape[1])]
    return enc, prev, full, torch.cat(steps, 1)
