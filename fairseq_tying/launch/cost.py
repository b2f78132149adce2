"""What a sweep will cost on this machine, from a short timed sample of one of its runs.

The sample is a run's own training command (its model, batch, kernels and threads) on its
data, in a process of its own (``sample_train``), saving into a temporary folder that is removed
afterwards; one for the first run of each architecture (the cells of one differ by embeddings
and output layer only). An epoch costs its updates (fairseq's batch count for the run's
``max_tokens``) at the sample's mean time an update, warm-up excluded, plus one epoch end
(validation and checkpoint) as the sample timed it; a run costs its start and its epochs (a
range for a pilot: from the plateau rule's earliest stop to its cap), the sweep its runs,
``workers`` of them side by side. Not counted: the building of an epoch's batches, the
evaluation.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fairseq_tying.common import PLUGIN_DIR
from fairseq_tying.common.reproducible import pinned_env
from fairseq_tying.sweeps.config import Run, data_bin

WARMUP = 3  # updates not timed: the first steps allocate the optimizer's state, fill caches
TAIL_LINES = 15  # of fairseq's log, shown when the sample fails


class CostError(RuntimeError):
    """The sample could not be trained; the message holds the end of fairseq's log."""


@dataclass(frozen=True)
class Sample:
    """What the timed sample measured (``sample_train``'s result) and how long it took."""

    run: str
    step_seconds: list[float]  # the timed updates
    epoch_end_seconds: list[float]  # each epoch end it ran: validation and checkpoint
    batches: int  # an epoch's batches on one device
    update_freq: int
    warmup: int
    updates: int  # every update it trained, warm-up included
    device: str
    cpu: str
    threads: int
    start: float  # seconds from the process's start to its first update's end
    wall: float  # seconds, the process's start included

    @property
    def step(self) -> float:
        return sum(self.step_seconds) / len(self.step_seconds)

    @property
    def epoch_end(self) -> float:
        return sum(self.epoch_end_seconds) / len(self.epoch_end_seconds)

    def updates_per_epoch(self, world: int) -> int:
        """The updates of an epoch whose batches ``world`` devices share."""
        return math.ceil(math.ceil(self.batches / world) / self.update_freq)

    def epoch_seconds(self, world: int) -> float:
        return self.updates_per_epoch(world) * self.step + self.epoch_end

    def run_seconds(self, epochs: int, world: int) -> float:
        return self.start + epochs * self.epoch_seconds(world)


def sample_command(run: Run, save_dir: Path) -> list[str]:
    """fairseq-train's arguments for ``run``, saving into ``save_dir``."""
    return [str(data_bin(run.data_dir)), "--user-dir", PLUGIN_DIR, "--save-dir", str(save_dir),
            *run.identity.train_args]


def time_sample(run: Run, seconds: float, show: bool = True) -> Sample:
    """Train ``run`` for ``seconds`` of timed updates (after ``WARMUP``), in a child process
    with a run's environment; a progress line on stderr while it trains."""
    with tempfile.TemporaryDirectory(prefix="new-sweep-sample-") as tmp:
        result, log = Path(tmp) / "sample.json", Path(tmp) / "train.log"
        argv = [sys.executable, "-m", "fairseq_tying.launch.sample_train", str(result),
                str(WARMUP), str(seconds), *sample_command(run, Path(tmp) / "checkpoints")]
        start, started = time.monotonic(), time.time()
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    env=pinned_env())
            try:
                _wait(proc, result, start, run.identity.arch if show else None)
            finally:
                if proc.poll() is None:  # interrupted: the child goes with the caller
                    proc.terminate()
                    proc.wait()
        wall = time.monotonic() - start
        if proc.returncode != 0 or not result.is_file():
            tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
            raise CostError("the timed sample of training failed (exit status "
                            f"{proc.returncode}); fairseq's log ends:\n  " + "\n  ".join(tail))
        facts = json.loads(result.read_text())
    if not facts["step_seconds"] or not facts["epoch_end_seconds"]:
        raise CostError(f"the run trained {facts['updates']} updates in all (its whole "
                        f"budget), too few to time after {WARMUP} of warm-up")
    measured = {k: facts[k] for k in ("step_seconds", "epoch_end_seconds", "batches",
                                      "update_freq", "warmup", "updates", "device", "cpu",
                                      "threads")}
    return Sample(run=run.name, start=facts["first_update"] - started, wall=wall,
                  **measured)


