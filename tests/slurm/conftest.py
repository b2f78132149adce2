"""Fixtures for the SLURM tests: the loopback cluster and the tiny data dirs of the sweeps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

from tests.helpers import build_tiny_data, build_tiny_lm_data, built_once
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
