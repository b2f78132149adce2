"""Run the real ``fairseq-generate`` CLI and read its hypotheses back in corpus order."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fairseq_tying.common import PLUGIN_DIR
from fairseq_tying.common.reproducible import pinned_env

_DETOK_LINE = re.compile(r"^D-(\d+)\t[^\t]*\t?(.*)$")


def fairseq_exe(tool: str = "fairseq-generate") -> str:
    """A fairseq console script (``fairseq-generate``, ``fairseq-eval-lm``) next to this
    Python, else on PATH."""
    beside = Path(sys.executable).parent / tool
    if beside.exists():
        return str(beside)
    found = shutil.which(tool)
    if found is None:
        raise FileNotFoundError(f"{tool} not found; install fairseq (make setup)")
    return found


def generate_command(
    bin_dir: str | os.PathLike,
    checkpoint: str | os.PathLike,
    *,
    src: str,
    tgt: str,
    subset: str,
    beam: int,
    lenpen: float,
    post_process: str | None,
    results_path: str | os.PathLike,
    batch_size: int | None = 64,
    max_tokens: int | None = None,
    cpu: bool = False,
    user_dir: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    cmd = [
        fairseq_exe(), str(bin_dir),
        "--user-dir", user_dir or PLUGIN_DIR,
        "--path", str(checkpoint),
        "--source-lang", src, "--target-lang", tgt,
        "--gen-subset", subset,
        "--beam", str(beam), "--lenpen", str(lenpen),
        # fairseq 0.12 drops a last batch smaller than this multiple (fairseq issue #5036):
        # with 1 every test sentence is translated.
        "--required-batch-size-multiple", "1",
        "--results-path", str(results_path),
    ]
    if post_process and post_process != "none":
        cmd += ["--post-process", post_process]
    if batch_size:
        cmd += ["--batch-size", str(batch_size)]
    if max_tokens:
        cmd += ["--max-tokens", str(max_tokens)]
    if cpu:
        cmd.append("--cpu")
    return cmd + list(extra)


def parse_hypotheses(text: str, expected: int | None = None) -> list[str]:
    """The ``D-<id>`` lines (post-processed hypotheses) sorted by sentence id."""
    hyps: dict[int, str] = {}
    for line in text.splitlines():
        m = _DETOK_LINE.match(line)
        if m:
            hyps[int(m.group(1))] = m.group(2)
    if expected is not None and sorted(hyps) != list(range(expected)):
        missing = sorted(set(range(expected)) - set(hyps))[:10]
        raise RuntimeError(
            f"fairseq-generate translated {len(hyps)} of {expected} sentences "
            f"(missing ids {missing}...); check the data in --data and the generate log"
        )
    return [hyps[i] for i in sorted(hyps)]


def run_generate(cmd: list[str], subset: str, results_path: str | os.PathLike) -> str:
    """Run fairseq-generate (its progress and log go to our stderr) and return its output."""
    env = pinned_env()
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-generate failed with exit code {proc.returncode}")
    out = Path(results_path) / f"generate-{subset}.txt"
    return out.read_text(encoding="utf-8")


def generate(cmd_kwargs: dict, expected: int) -> tuple[list[str], str, list[str]]:
    """Generate into a temp folder; return (hypotheses, raw generate output, command)."""
    with tempfile.TemporaryDirectory(prefix="fairseq-generate-") as tmp:
        cmd = generate_command(results_path=tmp, **cmd_kwargs)
        text = run_generate(cmd, cmd_kwargs["subset"], tmp)
    return parse_hypotheses(text, expected), text, cmd
