"""Peak memory over a block of code: the resident set on the CPU (Linux's /proc), the CUDA
allocator's peak on a GPU. The loss benchmark's configurations and its peers are measured
through it."""

from __future__ import annotations

import torch


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}: the CPU memory needs Linux")


class Window:
    """Peak memory over the memory at the start of a ``with`` block (CPU: resident set)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else _status("VmRSS")

    def __enter__(self) -> Window:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := VmRSS
        self.start = self.now()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.peak = torch.cuda.max_memory_allocated() if self.cuda else _status("VmHWM")
        self.extra = self.peak - self.start
