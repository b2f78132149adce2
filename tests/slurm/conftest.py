"""Fixtures for the SLURM tests: the loopback cluster, a tiny data dir, sweep files, job waiting."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.slurm.localcluster import LocalCluster, missing_requirements

sys.path.insert(0, str(Path(__file__).parent))
from tinydata import build_tiny_data, build_tiny_lm_data  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY_SWEEP = REPO / "slurm" / "tiny_cpu.yaml"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return build_tiny_data(tmp_path_factory.mktemp("tinydata"))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """munge + MariaDB + slurmdbd + slurmctld + slurmd n1, n2 on loopback, torn down after."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    c = LocalCluster(Path("/tmp/fairseq_tying_slurm_pytest"), port_base=26800)
    c.up()
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(c.conf)
    try:
        yield c
    finally:
        c.down()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


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


def launch(*args: str, data: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m fairseq_tying.launch ARGS`` as a user runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if data is not None:
        env["FAIRSEQ_TYING_TINY_DATA"] = str(data)
    proc = subprocess.run([sys.executable, "-m", "fairseq_tying.launch", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"launcher failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


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


@pytest.fixture(scope="session")
def tiny_lm_data(tmp_path_factory) -> Path:
    return build_tiny_lm_data(tmp_path_factory.mktemp("tinylm"))