def _wait(proc: subprocess.Popen, result: Path, start: float, arch: str | None) -> None:
    """Wait for the sample of ``arch``, showing the updates so far and the seconds since it
    started (None: quietly)."""
    progress = Path(f"{result}.progress")
    tty = arch is not None and sys.stderr.isatty()
    what = f"timing a short sample of {arch}'s training"
    if arch is not None:
        print(f"{what} ...", end="" if tty else "\n", file=sys.stderr, flush=True)
    while proc.poll() is None:
        time.sleep(0.25)
        if tty:
            done = progress.read_text().strip() if progress.is_file() else "0"
            print(f"\r{what}: {done} updates, {time.monotonic() - start:.0f} s", end="",
                  file=sys.stderr, flush=True)
    if tty:
        print(file=sys.stderr)


def duration(seconds: float) -> str:
    """``4.37 s``, ``3 min 28 s``, ``2 h 05 min``."""
    if seconds < 90:
        return f"{seconds:.3g} s"
    if seconds < 90 * 60:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes} min {secs:02d} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"


def makespan(durations: list[float], workers: int) -> float:
    """The time ``workers`` take for these runs in this order, each run going to the first
    worker free (as ``launch --local --workers`` hands them out)."""
    free = [0.0] * workers
    for d in durations:
        free[free.index(min(free))] += d
    return max(free)


def machine() -> tuple[int, float]:
    """This machine's cores and load (the last minute's), which the times depend on: read
    before the sample, whose own process would count in it."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return os.cpu_count() or 1, load


def report(samples: dict[str, Sample], runs: list[tuple[str, int, int]], world: int,
           workers: int, seconds: float, busy: tuple[int, float]) -> str:
    """The estimate: ``samples`` by architecture, ``runs`` each run's (architecture, fewest,
    most) epochs to train, ``busy`` the machine's cores and load before the samples."""
    first = next(iter(samples.values()))
    threads = "1 thread" if first.threads == 1 else f"{first.threads} threads"
    where = first.cpu if first.device == "cpu" else f"{first.device} ({first.cpu})"
    cores, load = busy
    lines = [f"Estimated cost on this machine ({where}; {threads} a run; {cores} cores, load "
             f"{load:.1f}):"]
    for arch, sample in samples.items():
        mine = [(a, b) for name, a, b in runs if name == arch]
        lines += _sample_lines(sample, min(a for a, _ in mine), max(b for _, b in mine), world,
                               seconds)
    lo = makespan([samples[arch].run_seconds(a, world) for arch, a, _ in runs], workers)
    hi = makespan([samples[arch].run_seconds(b, world) for arch, _, b in runs], workers)
    side = "one run at a time" if workers == 1 else f"{workers} runs side by side"
    lines.append(f"  the sweep:  {len(runs)} run{'s' if len(runs) > 1 else ''}, {side} ≈ "
                 f"{_span(lo, hi, duration)}")
    if load >= 1:
        lines.append(f"Other processes ran (load {load:.1f} on {cores} cores): they slow the "
                     "sample and the runs alike, so the estimate holds under a load like this.")
    return "\n".join(lines)


def _sample_lines(sample: Sample, fewest: int, most: int, world: int,
                  seconds: float) -> list[str]:
    """What one sample measured, and what an epoch and a run of its architecture cost."""
    shared = "" if world == 1 else f" (its batches shared by {world} devices)"
    return [
        f"  the sample: {duration(sample.wall)} in all (--sample-seconds {seconds:g}), "
        f"{sample.run}:",
        f"              a run's start {sample.start:.3g} s (Python, fairseq, the data, the model)",
        f"              {len(sample.step_seconds)} updates timed in "
        f"{sum(sample.step_seconds):.3g} s after {sample.warmup} of warm-up: "
        f"{sample.step:.3g} s an update",
        f"              an epoch's end (validation, checkpoint) {sample.epoch_end:.3g} s",
        f"  an epoch:   {sample.updates_per_epoch(world)} updates{shared} ≈ "
        f"{duration(sample.epoch_seconds(world))}",
        f"  a run:      {_span(fewest, most, str)} epochs ≈ "
        f"{_span(sample.run_seconds(fewest, world), sample.run_seconds(most, world), duration)}"
        " (its start included, its evaluation not)"]


def _span(lo: float, hi: float, fmt: Callable[[float], str]) -> str:
    """``fmt(lo)``, or ``fmt(lo) to fmt(hi)`` for a range."""
    return fmt(lo) if lo == hi else f"{fmt(lo)} to {fmt(hi)}"
