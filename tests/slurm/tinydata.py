"""A tiny synthetic Es->En corpus in the project's data-dir layout (fairseq-preprocess'd)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

SIZES = {"train": 1500, "valid": 60, "test": 40}


def build_tiny_data(root: Path, seed: int = 0) -> Path:
    """``root/raw``, ``root/bin`` and ``root/prep.json``: word-level, a word-for-word mapping."""
    rng = random.Random(seed)
    src_words = [f"pal{i}" for i in range(24)]
    tgt_words = [f"word{i}" for i in range(24)]
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, n in SIZES.items():
        src_lines, tgt_lines = [], []
        for _ in range(n):
            ids = [rng.randrange(len(src_words)) for _ in range(rng.randint(3, 7))]
            src_lines.append(" ".join(src_words[i] for i in ids))
            tgt_lines.append(" ".join(tgt_words[i] for i in ids))
        (raw / f"{split}.es").write_text("\n".join(src_lines) + "\n")
        (raw / f"{split}.en").write_text("\n".join(tgt_lines) + "\n")
    bindir = sys.executable.rsplit("/", 1)[0]
    subprocess.run(
        [f"{bindir}/fairseq-preprocess", "--source-lang", "es", "--target-lang", "en",
         "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
         "--testpref", str(raw / "test"), "--destdir", str(root / "bin"),
         "--joined-dictionary", "--workers", "1"],
        check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    prep = {"corpus": "synthetic", "src": "es", "tgt": "en", "subword": "subword_nmt",
            "post_process": "subword_nmt", "detokenizer": None, "vocab_size": 48}
    (root / "prep.json").write_text(json.dumps(prep, indent=1) + "\n")
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
    bindir = sys.executable.rsplit("/", 1)[0]
    subprocess.run(
        [f"{bindir}/fairseq-preprocess", "--only-source", "--trainpref", str(raw / "train.en"),
         "--validpref", str(raw / "valid.en"), "--testpref", str(raw / "test.en"),
         "--destdir", str(root / "bin"), "--workers", "1"],
        check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    prep = {"task": "language_modeling", "corpus": "synthetic", "lang": "en", "subword": "word",
            "post_process": None}
    (root / "prep.json").write_text(json.dumps(prep, indent=1) + "\n")
    return root
