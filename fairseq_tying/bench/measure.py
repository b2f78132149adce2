"""How the benchmarks measure: seconds per call, interleaved repetitions summarized by their
quartiles, and the peak memory of a block of work (CPU: bytes allocated by the C allocator,
glibc's ``mallinfo2``, sampled every 0.2 ms by a thread, or the resident set size without glibc).
"""

from __future__ import annotations

import ctypes
import os
import statistics
import threading
import time
from collections.abc import Callable

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = [time.perf_counter]


def use_clock(name: str) -> None:
    """Time with ``CLOCKS[name]`` from now on: wall time, or the process's CPU time."""
    _clock[0] = CLOCKS[name]


def timed(fn: Callable, device: torch.device, calls: int) -> float:
    _sync(device)
    start = _clock[0]()
    for _ in range(calls):
        fn()
    _sync(device)
    return (_clock[0]() - start) / calls


def interleaved(fns: dict[str, Callable], device: torch.device, reps: int, calls: int,
                warmup: int, progress) -> dict[str, list[float]]:
    """Seconds per call of each function, ``reps`` times, the order rotating every repetition."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):  # untimed
            fns[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            times[name].append(timed(fns[name], device, calls))
            progress()
    return times


def summarize(ratios: list[float]) -> dict:
    q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {"median": statistics.median(ratios), "q1": q1, "q3": q3, "min": min(ratios),
            "max": max(ratios), "n": len(ratios)}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2() -> Callable[[], int] | None:
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    fn.restype = _MallInfo2
    return lambda: (lambda m: m.uordblks + m.hblkhd)(fn())


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# Bytes the C allocator has handed out and not taken back (glibc), else the resident set size:
# unlike RSS, it does not count memory the allocator keeps after a free.
heap_in_use: Callable[[], int] = _mallinfo2() or current_rss


class PeakMemory:
    """Highest ``heap_in_use()`` while the block runs, sampled every 0.2 ms by a thread."""

    def __init__(self):
        self.peak = heap_in_use()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, heap_in_use())
            time.sleep(0.0002)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, heap_in_use())
