"""The tools print what matters: no third-party DEBUG logs, no install hints for what we ship."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env

NOISE = ("DEBUG", "Please install")


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def assert_quiet(stderr: str) -> None:
    noisy = [line for line in stderr.splitlines() if any(word in line for word in NOISE)]
    assert not noisy, "\n".join(noisy[:10])


def test_help_is_quiet():
    # importing fairseq used to print an install hint (tensorboardX) and, through a
    # basicConfig(DEBUG) of fairseq's, open the root logger to every library's DEBUG records
    assert_quiet(run_module("fairseq_tying.translate", "--help").stderr)


@pytest.mark.slow
def test_bench_is_quiet_and_takes_the_old_preset_flag(tmp_path: Path):
    # a real run: it imports fairseq and matplotlib and logs through both
    out = tmp_path / "bench"
    proc = run_module("fairseq_tying.bench", "--preset", "tiny", "--vocab", "64", "--reps", "2",
                      "--no-memory", "--threads", "1", "--out", str(out))
    assert_quiet(proc.stderr)
    assert "--preset is deprecated, use --size tiny" in proc.stderr
    config = json.loads((out / "bench.json").read_text())["config"]
    assert config["size"] == "tiny" and "preset" not in config and (out / "bench.png").is_file()
