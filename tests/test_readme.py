"""The README's commands do what it says: each `python -m fairseq_tying.…` it shows parses (its
flags and subcommands, up to `--help`) and each `make …` target exists (`make -n`)."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from fairseq_tying.common.blocks import block_text
from tests.helpers import REPO, load_script, run_module

README = REPO / "README.md"
MAX_LINES = 220


def _shell_lines(text: str) -> list[str]:
    """Commands in the README: the lines of its bash blocks (continuations joined) and the
    inline code spans of its prose and tables."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += [line.split("#")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    lines += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [line for line in lines if line]


def _commands(prefix: str) -> list[list[str]]:
    found = []
    for line in _shell_lines(README.read_text()):
        for part in re.split(r"\s*(?:\||&&|;)\s*", line):
            if part.startswith(prefix):
                words = [w for w in shlex.split(part) if not w.startswith("[")]
                found.append(words)
    return found


PYTHON = _commands("python -m fairseq_tying")
MAKE = _commands("make ")


def test_the_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= MAX_LINES
    assert len(PYTHON) >= 5 and len(MAKE) >= 4  # the extraction finds the commands


@pytest.mark.slow
@pytest.mark.parametrize("words", PYTHON, ids=[" ".join(w[2:4]) for w in PYTHON])
def test_readme_python_commands_parse(words):
    assert words[1] == "-m", words
    proc = run_module(words[2], *words[3:], "--help", timeout=300)
    assert "usage:" in proc.stdout


@pytest.mark.parametrize("words", MAKE, ids=[" ".join(w[1:]) for w in MAKE])
def test_readme_make_targets_exist(words):
    proc = subprocess.run(["make", "-n", *words[1:]], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0, f"{' '.join(words)}:\n{proc.stderr[-2000:]}"


def test_the_test_times_block_is_the_committed_report():
    """The suite's times in the README are docs/test_times.json's, as scripts/time_tests.py
    writes them; without that report the block states no number."""
    tool = load_script("time_tests")
    block = block_text(README.read_text(), "test-times")
    assert block.strip() == tool.readme_block(tool.load()).strip()
