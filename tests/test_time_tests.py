"""scripts/time_tests.py: make targets timed, pytest's counts read, the report and the README
block written; run here on a makefile whose targets run pytest on a tiny test file."""

from __future__ import annotations

import json
import sys

from fairseq_tying.common.blocks import block_text, markers
from fairseq_tying.common.reproducible import cpu_name
from tests.helpers import load_script

tool = load_script("time_tests")

TINY_TESTS = """
import time
import pytest

def test_a():
    time.sleep(0.3)

def test_b():
    pass

@pytest.mark.skip(reason="shows in the counts")
def test_c():
    pass
"""


def test_pytest_counts_sum_every_summary_line():
    out = ("....\n3 passed, 1 skipped, 2 warnings in 1.20s\nnoise\n"
           "======= 1 failed, 2 passed, 1 error in 1800.50s (0:30:00) =======\n")
    assert tool.pytest_counts(out) == {"passed": 5, "skipped": 1, "warnings": 2, "failed": 1,
                                       "errors": 1}
    assert tool.pytest_counts("no summary here\n") == {}


def test_times_make_targets_into_the_report_and_the_readme(tmp_path):
    (tmp_path / "test_tiny.py").write_text(TINY_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    # without the installed plugins (xdist, hydra's, ...): a pytest that starts in a second
    pytest = (f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS= $(PY) -m pytest -q "
              f"-p no:cacheprovider -c {tmp_path / 'pytest.ini'} {tmp_path}")
    makefile = tmp_path / "Makefile"
    made = tmp_path / "set-up"  # the targets run only after setup was made
    makefile.write_text(f"setup:\n\ttouch {made}\nfast:\n\ttest -f {made} && {pytest} -k "
                        f"'not test_a'\nboth:\n\t{pytest}\n\t{pytest}\n")
    readme = tmp_path / "README.md"
    readme.write_text("# R\n\n{}\n{}\n\nrest\n".format(*markers("test-times")))
    out = tmp_path / "times.json"
    args = ["--targets", "fast", "both", "--makefile", str(makefile), "--out", str(out),
            "--readme", str(readme), f"PY={sys.executable}"]
    assert tool.main(args) == 0
    report = json.loads(out.read_text())
    fast, both = report["runs"]
    assert fast["counts"] == {"passed": 1, "skipped": 1, "deselected": 1}
    assert both["counts"] == {"passed": 4, "skipped": 2}
    assert fast["returncode"] == both["returncode"] == 0
    assert both["seconds"] >= 0.6 and len(both["pytest"]) == 2  # two test_a sleeps, two runs
    assert fast["command"] == f"make fast PY={sys.executable}"
    assert [run["target"] for run in report["runs"]] == ["fast", "both"]  # setup: not timed
    assert report["machine"]["cpu"] == cpu_name() and report["machine"]["cores"] >= 1
    block = block_text(readme.read_text(), "test-times")
    assert block == tool.readme_block(report) and "(4 passed, 2 skipped)" in block
    assert readme.read_text().endswith("\n\nrest\n")
    out.unlink()  # no report: the block states no number
    assert tool.main(["--report-only", "--out", str(out), "--readme", str(readme)]) == 0
    assert block_text(readme.read_text(), "test-times").strip() == ""
