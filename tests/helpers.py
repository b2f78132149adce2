"""Helpers shared by the test modules: running the CLIs, tiny corpora and models, sweeps and the
SLURM queries. Fixtures live in the conftest files; whatever a test imports comes from here."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from argparse import Namespace
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import yaml
from filelock import FileLock

from fairseq_tying.common import PLUGIN_DIR
from tests import forkserver

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tiny_transformer(dim: int) -> list[str]:
    """The flags of a one-layer Transformer of width ``dim`` (2·dim feed-forward, 2 heads)."""
    return ["--encoder-layers", "1", "--decoder-layers", "1",
            "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
            "--encoder-ffn-embed-dim", str(2 * dim), "--decoder-ffn-embed-dim", str(2 * dim),
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


TINY_MODEL = [*tiny_transformer(16), "--dropout", "0"]
TINY_LM = ["--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
           "--decoder-input-dim", "16", "--decoder-output-dim", "16",  # stock says 512
           "--decoder-attention-heads", "2", "--tokens-per-sample", "32"]
LM_TRAIN = ["--task", "language_modeling", "--user-dir", PLUGIN_DIR, *TINY_LM, "--cpu",
            "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "512", "--max-update", "30",
            "--required-batch-size-multiple", "1",  # fairseq drops batches of < 8 blocks
            "--seed", "1", "--no-epoch-checkpoints", "--no-progress-bar", "--log-format", "simple"]


# ---- running the CLIs -----------------------------------------------------------------------


def load_script(name: str):
    """``scripts/NAME.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cli_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _run(argv: list[str], name: str, check: bool, env: dict[str, str] | None,
         timeout: float | None, input: str | None) -> subprocess.CompletedProcess:
    proc = forkserver.run(argv, cli_env() if env is None else env, REPO, timeout, input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def run_cli(tool: str, *args: str | os.PathLike, check: bool = True,
            input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run one of fairseq's console scripts from this environment (``cli_env()`` unless ENV;
    INPUT on its stdin); output captured."""
    if tool == "fairseq-train" and "--save-dir" not in args:
        # fairseq probes --save-dir even with --no-save, writing and removing checkpoints/dummy
        # in the working directory, which every test worker shares: a race between workers
        raise AssertionError("a test runs fairseq-train with --save-dir in its own tmp_path")
    return _run([str(BIN / tool), *map(str, args)], tool, check, env, None, input)


def run_module(module: str, *args: str | os.PathLike, check: bool = True,
               timeout: float | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m MODULE ARGS`` (one of the package's tools, as a user runs it) from this
    environment (``cli_env()`` unless ENV); output captured."""
    return _run([sys.executable, "-m", module, *map(str, args)], module, check, env, timeout,
                None)


def generate(data: Path, ckpt: Path, *flags: str) -> dict[int, str]:
    """fairseq-generate's hypotheses ``{sentence id: text}`` for a plugin checkpoint, batches of
    8 (the last one too: fairseq otherwise drops a short last batch)."""
    proc = run_cli("fairseq-generate", str(data), "--user-dir", PLUGIN_DIR, "--path", str(ckpt),
                   "--batch-size", "8", "--required-batch-size-multiple", "1", "--cpu", *flags)
    return {int(i): h for i, h in re.findall(r"^H-(\d+)\t\S+\t(.*)$", proc.stdout, re.M)}


def last_updates(log: str) -> int:
    return int(re.findall(r"num_updates (\d+)", log)[-1])


# ---- built once per test run ----------------------------------------------------------------


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder NAME, filled by ``build(folder)`` once per test run. Under pytest-xdist the
    workers of one run share it: the first builds it under a file lock, the others wait for it
    and reuse it (a build that failed is started again)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder, done = root / name, root / f"{name}.done"
    with FileLock(root / f"{name}.lock"):
        if not done.exists():
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            build(folder)
            done.touch()
    return folder


# ---- tiny corpora ---------------------------------------------------------------------------


def write_corpus(folder: Path, seed: int = 0) -> None:
    """A toy 'translation' task: the target is the reversed, upper-cased source."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]
    for split, n in (("train", 300), ("valid", 20), ("test", 20)):
        sents = [[rng.choice(words) for _ in range(rng.randint(3, 9))] for _ in range(n)]
        (folder / f"{split}.src").write_text("".join(" ".join(s) + "\n" for s in sents))
        (folder / f"{split}.tgt").write_text(
            "".join(" ".join(reversed(s)).upper() + "\n" for s in sents))


def binarize(folder: Path, dest: Path, joined: bool, src: str = "src", tgt: str = "tgt") -> Path:
    """``fairseq-preprocess`` of FOLDER/{train,valid,test}.{SRC,TGT} into DEST."""
    run_cli("fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
            "--trainpref", str(folder / "train"), "--validpref", str(folder / "valid"),
            "--testpref", str(folder / "test"), "--destdir", str(dest), "--workers", "1",
            *(["--joined-dictionary"] if joined else []))
    return dest


def binarize_lm(folder: Path, side: str, dest: Path) -> Path:
    """``fairseq-preprocess --only-source`` of FOLDER/{train,valid,test}.SIDE."""
    splits = [arg for split in ("train", "valid", "test")
              for arg in (f"--{split}pref", str(folder / f"{split}.{side}"))]
    run_cli("fairseq-preprocess", "--only-source", *splits, "--destdir", str(dest),
            "--workers", "1")
    return dest


SIZES = {"train": 1500, "valid": 60, "test": 40}  # the tiny data dirs of the sweeps


def write_parallel(raw: Path, sizes: dict[str, int], seed: int, words: tuple[list[str], list[str]],
                   lengths: tuple[int, int] = (3, 7),
                   sentence: Callable[[list[str]], str] = " ".join) -> None:
    """``raw/{split}.es`` and ``raw/{split}.en``: ``sizes[split]`` sentences of ``lengths``
    words, the English the word-for-word translation of the Spanish (``words``: the two
    vocabularies, the i-th of each a pair), each written by ``sentence``."""
    rng = random.Random(seed)
    raw.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        src_lines, tgt_lines = [], []
        for _ in range(n):
            ids = [rng.randrange(len(words[0])) for _ in range(rng.randint(*lengths))]
            src_lines.append(sentence([words[0][i] for i in ids]))
            tgt_lines.append(sentence([words[1][i] for i in ids]))
        (raw / f"{split}.es").write_text("\n".join(src_lines) + "\n")
        (raw / f"{split}.en").write_text("\n".join(tgt_lines) + "\n")


def build_tiny_data(root: Path, seed: int = 0) -> Path:
    """``root/raw``, ``root/bin`` and ``root/prep.json``: a synthetic Es->En corpus in the
    project's data-dir layout, word-level, a word-for-word mapping."""
    words = ([f"pal{i}" for i in range(24)], [f"word{i}" for i in range(24)])
    write_parallel(root / "raw", SIZES, seed, words)
    binarize(root / "raw", root / "bin", joined=True, src="es", tgt="en")
    prep = {"corpus": "synthetic", "src": "es", "tgt": "en", "subword": "subword_nmt",
            "post_process": "subword_nmt", "detokenizer": None, "vocab_size": 48}
    (root / "prep.json").write_text(json.dumps(prep, indent=1) + "\n")
    return root


SPM_SIZES = {"train": 400, "valid": 20, "test": 30}  # 30: not a multiple of a batch size
SPM_WORDS = ("el la casa perro gato come bebe agua pan grande pequeño rojo azul verde corre y "
             "no".split(), "the the house dog cat eats drinks water bread big small red blue "
             "green runs and not".split())


def build_tiny_spm_data(root: Path) -> Path:
    """A data dir as ``python -m fairseq_tying.data.prepare`` leaves one: ``raw/`` (sentences
    of a Spanish-English toy language, capitalized and ending in a full stop), a
    sentencepiece model of 60 pieces, ``sp/`` (the pieces), ``bin/`` and ``prep.json``."""
    import sentencepiece as spm  # the sentencepiece tests only

    write_parallel(root / "raw", SPM_SIZES, 0, SPM_WORDS, (3, 8),
                   lambda words: " ".join(words).capitalize() + ".")
    spm.SentencePieceTrainer.train(
        input=[str(root / "raw/train.es"), str(root / "raw/train.en")],
        model_prefix=str(root / "spm"), vocab_size=60, character_coverage=1.0,
        model_type="unigram", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    (root / "sp").mkdir()
    for split in SPM_SIZES:
        for lang in ("es", "en"):
            lines = (root / "raw" / f"{split}.{lang}").read_text().splitlines()
            (root / "sp" / f"{split}.{lang}").write_text(
                "".join(" ".join(sp.encode(x, out_type=str)) + "\n" for x in lines))
    binarize(root / "sp", root / "bin", joined=True, src="es", tgt="en")
    (root / "prep.json").write_text(json.dumps({
        "corpus": "toy", "src": "es", "tgt": "en", "subword": "sentencepiece",
        "post_process": "sentencepiece", "detokenizer": None, "vocab_size": 60}))
    return root


def build_tiny_lm_data(root: Path, seed: int = 0) -> Path:
    """``root/raw``, ``root/bin`` (``fairseq-preprocess --only-source``) and ``root/prep.json``
    of a toy language-modelling set: sentences of a 24-word language with a fixed word order
    (each word mostly followed by the next), so that a model can lower its perplexity."""
    rng = random.Random(seed)
    words = [f"word{i}" for i in range(24)]
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, n in SIZES.items():
        lines = []
        for _ in range(n):
            i = rng.randrange(len(words))
            ids = [(i + k + (rng.random() < 0.2)) % len(words) for k in range(rng.randint(3, 7))]
            lines.append(" ".join(words[j] for j in ids))
        (raw / f"{split}.en").write_text("\n".join(lines) + "\n")
    binarize_lm(raw, "en", root / "bin")
    prep = {"task": "language_modeling", "corpus": "synthetic", "lang": "en", "subword": "word",
            "post_process": None}
    (root / "prep.json").write_text(json.dumps(prep, indent=1) + "\n")
    return root


# ---- tiny models ----------------------------------------------------------------------------


def arch_name(family: str, tying: str) -> str:
    """The plugin arch of a family (transformer, dynamicconv) whose default is this tying."""
    return f"{family}_{'twwt' if tying == 'three_way' else 'dwt'}"


def train_args(data: Path, save_dir: Path, arch: str, *flags: str, updates: int = 4) -> list[str]:
    """fairseq-train's arguments for a few updates of a tiny model."""
    return [str(data), "--user-dir", "fairseq_tying", "--arch", arch, *TINY_MODEL,
            "--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1",
            "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "600",
            "--max-update", str(updates), "--save-dir", str(save_dir), "--cpu", "--seed", "3",
            "--no-progress-bar", "--log-interval", "1", "--no-epoch-checkpoints", *flags]


def fairseq_train(data: Path, save_dir: Path, arch: str, *flags: str,
                  env: dict[str, str] | None = None) -> Path:
    """fairseq-train of the plugin's ``arch`` on the CPU, ``data`` a fairseq-preprocess folder;
    its ``checkpoint_last.pt`` (``env``: as ``run_cli``'s)."""
    run_cli("fairseq-train", str(data), "--user-dir", "fairseq_tying", "--arch", arch, *flags,
            "--save-dir", str(save_dir), "--cpu", "--no-progress-bar", env=env)
    return save_dir / "checkpoint_last.pt"


def train_checkpoint(data: Path, save_dir: Path, arch: str, tying: str, output_layer: str,
                     projection: bool, updates: int = 25, extra: tuple[str, ...] = (),
                     env: dict[str, str] | None = None) -> Path:
    """``checkpoint_last.pt`` of a tiny model trained through fairseq-train (the exports' and
    CTranslate2's tests start from it; ``env``: its environment, ``cli_env()`` if None)."""
    return fairseq_train(
        data, save_dir, arch, *TINY_MODEL, *extra, "--tying", tying, "--output-layer",
        output_layer, *(["--tied-projection"] if projection else []),
        "--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "600",
        "--max-update", str(updates), "--seed", "2", "--no-epoch-checkpoints",
        "--no-save-optimizer-state", env=env)


# The decoding settings of the export and serving comparisons, by fairseq-generate's flag names
# (translate and bench --mode serve take the same flags; the CTranslate2 tests pass them through
# the package's fairseq -> CTranslate2 mapping, which the comparisons therefore test).
DECODE_MAX_LEN = 12
DECODING = {
    "beam": 4,
    # Length penalty 0 (raw log-probability): with min length 1 CTranslate2 bans </s> at the
    # first step before its softmax (renormalizing), fairseq after it, which adds the same
    # constant -log(1 - p(</s>)) to every hypothesis of a sentence. That leaves raw scores'
    # ranking intact but can flip a length-normalized one when p(</s>) at step 1 is large, as
    # it is in these toy models (0.45 measured); trained models put ~0 there
    # (docs/serving.md).
    "lenpen": 0,
    "max_len_b": DECODE_MAX_LEN,
}
DECODING_FLAGS = [arg for name, value in DECODING.items()
                  for arg in (f"--{name.replace('_', '-')}", str(value))]
DECODE_BATCH = 8
EXPORT_UPDATES = 150  # enough for varied multi-token hypotheses on the toy task


class Decoded(NamedTuple):
    """fairseq-generate's output by sentence id: the sources as it read them, its best
    hypotheses and their scores."""
    sources: dict[int, list[str]]
    hypotheses: dict[int, str]
    scores: dict[int, float]


class Trained(NamedTuple):
    ckpt: Path
    decoded: Decoded  # the plugin's own fairseq-generate (with --user-dir)

    @property
    def sources(self) -> dict[int, list[str]]:
        return self.decoded.sources

    @property
    def hypotheses(self) -> dict[int, str]:
        return self.decoded.hypotheses


def decode(data: Path, ckpt: Path, *extra: str, env: dict[str, str] | None = None) -> Decoded:
    """fairseq-generate with DECODING on the test split (``env``: as ``run_cli``'s)."""
    proc = run_cli("fairseq-generate", str(data), "--path", str(ckpt), *DECODING_FLAGS,
                   "--batch-size", str(DECODE_BATCH), "--cpu", *extra, env=env)
    sources = {int(i): s.split() for i, s in re.findall(r"^S-(\d+)\t(.*)$", proc.stdout, re.M)}
    found = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", proc.stdout, re.M)
    hyps = {int(i): h for i, _, h in found}
    assert sources and sources.keys() == hyps.keys(), proc.stdout[-2000:]
    return Decoded(sources, hyps, {int(i): float(score) for i, score, _ in found})


def train_and_generate(data: Path, folder: Path, arch: str, tying: str, output_layer: str,
                       projection: bool, extra: tuple[str, ...] = ()) -> Trained:
    """A tiny model of EXPORT_UPDATES updates in FOLDER and its decoding by the plugin, saved
    beside it (``decoded.json``) so that another test process reads them instead of redoing."""
    saved = folder / "decoded.json"
    if saved.exists():
        raw = json.loads(saved.read_text())
        decoded = Decoded(*({int(i): v for i, v in part.items()} for part in raw))
        return Trained(folder / "checkpoint_last.pt", decoded)
    ckpt = train_checkpoint(data, folder, arch, tying, output_layer, projection, EXPORT_UPDATES,
                            extra)
    decoded = decode(data, ckpt, "--user-dir", "fairseq_tying")
    saved.write_text(json.dumps(decoded))
    return Trained(ckpt, decoded)


# ---- the same training with and without --chunked-loss ---------------------------------------

TIMING = {"wps", "ups", "wall", "gb_free", "cuda_gb_allocated"}  # also as train_/valid_ keys
# chunks of a few dozen rows (V ≈ 100 in these tests): several per batch
CHUNKED = ["--chunked-loss", "--chunked-loss-mb", "0.01"]


def translation_args(data: Path, save_dir: Path, arch: str, *flags: str) -> list[str]:
    """fairseq-train's arguments for 8 logged updates of a tiny model, saving nothing (fairseq
    still probes SAVE_DIR, and writes crash.pt there when a step raises)."""
    return [str(data), "--user-dir", "fairseq_tying", "--arch", arch, *TINY_MODEL,
            "--save-dir", str(save_dir),
            "--dropout", "0.1",  # the same masks with and without: the loss draws no numbers
            "--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1",
            "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "600", "--max-update", "8",
            "--cpu", "--seed", "3", "--no-save", "--log-format", "json", "--log-interval", "1",
            *flags]


def logged(log: str) -> list[tuple[str, dict]]:
    """fairseq's JSON records (train_inner, train, valid) without the timings."""
    records = re.findall(r"\| (train_inner|train|valid) \| (\{.*\})\s*$", log, re.M)
    return [(kind, {k: v for k, v in json.loads(rec).items()
                    if k.removeprefix(f"{kind}_").removeprefix("train_") not in TIMING})
            for kind, rec in records]


def assert_same_logs(want: list, got: list) -> None:
    """The same records, keys and values to the printed digits (a value computed in another
    order may round to the neighbouring last digit). A perplexity is 2**loss of the unrounded
    loss, so a loss that differs in its 3rd printed digit moves it by up to ppl·ln 2·10⁻³."""
    assert [kind for kind, _ in got] == [kind for kind, _ in want]
    assert sum(kind == "train_inner" for kind, _ in want) >= 8
    for (_, w), (_, g) in zip(want, got, strict=True):
        assert set(g) == set(w)
        for key, value in w.items():
            digits = len(str(value).split(".")[1]) if "." in str(value) else 0
            tolerance = 1.01 * 10**-digits
            if key.endswith("ppl"):
                tolerance += float(value) * math.log(2) * 1.01e-3
            assert abs(float(g[key]) - float(value)) <= tolerance, (key, w, g)


def train_both(*args: str, env: dict[str, str] | None = None) -> tuple[list, list]:
    """fairseq's logs of the training ``args`` with fairseq's loss and with the chunked one."""
    runs = [run_cli("fairseq-train", *args, *extra, env=env)
            for extra in (["--no-chunked-loss"], CHUNKED)]
    return tuple(logged(p.stdout + p.stderr) for p in runs)


# ---- an output layer from outside the package -------------------------------------------------

TOY_LAYER_FILE = REPO / "tests" / "toy_layer.py"
TOY_LAYER = "scaled_dot"  # s_i = α·h·w_i, the one class of TOY_LAYER_FILE


# s_i = softplus(h·w_i): an affine map and a transform, the one class of TOY_TRANSFORM_FILE
TOY_TRANSFORM_FILE = REPO / "tests" / "toy_transform_layer.py"
TOY_TRANSFORM = "softplus_dot"


def toy_env(path: Path = TOY_LAYER_FILE) -> dict[str, str]:
    """``cli_env()`` with the toy layer of ``path`` registered in every process it starts."""
    from fairseq_tying.core.output_layers import PLUGINS_ENV

    return {**cli_env(), PLUGINS_ENV: str(path)}


@contextmanager
def toy_layer_registered(path: Path = TOY_LAYER_FILE, name: str = TOY_LAYER) -> Iterator:
    """The toy layer ``name`` of ``path`` registered in this process (as
    ``FAIRSEQ_TYING_LAYERS`` registers it in a CLI process), and gone again afterwards, so that
    no other test sees it."""
    from fairseq_tying.core import output_layers

    before = set(sys.modules)
    output_layers.load_plugins(str(path))
    loaded = set(sys.modules) - before  # the toy's module only: the test may import more
    try:
        yield output_layers.get(name)
    finally:
        output_layers.OUTPUT_LAYERS.pop(name, None)
        for module in loaded:
            del sys.modules[module]


def export_args(**kw) -> Namespace:
    """A model config as the exports read it: a three-way tied cosine transformer, changed by
    KW."""
    base = {
        "arch": "transformer_twwt",
        "output_layer": "cosine",
        "tying": "three_way",
        "tied_projection": True,
        "tied_embed_dim": None,
        "decoder_embed_dim": 16,
    }
    return Namespace(**{**base, **kw})


def build_model(data: Path, arch: str, *flags: str, size: list[str] = TINY_MODEL):
    """Parse flags with fairseq's own training parser and build the model (of ``size``: the
    tiny translation model's flags unless given) in-process; (model, task)."""
    from fairseq import options, tasks

    import fairseq_tying  # noqa: F401  (registration)

    parser = options.get_training_parser()
    args: Namespace = options.parse_args_and_arch(
        parser, [str(data), "--arch", arch, "--user-dir", PLUGIN_DIR, *size, *flags])
    task = tasks.setup_task(args)
    return task.build_model(args), task


def build_lm(data: Path, *flags: str, arch: str = "transformer_lm_tied"):
    """``build_model`` of a tiny language model (TINY_LM) of the LM set ``data``."""
    return build_model(data, arch, "--task", "language_modeling", *flags, size=TINY_LM)


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


# ---- independent references -----------------------------------------------------------------


GAIN = 2.5  # fixnorm's g where a test picks the learned values


def learned_values(vocab: int, dim: int) -> dict[str, torch.Tensor | float]:
    """Learned parameters of every layer for a test (a layer reads its own): fixnorm's g, and
    ngpt's stored sz, each token's own value around nGPT's initial 1/√D."""
    import torch

    return {"gain": GAIN, "sz": torch.linspace(0.5, 1.5, vocab) / math.sqrt(dim)}


def reference_scores(output_layer: str, h: torch.Tensor, w: torch.Tensor,
                     gain: torch.Tensor | float | None = None, *,
                     sz: torch.Tensor | None = None, softcap: float = 30.0,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """The formulas written out row by row in float64 (``gain``: fixnorm's g; ``sz``: ngpt's
    stored vector, s_z = sz·√D; ``softcap``: softcap's c; ``bias``: an output bias b₂, inside
    softcap's tanh)."""
    import torch

    h, w = h.double(), w.double()
    h_norms = (h * h).sum(-1).sqrt()
    g = None if gain is None else float(torch.as_tensor(gain).detach())
    out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float64)
    for i in range(w.shape[0]):
        dot = h @ w[i]
        norm = math.sqrt(float((w[i] * w[i]).sum()))
        b = 0.0 if bias is None else float(bias[i])
        cos = dot / (h_norms * norm) if norm > 0 else 0 * dot
        if output_layer == "softcap":  # the bias inside the cap, with the affine scores
            out[:, i] = softcap * torch.tanh((dot + b) / softcap)
        elif output_layer == "ngpt":
            out[:, i] = float(sz[i]) * math.sqrt(w.shape[1]) * cos + b
        elif output_layer == "fixnorm":
            out[:, i] = g * cos + b
        else:
            inv = 1 / norm if norm > 0 else 0.0  # a zero (padding) row scores 0
            out[:, i] = b + {"dot": dot, "l2norm": dot * inv, "cosine": dot * inv,
                             "sqnorm": dot * inv**2, "distance": dot - 0.5 * norm**2,
                             }[output_layer]
    return out


def first_stop(values: list[float], patience: int, gain: float, cap: int) -> tuple[int, str]:
    """Independent: the first epoch e whose last `patience` values all fail to beat the best
    before them by a fraction `gain` (lower is better), else the cap."""
    for e in range(1, len(values) + 1):
        if e > patience:
            best_before = min(values[:e - patience])
            if all(v > best_before * (1 - gain) for v in values[e - patience:e]):
                return e, "plateau"
        if e >= cap:
            return e, "cap"
    return len(values), "running"


# ---- sweeps and the SLURM cluster -----------------------------------------------------------

TINY_SWEEP = REPO / "slurm" / "tiny_cpu.yaml"


def write_sweep(path: Path, **changes) -> Path:
    """The tiny CPU sweep with sections replaced/updated (``{"grid": {...}}`` merges one level)."""
    data = yaml.safe_load(TINY_SWEEP.read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def launch(*args: str, data: Path | None = None, check: bool = True,
           timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m fairseq_tying.launch ARGS`` as a user runs it (DATA: the tiny sweep's data)."""
    env = cli_env()
    if data is not None:
        env["FAIRSEQ_TYING_TINY_DATA"] = str(data)
    return run_module("fairseq_tying.launch", *args, check=check, timeout=timeout, env=env)


def study_prepare(tiny_data: Path) -> str:
    """The manifest's ``prepare:`` line of the tiny study: the tiny corpus's raw text,
    sentencepiece with 60 pieces (prepared by the study command itself)."""
    return (f"    prepare: [--corpus, {tiny_data / 'raw'}, --src, es, --tgt, en, --subword, "
            "sentencepiece, --vocab-size, '60']\n")


def run_folders(out: Path) -> list[Path]:
    """The run folders a sweep wrote into ``out``, each with its run.json (not its .submitit/,
    nor the answer/ of the launcher's summary)."""
    return sorted(p for p in out.iterdir() if (p / "run.json").is_file())


def sacct(job: str) -> list[dict[str, str]]:
    """All records (also requeued attempts) of a job or array, allocations only."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-j", job, "-o",
                          "JobID,State,Start,End,NodeList"],
                         capture_output=True, text=True, check=True).stdout
    keys = ("JobID", "State", "Start", "End", "NodeList")
    return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line]


ACTIVE = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING"}


def _accounted(job: str) -> bool:
    """slurmdbd has the job's end: it hears of it after squeue does, later on a busy machine."""
    records = sacct(job)
    return bool(records) and not any(r["State"].split()[0] in ACTIVE for r in records)


def wait_jobs(jobs: list[str], timeout: float = 240) -> None:
    """Until every job (array ids included) has left the queue in a terminal state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                                check=True).stdout.split()
        base = {j.split("_")[0] for j in jobs}
        if not any(q.split("_")[0] in base for q in queued) and all(_accounted(j) for j in jobs):
            return
        time.sleep(1)
    raise AssertionError(f"jobs {jobs} still queued after {timeout:.0f}s: "
                         + subprocess.run(["squeue"], capture_output=True, text=True).stdout)


def raw_job_ids() -> set[int]:
    """Every job id the cluster handed out (array tasks have their own)."""
    out = subprocess.run(["sacct", "-n", "-X", "-D", "-o", "JobIDRaw"], capture_output=True,
                         text=True, check=True).stdout
    return {int(j) for j in out.split()}
