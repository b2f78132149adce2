"""The same numbers from the same command on any x86-64 CPU with AVX2.

torch, MKL and oneDNN pick their CPU kernels at run time from the instruction sets the processor
has (AVX2 on one machine, AVX-512 on a newer one of the same cloud "kind"). The kernels round
differently, a training run drifts apart within a few hundred updates and BLEU moves by a few
tenths. The tools therefore run fairseq with the kernel choice pinned to AVX2 (which every
x86-64 server since 2013 has) and one thread per process, unless the user set these variables:

    ATEN_CPU_CAPABILITY=avx2   torch's own vectorized kernels
    MKL_CBWR=AVX2              MKL's conditional numerical reproducibility mode (matmuls)
    ONEDNN_MAX_CPU_ISA=AVX2    oneDNN (convolutions, some linear layers)

They must be in the environment before torch is imported, so they are set for child processes.
On a CPU without AVX2 (or not x86) nothing is pinned.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def pinned_env(base: Mapping[str, str] | None = None, threads: int | None = 1) -> dict[str, str]:
    """``base`` (default: this process's environment) with the kernel choice pinned and
    ``OMP_NUM_THREADS`` set to ``threads``; variables already set in ``base`` are kept."""
    env = dict(os.environ if base is None else base)
    if has_avx2():
        for key, value in PINNED.items():
            env.setdefault(key, value)
    if threads is not None:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


@contextlib.contextmanager
def pinned_environ() -> Iterator[None]:
    """This process's environment pinned (``pinned_env()``) while the block runs, for the child
    processes it starts that inherit it (submitit's local jobs, ``sbatch --export=ALL``), and
    restored after: a caller's own later processes see the environment it set."""
    saved = dict(os.environ)
    os.environ.update(pinned_env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@functools.cache  # one machine per process: read once, not at every epoch
def cpu_name() -> str:
    """The processor and the kernels torch runs on it, for the record: the same command gives
    the same numbers on the same kind of machine only (docs/design.md, reproducible numbers)."""
    import torch  # lazily: the variables above must be set before torch is imported

    model = "unknown processor"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:  # not Linux
        pass
    return f"{model}, {torch.backends.cpu.get_cpu_capability()} kernels"


def cpu_name_under(env: Mapping[str, str]) -> str:
    """``cpu_name()`` as a process started with ``env`` reports it: its kernels follow that
    environment's pin, which this process's torch, imported before it, may not."""
    code = "from fairseq_tying.common.reproducible import cpu_name; print(cpu_name())"
    proc = subprocess.run([sys.executable, "-c", code], env=dict(env), capture_output=True,
                          text=True, check=True)
    return proc.stdout.strip().splitlines()[-1]
