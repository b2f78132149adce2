"""The loss benchmark's peers (``--peers``): fairseq's formula (``F.linear`` + ``cross_entropy``),
Apple's Cut Cross-Entropy (``cut-cross-entropy``, its ``torch_compile`` implementation, which
runs on the CPU) and the chunked loss, each the summed cross-entropy (ε = 0) of the same random
h, W and targets with its backward, timed in CPU seconds with its peak memory."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from fairseq_tying.bench.loss_report import PEERS
from fairseq_tying.bench.memory import Window
from fairseq_tying.core.criterions.chunked import DEFAULT_MB, linear_label_smoothed_nll_loss

PEER_DIM, PEER_PAD, PEER_SEED = 512, 1, 1


def peer_loss(name: str, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
              budget_mb: float | None) -> torch.Tensor:
    """The summed cross-entropy (ε = 0) of ``target`` under the scores h·Wᵀ, by ``name``."""
    if name == "cce":
        # an optional peer (the dev extra): imported only where it is timed
        from cut_cross_entropy import linear_cross_entropy

        return linear_cross_entropy(hidden, weight, target, ignore_index=PEER_PAD,
                                    reduction="sum", impl="torch_compile")
    if name == "chunked":
        return linear_label_smoothed_nll_loss(hidden, weight, None, target, 0.0, PEER_PAD,
                                              budget_mb=budget_mb or DEFAULT_MB)[0]
    return F.cross_entropy(F.linear(hidden, weight), target, ignore_index=PEER_PAD,
                           reduction="sum")


def peer_inputs(vocab: int, tokens: int, seed: int = PEER_SEED):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, PEER_DIM, generator=g).requires_grad_()
    weight = (torch.randn(vocab, PEER_DIM, generator=g) * PEER_DIM**-0.5).requires_grad_()
    target = torch.randint(2, vocab, (tokens,), generator=g)
    target[::10] = PEER_PAD
    return hidden, weight, target


def peer_worker(spec: dict) -> dict:
    """One peer's loss and backward: a warm-up on 64 rows, then ``steps`` timed ones."""
    torch.set_num_threads(spec["threads"])
    name, mb = spec["peer"], spec.get("chunked_loss_mb")
    peer_loss(name, *peer_inputs(spec["vocab"], 64, seed=0), mb).backward()
    hidden, weight, target = peer_inputs(spec["vocab"], spec["tokens"])
    runs = []
    for _ in range(spec["steps"]):
        hidden.grad = weight.grad = None
        with Window(torch.device("cpu")) as window:
            cpu = time.process_time()
            loss = peer_loss(name, hidden, weight, target, mb)
            loss.backward()
            cpu = time.process_time() - cpu
        runs.append({"cpu_s": cpu, "loss_extra": window.extra, "peak": window.peak,
                     "loss": loss.item()})
    return {"cpu_s": min(r["cpu_s"] for r in runs), "loss": runs[0]["loss"],
            "loss_extra": max(r["loss_extra"] for r in runs),
            "peak": max(r["peak"] for r in runs)}


def measure_peers(opts, report: dict, write, bar, measure: Callable[..., dict]) -> None:
    """Every peer at every batch and V into ``report["peers"]`` (each by ``measure``, the
    benchmark's fresh process); a peer that fails (CCE's torch.compile on a machine without a
    C++ compiler, say) is recorded with its error."""
    steps = opts.steps or 3
    entry = report["peers"] = {"device": "cpu", "dtype": "fp32", "epsilon": 0.0,
                               "dim": PEER_DIM, "steps": steps, "results": {}}
    cce = importlib.util.find_spec("cut_cross_entropy") is not None
    for tokens in opts.tokens:
        by_vocab = entry["results"][str(tokens)] = {}
        for vocab in sorted(opts.vocab):
            res = by_vocab[str(vocab)] = {}
            for peer in PEERS:
                if peer == "cce" and not cce:
                    res[peer] = {"skipped": "cut-cross-entropy is not installed "
                                            "(pip install cut-cross-entropy==25.1.1)"}
                else:
                    res[peer] = measure({"peer": peer, "vocab": vocab, "tokens": tokens,
                                         "steps": steps, "threads": opts.threads,
                                         "chunked_loss_mb": opts.chunked_loss_mb},
                                        keep_error=True)
                bar.update()
            write()
