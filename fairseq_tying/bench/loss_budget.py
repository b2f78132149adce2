"""The largest batch that fits a memory budget, from the loss benchmark's measured peaks.

A step's peak memory is linear in its number of target tokens N (activations, scores and
their gradients all grow with N; weights and optimizer state do not): peak = a + b·N. The
line is fitted by least squares to steps of ``FIT_TOKENS`` and the measured ``--tokens``, and
the largest batch within B bytes is N = (B − a)/b, for fairseq's loss and for the chunked one.
A configuration's peak is also extrapolated linearly in V before it runs, so that the CPU
benchmark skips one that would not fit the machine's memory.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

FIT_TOKENS = (1024, 2048)  # with the --tokens: the points of the memory-vs-tokens fit
BUDGET_MODELS = ("builtin", "chunked")  # the losses whose largest batch is compared


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where the kernel does not say."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemAvailable"]
    except (OSError, KeyError):
        return None


def predicted_peak(results: dict, model: str, vocab: int) -> int | None:
    """Peak of ``model`` at ``vocab`` extrapolated linearly in V from the largest measured V
    (``results``: one batch size's, by V)."""
    done = [(int(v), r[model]["peak"]) for v, r in results.items() if "peak" in r.get(model, {})]
    if not done:
        return None
    v0, p0 = max(done)
    return int(p0 * vocab / v0)


def fit_line(points: list[tuple[int, int]]) -> dict:
    """The least-squares line peak = a + b·tokens (numpy's), and its largest residual."""
    x, y = np.array(points, dtype=np.float64).T
    b, a = np.polyfit(x, y, 1)
    return {"fixed_bytes": float(a), "bytes_per_token": float(b), "points": points,
            "max_residual_bytes": float(np.abs(y - a - b * x).max())}


def max_tokens(results: dict, run: Callable[[str, int, int], dict], budget_gb: float,
               vocab: int, tokens: list[int]) -> dict:
    """The largest batch (target tokens) whose step peak fits ``budget_gb`` GiB at ``vocab``,
    fairseq's loss against the chunked one. ``results``: the setup's measured steps, by tokens
    and V; ``run(model, vocab, tokens)`` measures one more step (the ``FIT_TOKENS``)."""
    budget = int(budget_gb * 2**30)
    out = {"budget_bytes": budget, "vocab": vocab}
    for model in BUDGET_MODELS:
        points = [(t, run(model, vocab, t)["peak"]) for t in FIT_TOKENS]
        points += [(t, results[str(t)][str(vocab)][model]["peak"]) for t in tokens
                   if "peak" in results[str(t)][str(vocab)][model]]
        line = fit_line(points)
        line["max_tokens"] = int((budget - line["fixed_bytes"]) / line["bytes_per_token"])
        out[model] = line
    out["ratio"] = out["chunked"]["max_tokens"] / out["builtin"]["max_tokens"]
    return out
