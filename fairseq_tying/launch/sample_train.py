"""A short timed sample of a run's training, in a process of its own:

    python -m fairseq_tying.launch.sample_train RESULT.json WARMUP SECONDS DATA FLAGS...

runs fairseq-train on ``DATA FLAGS...`` (a run's command) and times every update through the
training loop's ``validate_and_save`` (``fairseq_hooks``), which fairseq calls after each one.
After ``WARMUP`` updates (the first steps allocate the optimizer's state, fill caches) it times
updates until ``SECONDS`` have passed (at least ``MIN_TIMED`` updates, at most ``MAX_TIMED``),
then runs the end of an epoch once (validation and checkpoint, as fairseq does at every epoch's
end) and stops. ``RESULT.json`` holds the times and the epoch's batch count from fairseq's own
batch sampler; ``RESULT.json.progress`` the updates so far, for the caller's progress line.

A process of its own: it imports ``fairseq_cli.train`` (which the plugin reads as running under
fairseq-train), and its kernels and threads must be those of a run (``pinned_env``), set before
torch is imported.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fairseq_tying.common.reproducible import cpu_name
from fairseq_tying.launch import fairseq_hooks

MIN_TIMED = 5  # updates timed however long each takes: a mean of fewer says little
MAX_TIMED = 400  # a model of milliseconds an update stops there: more adds no precision
PROGRESS_EVERY_S = 0.5


class Timer:
    """fairseq's ``validate_and_save`` wrapped: the time of each update (from the end of the
    previous call to the start of this one: the batch's loading and its training step) and of
    each epoch's end (the call that validates and saves)."""

    def __init__(self, warmup: int, seconds: float, result: Path) -> None:
        self.warmup, self.seconds, self.result = warmup, seconds, result
        self.calls = 0
        self.steps: list[float] = []  # timed updates, in seconds
        self.epoch_ends: list[float] = []
        self.left: tuple[float, int] | None = None  # (time, epoch) the last call returned
        self.batches = self.update_freq = 0
        self.device = "cpu"
        self.shown = 0.0
        self.first_update = 0.0  # time.time() of the first update's end: the start's cost

    def _now(self) -> float:
        if self.device != "cpu":
            torch.cuda.synchronize()  # CUDA runs ahead of Python: wait for the step's kernels
        return time.perf_counter()

    def __call__(self, original: Any, cfg: Any, trainer: Any, task: Any, epoch_itr: Any,
                 valid_subsets: list[str], end_of_epoch: bool) -> tuple[list, bool]:
        if self.calls == 0:
            self._first(cfg, trainer, epoch_itr)
        entered = self._now()
        epoch = epoch_itr.epoch
        self.calls += 1
        # an update that follows an epoch's end also built the next epoch's batches: not timed
        if self.calls > self.warmup and self.left is not None and self.left[1] == epoch:
            self.steps.append(entered - self.left[0])
        self._progress()
        done = len(self.steps) >= MIN_TIMED and (sum(self.steps) >= self.seconds
                                                 or len(self.steps) >= MAX_TIMED)
        losses, stop = original(cfg, trainer, task, epoch_itr, valid_subsets,
                                end_of_epoch or done)
        left = self._now()
        if end_of_epoch or done:
            self.epoch_ends.append(left - entered)
        self.left = (left, epoch)
        return losses, stop or done

    def _first(self, cfg: Any, trainer: Any, epoch_itr: Any) -> None:
        """What the first update tells: the device, the batches of an epoch on one device."""
        self.first_update = time.time()  # the clock the caller reads when it starts us
        self.device = next(trainer.model.parameters()).device.type
        self.batches = len(epoch_itr)
        self.update_freq = cfg.optimization.update_freq[0]

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self.shown >= PROGRESS_EVERY_S:
            self.shown = now
            Path(f"{self.result}.progress").write_text(f"{self.calls}\n")

    def facts(self) -> dict[str, Any]:
        """What ``RESULT.json`` holds."""
        return {"warmup": self.warmup, "step_seconds": self.steps,
                "epoch_end_seconds": self.epoch_ends, "batches": self.batches,
                "update_freq": self.update_freq,
                "updates_per_epoch": math.ceil(self.batches / max(self.update_freq, 1)),
                "updates": self.calls, "first_update": self.first_update,
                "device": self._device_name(), "cpu": cpu_name(),
                "threads": torch.get_num_threads()}

    def _device_name(self) -> str:
        return torch.cuda.get_device_name(0) if self.device == "cuda" else "cpu"


def main(argv: list[str]) -> int:
    result, warmup, seconds, *train = argv
    timer = Timer(int(warmup), float(seconds), Path(result))
    fairseq_hooks.wrap_validate_and_save(timer)
    fairseq_hooks.run_fairseq_train(["fairseq-train", *train])
    Path(result).write_text(json.dumps(timer.facts(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
