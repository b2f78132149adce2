"""Fixtures for the SLURM tests: the loopback cluster, the tiny data dirs of the sweeps and one
study of a manifest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

from tests.helpers import (
    build_tiny_data,
    build_tiny_lm_data,
    built_once,
    launch,
    study_prepare,
    write_sweep,
)
from tests.slurm.localcluster import LocalCluster, missing_requirements

# One cluster on this machine at a time: the tests that use it run on one xdist worker (their
# xdist_group, tests/conftest.py), and the lock refuses a second test run's cluster while this
# one is up, rather than let both start daemons on the same ports and directory.
CLUSTER_ROOT = Path("/tmp/fairseq_tying_slurm_pytest")
CLUSTER_PORT_BASE = 26800
CLUSTER_LOCK = Path(f"{CLUSTER_ROOT}.lock")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "tinydata", build_tiny_data)


@pytest.fixture(scope="session")
def tiny_lm_data(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "tinylm", build_tiny_lm_data)


def _acquired(lock: FileLock) -> bool:
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    return True


@pytest.fixture(scope="session")
def cluster():
    """munge + MariaDB + slurmdbd + slurmctld + slurmd n1, n2 on loopback, torn down after."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    lock = FileLock(CLUSTER_LOCK)
    if not _acquired(lock):
        pytest.fail(f"another test process runs the loopback SLURM cluster ({CLUSTER_LOCK} is "
                    "locked): the cluster tests run on one worker with --dist loadgroup (as "
                    "`make test` runs them), and one test run at a time", pytrace=False)
    c = LocalCluster(CLUSTER_ROOT, port_base=CLUSTER_PORT_BASE)
    saved = os.environ.get("SLURM_CONF")
    try:
        c.up()
        os.environ["SLURM_CONF"] = str(c.conf)
        yield c
    finally:
        c.down()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        lock.release()


# ---- one study of a manifest, trained once: test_study checks its steps, test_reproduce
# reproduces its records -----------------------------------------------------------------


def _study_manifest(tmp: Path, tiny_data: Path) -> Path:
    """A manifest of one study: the tiny sweep (untied and three-way tied dot, seeds 1 and 2)
    on the tiny corpus, prepared with sentencepiece by the study command itself."""
    sweep = write_sweep(tmp / "tiny.yaml", output_dir=str(tmp / "runs"),
                        datasets={"tiny": str(tmp / "data")}, fairseq={"log_format": "json"},
                        grid={"tying": ["none", "three_way"], "output_layer": ["dot"],
                              "seed": [1, 2]})
    (tmp / "results.md").write_text("# Study\n\n<!-- tiny:begin -->\nold\n<!-- tiny:end -->\n"
                                    "\nWritten by hand.\n")
    (tmp / "README.md").write_text("# Tiny\n\n<!-- answer:begin -->\n<!-- answer:end -->\n")
    manifest = tmp / "studies.yaml"
    manifest.write_text(
        "studies:\n  tiny:\n" + study_prepare(tiny_data) +
        f"    sweep: {sweep}\n    records: {tmp / 'records'}\n    plots: {tmp / 'plots'}\n"
        f"    references: {tmp / 'data' / 'raw' / 'test.en'}\n"
        f"    reports: [{{file: {tmp / 'results.md'}, block: tiny, view: translation}}]\n"
        f"summaries:\n  - {{file: {tmp / 'README.md'}, block: answer, view: does_it_help, "
        "from: [tiny]}\n")
    return manifest


def _keep(tmp: Path, step: str, output: str = "") -> None:
    """TMP's records, reports, data preparation and summary as they are now, into TMP/STEP,
    with the modification times of the runs' checkpoints and the command's OUTPUT."""
    kept = tmp / step
    shutil.copytree(tmp / "records", kept / "records")
    for path in (tmp / "results.md", tmp / "README.md", tmp / "data" / "prep.json",
                 tmp / "plots" / "summary.json"):
        shutil.copy2(path, kept / path.name)
    mtimes = {str(p.relative_to(tmp / "runs")): p.stat().st_mtime_ns
              for p in (tmp / "runs").glob("*/**/*.pt")}
    (kept / "mtimes.json").write_text(json.dumps(mtimes))
    (kept / "output.txt").write_text(output)


def study_command(manifest: Path, *args: str) -> subprocess.CompletedProcess:
    return launch("study", "tiny", "--manifest", str(manifest), "--bootstrap-samples", "100",
                  *args, timeout=1800)


@pytest.fixture(scope="session")
def named_study(tiny_data, tmp_path_factory) -> Path:
    """``python -m fairseq_tying.launch study tiny`` of a manifest, called three times: with
    ``--only '*.s1'`` (the state after it kept in ``first/``), for the rest (``second/``, its
    output in ``second/output.txt``), then ``--report-only`` (the folder itself)."""
    def build(tmp: Path) -> None:
        manifest = _study_manifest(tmp, tiny_data)
        study_command(manifest, "--workers", "2", "--only", "*.s1")
        _keep(tmp, "first")
        proc = study_command(manifest, "--workers", "2")
        _keep(tmp, "second", proc.stdout + proc.stderr)
        study_command(manifest, "--report-only")

    return built_once(tmp_path_factory, "namedstudy", build)
