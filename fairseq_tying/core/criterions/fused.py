"""The chunked loss on the GPU: per chunk of rows three matrix products and one Triton kernel.

``chunks`` computes what ``chunked._chunks`` computes (the summed loss, its nll, the correct
predictions and the three gradients, in fp32) with fewer passes over the R×V scores of a chunk:

    S    = h·W_outᵀ + b                       cuBLAS, written into one R×V buffer (model dtype)
    per row, one kernel (``_loss_rows``), two passes over V:
      pass 1  m = max_j s_j and Z = Σ_j exp(s_j − m) online, Σ_j s_j, s_y, the first argmax
              nll = m + log Z − s_y,  loss = (1 − ε − ε_i)·nll + ε_i·(V·(m + log Z) − Σ_j s_j)
      pass 2  G_j = c·(exp(s_j − m − log Z) − (1 − ε − ε_i)·[j = y] − ε_i), written over s_j
              (0 on a padding row; c = HALF_SCALE for half scores, 1 for fp32)
    ∂/∂h rows  = G·W_out / c                  cuBLAS, fp32 sums, into the N×D fp32 gradient
    ∂/∂W_out  += Gᵀ·h / c                     cuBLAS, fp32 sums, accumulated in place (V×D fp32)
    ∂/∂b      += Σ_rows G / c

The per-row losses go to N-vectors summed once at the end, so nothing waits on the GPU (no
``.item()``, no branch on a GPU value). One R×V buffer serves every chunk. A half model's
scores are rounded to its dtype as fairseq's are; |G| ≤ 1, so c·G fits fp16 (c = 2¹⁵) and keeps
entries down to ~1e-12 that fp16 would flush to 0 (the eager path's ``HALF_SCALE``).

This module imports only torch and, when it is installed, Triton: without Triton ``wanted``
warns once and the eager path runs. ``FAIRSEQ_TYING_FUSED_LOSS`` chooses: unset, this path for
CUDA tensors when Triton imports; ``1``, also for CPU tensors, whose kernel then runs in
Triton's interpreter (``TRITON_INTERPRET=1``: the tests); ``0``, never.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
from torch import Tensor

# Imported on first use (``available``): Triton reads TRITON_INTERPRET when it is imported, and
# importing the plugin must not fix it before a test (or the GPU script's --tiny) sets it.
triton = tl = None
TRITON_ERROR: str | None = None  # why Triton cannot be imported, once tried

ENV = "FAIRSEQ_TYING_FUSED_LOSS"
HALF_SCALE = 2.0**15  # chunked.HALF_SCALE (this module imports no fairseq)
BLOCK = 4096  # scores a program holds at once: 16 a thread at 8 warps
_warned: list[bool] = []


def available() -> bool:
    """Whether Triton imports (tried once)."""
    global triton, tl, TRITON_ERROR
    if triton is None and TRITON_ERROR is None:
        try:
            import triton as triton_module  # here, not at the top: see ``triton = tl = None``
            import triton.language as language
        except (ImportError, OSError, RuntimeError) as error:  # a CPU install: the eager path
            TRITON_ERROR = f"{type(error).__name__}: {error}"
        else:
            triton, tl = triton_module, language
    return triton is not None


def wanted(x: Tensor) -> bool:
    """Whether the chunked loss of ``x``'s rows takes this path (``FAIRSEQ_TYING_FUSED_LOSS``,
    the device, Triton); warns once where Triton is missing."""
    mode = os.environ.get(ENV, "")
    if mode == "0" or (x.device.type != "cuda" and mode != "1"):
        return False
    if not available():
        if not _warned:
            _warned.append(True)
            warnings.warn(f"the chunked loss runs its eager path: Triton cannot be imported "
                          f"({TRITON_ERROR}); pip install triton", stacklevel=3)
        return False
    if x.device.type != "cuda" and not _interpreted():
        raise RuntimeError(f"{ENV}=1 on {x.device.type} tensors runs the kernel in Triton's "
                           "interpreter: set TRITON_INTERPRET=1 before the first call")
    return True


def rows_per_chunk(vocab: int, dtype: torch.dtype, budget_mb: float) -> int:
    """Rows whose scores, in the model's dtype, fit ``budget_mb`` (G is written over them)."""
    return max(1, int(budget_mb * 2**20) // (vocab * torch.finfo(dtype).bits // 8))


def _interpreted() -> bool:
    return triton is not None and bool(triton.knobs.runtime.interpret)


@functools.cache
def _kernel(interpreted: bool):
    """``_loss_rows`` compiled (or, ``interpreted``, run by Triton's interpreter, which
    ``triton.jit`` picks from TRITON_INTERPRET when it wraps the function: hence the key)."""
    del interpreted
    return triton.jit(_loss_rows)


def _loss_rows(scores, stride, target, row_loss, row_nll, row_correct, vocab, ignore_index,
               on_target, eps_i, grad_scale, BLOCK: tl.constexpr, ACCURACY: tl.constexpr,
               GRADIENT: tl.constexpr):
    """One program a row: its loss and nll (0 on a padding row), whether its first highest
    score is the target's, and with GRADIENT its G written over its scores (module docstring)."""
    row = tl.program_id(0)
    s_row = scores + row.to(tl.int64) * stride
    y = tl.load(target + row)
    keep = y != ignore_index
    y = tl.where(keep, y, 0)
    cols = tl.arange(0, BLOCK)
    m = float("-inf")
    z = 0.0
    total = 0.0
    best = 0
    for start in range(0, vocab, BLOCK):
        mask = start + cols < vocab
        s = tl.load(s_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        top = tl.max(s, 0)
        if ACCURACY:  # the first index of the highest score, as argmax takes it
            best = tl.where(top > m, start + tl.argmax(s, 0, tie_break_left=True), best)
        new_m = tl.maximum(m, top)
        z = z * tl.exp(m - new_m) + tl.sum(tl.exp(s - new_m), 0)
        total += tl.sum(tl.where(mask, s, 0.0), 0)
        m = new_m
    log_z = m + tl.log(z)
    nll = log_z - tl.load(s_row + y).to(tl.float32)
    loss = on_target * nll + eps_i * (vocab * log_z - total)
    tl.store(row_loss + row, tl.where(keep, loss, 0.0))
    tl.store(row_nll + row, tl.where(keep, nll, 0.0))
    if ACCURACY:
        tl.store(row_correct + row, (keep & (best == y)).to(tl.int32))
    if GRADIENT:
        for start in range(0, vocab, BLOCK):
            mask = start + cols < vocab
            s = tl.load(s_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.exp(s - log_z) - eps_i - tl.where(start + cols == y, on_target, 0.0)
            g = tl.where(keep, g * grad_scale, 0.0)  # where, not ×0: a padding row's NaN too
            tl.store(s_row + start + cols, g.to(scores.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- the products

_MIXED_ADDMM = [True]  # cleared once torch refuses an fp32 ``out`` for half operands


def _addmm32(out: Tensor, a: Tensor, b: Tensor, beta: float, alpha: float) -> None:
    """out = beta·out + alpha·a·b with fp32 sums into the fp32 ``out`` (beta = 0: ``out``'s
    contents ignored); half ``a`` and ``b`` stay half on the tensor cores."""
    if a.dtype == torch.float32:
        torch.addmm(out, a, b, beta=beta, alpha=alpha, out=out)
    elif not a.is_cuda:  # torch's CPU has no half GEMM with fp32 output (the interpreted tests)
        torch.addmm(out, a.float(), b.float(), beta=beta, alpha=alpha, out=out)
    elif _MIXED_ADDMM:
        try:
            torch.addmm(out, a, b, out_dtype=torch.float32, beta=beta, alpha=alpha, out=out)
        except RuntimeError:  # a torch whose out_dtype addmm wants self in a's dtype
            _MIXED_ADDMM.clear()
            _addmm32(out, a, b, beta, alpha)
    else:  # one fp32 product a chunk, added: the V×D temporary this module otherwise avoids
        product = torch.mm(a, b, out_dtype=torch.float32).mul_(alpha)
        if beta:
            out.mul_(beta).add_(product)
        else:
            out.copy_(product)


def _scores(out: Tensor, h: Tensor, w_out: Tensor, bias: Tensor | None) -> Tensor:
    """S = h·W_outᵀ + b into ``out``, rounded to the model's dtype as F.linear's are."""
    if bias is None:
        return torch.mm(h, w_out.t(), out=out)
    return torch.addmm(bias, h, w_out.t(), out=out)


# ------------------------------------------------------------------------------ the driver


def chunks(hidden: Tensor, w_out: Tensor, bias: Tensor | None, target: Tensor, epsilon: float,
           ignore_index: int, rows: int, grads: tuple[bool, bool, bool], accuracy: bool):
    """``chunked._chunks``: (loss, nll, n_correct, (∂/∂h, ∂/∂W_out, ∂/∂b)) in fp32, a gradient
    None where its ``grads`` flag is False, n_correct None without ``accuracy``."""
    n, vocab = hidden.shape[0], w_out.shape[0]
    fp32 = {"dtype": torch.float32, "device": hidden.device}
    grad_h = torch.empty(n, hidden.shape[1], **fp32) if grads[0] else None
    # the first chunk writes ∂/∂W_out (beta = 0), the others add to it: no zero-fill pass
    grad_w = (torch.empty if n else torch.zeros)(w_out.shape, **fp32) if grads[1] else None
    grad_b = torch.zeros(vocab, **fp32) if grads[2] and bias is not None else None
    row_loss, row_nll = torch.empty(n, **fp32), torch.empty(n, **fp32)
    row_correct = torch.empty(n, dtype=torch.int32, device=hidden.device) if accuracy else None
    buffer = torch.empty(min(rows, n), vocab, dtype=hidden.dtype, device=hidden.device)
    scale = 1.0 if hidden.dtype == torch.float32 else HALF_SCALE
    target = target.contiguous()
    for start in range(0, n, rows):
        end = min(start + rows, n)
        s = _scores(buffer[:end - start], hidden[start:end], w_out, bias)
        _launch(s, target[start:end], row_loss[start:], row_nll[start:],
                None if row_correct is None else row_correct[start:], epsilon, ignore_index,
                scale, any(grads))
        if grad_h is not None:
            _addmm32(grad_h[start:end], s, w_out, 0.0, 1 / scale)
        if grad_w is not None:
            _addmm32(grad_w, s.t(), hidden[start:end], 1.0 if start else 0.0, 1 / scale)
        if grad_b is not None:
            grad_b.add_(s.sum(0, dtype=torch.float32), alpha=1 / scale)
    n_correct = row_correct.sum() if accuracy else None
    return row_loss.sum(), row_nll.sum(), n_correct, (grad_h, grad_w, grad_b)


def _launch(s: Tensor, target: Tensor, row_loss: Tensor, row_nll: Tensor,
            row_correct: Tensor | None, epsilon: float, ignore_index: int, scale: float,
            gradient: bool) -> None:
    """``_loss_rows`` over the rows of the chunk ``s`` (R×V, contiguous)."""
    vocab = s.shape[1]
    eps_i = epsilon / (vocab - 1)
    block = min(BLOCK, triton.next_power_of_2(vocab))
    _kernel(_interpreted())[(s.shape[0],)](
        s, s.stride(0), target, row_loss, row_nll,
        row_loss if row_correct is None else row_correct,  # unused without ACCURACY
        vocab, ignore_index, 1.0 - epsilon - eps_i, eps_i, scale,
        BLOCK=block, ACCURACY=row_correct is not None, GRADIENT=gradient,
        num_warps=8 if block >= 2048 else 4)
