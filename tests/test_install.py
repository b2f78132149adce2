"""``pip install .`` without extras, as a fairseq user installs the plugin: the repository's
wheel goes into a fresh virtual environment (no system site-packages) beside the cached
fairseq-fixed wheel (``make fairseq-wheel-dir``) and this environment's torch build, pinned.
There it prepares data, trains with ``fairseq-train --user-dir`` pointing into site-packages,
generates and scores BLEU; the optional libraries are absent and a tool that needs one names
its extra."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.helpers import REPO, cli_env, train_args, write_corpus

pytestmark = pytest.mark.slow
OPTIONAL = ("ctranslate2", "gensim", "submitit", "matplotlib")


def venv_env() -> dict[str, str]:
    """The tests' CLI environment without PYTHONPATH: the venv imports its own copy."""
    return {k: v for k, v in cli_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run(argv: list, cwd: Path, timeout: float = 600, check: bool = True
        ) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd,
                          env=venv_env(), timeout=timeout)
    assert proc.returncode == 0 or not check, (
        f"{argv[:3]} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    words = [Path(str(a)).name for a in argv[:4]]
    print(f"{time.monotonic() - start:6.1f} s  {' '.join(words)}")  # pytest -s shows the steps
    return proc


def fairseq_wheel() -> Path:
    """The wheel ``make setup`` built for this Python and torch (the Makefile names its folder)."""
    torch = version("torch").split("+")[0]
    folder = subprocess.run(["make", "-s", "-C", str(REPO), "fairseq-wheel-dir",
                             f"PYTHON={sys.executable}", f"TORCH_VERSION={torch}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    wheels = sorted(Path(folder).glob("fairseq_fixed-*.whl"))
    assert wheels, f"no fairseq-fixed wheel in {folder}: make setup builds and caches it"
    return wheels[-1]


def build_wheel(tmp: Path) -> Path:
    """The repository's wheel, built from a copy (a build writes build/ and *.egg-info)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "fairseq_tying", src / "fairseq_tying",
                    ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", tmp / "dist", src], tmp)
    return next((tmp / "dist").glob("fairseq_tying-*.whl"))


def test_the_wheel_installs_without_extras_and_trains_with_user_dir(tmp_path):
    start = time.monotonic()
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    # this environment's torch build, pinned: an unpinned torch would be the CUDA build
    run([python, "-m", "pip", "install", "-q", "--no-compile", wheel, fairseq_wheel(),
         f"torch=={version('torch')}"], tmp_path)
    run([python, "-m", "pip", "check"], tmp_path)
    installed = time.monotonic() - start

    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    tmp_path).stdout.strip())
    plugin = site / "fairseq_tying"
    probe = ("import importlib, fairseq_tying\nprint(fairseq_tying.__file__)\n"
             f"for m in {OPTIONAL!r}:\n"
             "    try:\n        importlib.import_module(m)\n        print('present', m)\n"
             "    except ImportError:\n        print('absent', m)\n")
    out = run([python, "-c", probe], tmp_path).stdout.split("\n")
    assert out[0] == str(plugin / "__init__.py")  # the installed copy, not the checkout
    assert out[1:5] == [f"absent {m}" for m in OPTIONAL]

    # data preparation (subword-nmt, Moses, fairseq-preprocess), training, generation, BLEU
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus)
    data = tmp_path / "data"
    run([python, "-m", "fairseq_tying.data.prepare", "--corpus", corpus, "--src", "src",
         "--tgt", "tgt", "--subword", "subword_nmt", "--vocab-size", "40", "--out", data],
        tmp_path)
    ckpts = tmp_path / "run" / "checkpoints"
    args = train_args(data / "bin", ckpts, "transformer_twwt", "--output-layer", "l2norm")
    args[args.index("fairseq_tying")] = str(plugin)
    train = run([bin_dir / "fairseq-train", *args], tmp_path)
    assert "num_updates 4" in train.stdout + train.stderr
    # evaluate runs the venv's fairseq-generate with --user-dir at the installed plugin
    scored = run([python, "-m", "fairseq_tying.evaluation", "evaluate", ckpts.parent, "--data",
                  data, "--cpu", "--beam", "1"], tmp_path).stdout
    assert "BLEU" in scored
    assert json.loads((ckpts.parent / "eval.json").read_text())["n_sentences"] == 20  # test set

    # a tool of an extra names it
    refused = run([python, "-m", "fairseq_tying.export", ckpts / "checkpoint_last.pt",
                   tmp_path / "ct2", "--format", "ctranslate2"], tmp_path, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "needs ctranslate2, which is not installed" in refused.stderr
    assert "pip install 'fairseq_tying[serve]'" in refused.stderr
    assert not (tmp_path / "ct2").exists()
    print(f"\ninstall {installed:.0f} s, in all {time.monotonic() - start:.0f} s "
          f"({os.cpu_count()} CPUs)")
