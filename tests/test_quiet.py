"""The tools print what matters: no third-party DEBUG logs, no install hints for what we ship."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_module

NOISE = ("DEBUG", "Please install")


def assert_quiet(stderr: str) -> None:
    noisy = [line for line in stderr.splitlines() if any(word in line for word in NOISE)]
    assert not noisy, "\n".join(noisy[:10])


def test_help_is_quiet():
    # importing fairseq used to print an install hint (tensorboardX) and, through a
    # basicConfig(DEBUG) of fairseq's, open the root logger to every library's DEBUG records
    assert_quiet(run_module("fairseq_tying.translate", "--help", timeout=600).stderr)


@pytest.mark.slow
def test_bench_is_quiet(tmp_path: Path):
    # a real run: it imports fairseq and matplotlib and logs through both
    out = tmp_path / "bench"
    proc = run_module("fairseq_tying.bench", "--size", "tiny", "--vocab", "64", "--reps", "2",
                      "--no-memory", "--threads", "1", "--out", out, timeout=600)
    assert_quiet(proc.stderr)
    config = json.loads((out / "bench.json").read_text())["config"]
    assert config["size"] == "tiny" and "preset" not in config and (out / "bench.png").is_file()
