"""The README's "Train, generate, export, translate" block, run as written from a fresh folder
(the package linked in as ``fairseq_tying``) with only the model's size, the training pairs and
the training length made tiny: data preparation, fairseq-train, fairseq-generate, evaluation, the
CTranslate2 export and translate each succeed, and generation covers every test sentence (the
test and validation splits are whole)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.helpers import BIN, REPO, cli_env

pytestmark = pytest.mark.slow
SECTION = "## Train, generate, export, translate"
# the only changes to the README's commands: the first 2000 of the 28.6k training pairs
# (sentencepiece and binarizing all of them took 51 s of the test on a busy 2-core CPU, 19 s
# with 2000), a 1-layer 16-dim model, 30 updates, short decoding
TINY = {"--vocab-size 4000": "--vocab-size 4000 --train-limit 2000",
        "--encoder-layers 2": "--encoder-layers 1", "--decoder-layers 2": "--decoder-layers 1",
        "--encoder-embed-dim 128": "--encoder-embed-dim 16",
        "--decoder-embed-dim 128": "--decoder-embed-dim 16",
        "--encoder-ffn-embed-dim 512": "--encoder-ffn-embed-dim 32",
        "--decoder-ffn-embed-dim 512": "--decoder-ffn-embed-dim 32",
        "--max-epoch 10": "--max-update 30",
        # decoding made short: a 30-update model repeats a word up to fairseq's 200-token
        # bound, which made generation and evaluation two thirds of the test
        "--lenpen 1 --remove-bpe": "--lenpen 1 --max-len-b 20 --remove-bpe",
        "--data work/bible --cpu": "--data work/bible --cpu --beam 1"}
TEST_PAIRS = 1434  # the embedded Bible's test split (docs/data.md)


def readme_commands() -> list[str]:
    """The section's bash block as shell commands (continuations joined), size made tiny."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(SECTION):], flags=re.S).group(1)
    commands = [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    joined = "\n".join(commands)
    for old, new in TINY.items():
        assert old in joined, f"the README's example no longer has {old!r}: update TINY"
        joined = joined.replace(old, new)
    return joined.splitlines()


def test_the_readme_example_runs_end_to_end(tmp_path):
    (tmp_path / "fairseq_tying").symlink_to(REPO / "fairseq_tying")
    env = {**cli_env(), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO)}
    outputs = []
    for command in readme_commands():
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout)
    generated = next(o for c, o in zip(readme_commands(), outputs, strict=True)
                     if c.startswith("fairseq-generate"))
    assert len(re.findall(r"^H-\d+\t", generated, re.M)) == TEST_PAIRS  # no batch dropped
    scores = json.loads((tmp_path / "work" / "ckpt" / "eval.json").read_text())
    assert scores["n_sentences"] == TEST_PAIRS and 0 <= scores["bleu"] <= 100
    assert (tmp_path / "work" / "ct2" / "model.bin").is_file()
    assert outputs[-1].strip()  # translate printed the sentence's translation
