"""The chunked loss on the GPU: per chunk of rows three matrix products and one Triton kernel.

``chunks`` computes what ``chunked._chunks`` computes (the summed loss, its nll, the correct
predictions and the three gradients, in fp32) with fewer passes over the R×V scores of a chunk:

    S    = h·W_outᵀ + b                       cuBLAS, into one R×V buffer (model dtype), its
                                              rows padded to a multiple of 16 entries
    per row, one kernel (``_loss_rows``): s_y read first, then two passes over V:
      pass 1  per lane m_k, z_k = Σ exp(s_j − m_k) online, Σ s_j, the first argmax; reduced once:
              m = max_k m_k, Z = Σ_k z_k·exp(m_k − m)
              nll = m + log Z − s_y,  loss = (1 − ε − ε_i)·nll + ε_i·(V·(m + log Z) − Σ_j s_j)
      pass 2  G_j = c·(exp(s_j − m − log Z) − (1 − ε − ε_i)·[j = y] − ε_i), written over s_j
              (0 on a padding row; c = HALF_SCALE for half scores, 1 for fp32)
    ∂/∂h rows  = G·W_out / c                  cuBLAS, fp32 sums, into the N×D fp32 gradient
    ∂/∂W_out  += Gᵀ·h / c                     cuBLAS, fp32 sums, accumulated in place (V×D fp32)
    ∂/∂b      += Σ_rows G / c

The per-row losses go to N-vectors summed once at the end, so nothing waits on the GPU (no
``.item()``, no branch on a GPU value) after the first call's probe (``product_path``: which
implementation of the half products with fp32 sums this torch and device have). One R×V buffer
serves every chunk; a chunk has at least ``min_rows`` rows, so that W_out's two reads and
∂/∂W_out's read and write per chunk are amortized. A half model's scores are rounded to its
dtype as fairseq's are; |G| ≤ 1, so c·G fits fp16 (c = 2¹⁵) and keeps entries down to ~1e-12
that fp16 would flush to 0 (the eager path's ``HALF_SCALE``). Under autocast the inputs are
cast as F.linear's would be (``compute_dtype``).

This module imports only torch and, when it is installed, Triton: without Triton ``wanted``
warns once and the eager path runs. ``FAIRSEQ_TYING_FUSED_LOSS`` chooses: unset, this path for
CUDA tensors when Triton imports; ``1``, also for CPU tensors, whose kernel then runs in
Triton's interpreter (``TRITON_INTERPRET=1``: the tests); ``0``, never.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

# Imported on first use (``available``): Triton reads TRITON_INTERPRET when it is imported, and
# importing the plugin must not fix it before a test (or the GPU script's --tiny) sets it.
triton = tl = None
TRITON_ERROR: str | None = None  # why Triton cannot be imported, once tried

ENV = "FAIRSEQ_TYING_FUSED_LOSS"
HALF_SCALE = 2.0**15  # chunked.HALF_SCALE (this module imports no fairseq)
# Scores a program holds at once: 8 a thread at 8 warps, one 16-byte load of half scores. The
# per-lane state (max, Σ exp, Σ s, argmax) then takes about 51 registers a thread on sm_90, 5
# programs an SM; at 4096 (16 a thread) it took 127, 2 programs an SM.
BLOCK = 2048
MIN_ROWS, MIN_ROWS_PER_DIM = 1024, 2  # min_rows
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


def rows_per_chunk(vocab: int, dtype: torch.dtype, budget_mb: float, dim: int) -> int:
    """Rows whose scores, in the model's dtype, fit ``budget_mb`` (G is written over them), and
    at least ``min_rows(dim)``."""
    return max(min_rows(dim), int(budget_mb * 2**20) // (padded_width(vocab) * dtype.itemsize))


def min_rows(dim: int) -> int:
    """The floor of a chunk's rows, max(MIN_ROWS, MIN_ROWS_PER_DIM·D). Every chunk reads W_out
    twice and reads and writes the fp32 V×D ∂/∂W_out, 12·V·D bytes with half operands, for the
    6·R·V·D flops of its three products: R/2 flops a byte. At V = 250k a 64 MiB budget of fp16
    scores is 134 rows, 67 flops a byte, bound by memory; 1,024 rows give 512, above an H100's
    or H200's tensor-core flops per byte of memory (about 300 and 200). R ≥ 2·D keeps a chunk's
    scores (R·V) larger than the W_out (V·D) it reads twice."""
    return max(MIN_ROWS, MIN_ROWS_PER_DIM * dim)


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
    score is the target's, and with GRADIENT its G written over its scores (module docstring).

    The row holds ``stride`` entries (a multiple of 16, so that every load and store is a
    vector), of which the first ``vocab`` are scores. s_y is read before anything is written to
    the row. Pass 1 keeps, per lane k (entries j ≡ k mod BLOCK), m_k = max s_j, z_k = Σ exp(s_j −
    m_k), t_k = Σ s_j and the first index of m_k, updated with one exp an entry:
    s > m: z ← z·exp(m − s) + 1, m ← s; else z ← z + exp(s − m). The lanes are reduced once after
    the loop: m = max m_k, Z = Σ z_k·exp(m_k − m), Σ s_j = Σ t_k, argmax = the least index whose
    lane holds m."""
    row = tl.program_id(0)
    s_row = scores + row.to(tl.int64) * stride
    y = tl.load(target + row)
    keep = y != ignore_index
    y = tl.where(keep, y, 0)
    s_y = tl.load(s_row + y).to(tl.float32)  # before pass 2 writes G over the row
    cols = tl.arange(0, BLOCK)
    m_k = tl.full([BLOCK], float("-inf"), tl.float32)
    z_k = tl.full([BLOCK], 0.0, tl.float32)
    t_k = tl.full([BLOCK], 0.0, tl.float32)
    i_k = tl.full([BLOCK], 0, tl.int32)
    for start in range(0, stride, BLOCK):
        j = start + cols
        s = tl.load(s_row + j, mask=j < stride, other=0.0).to(tl.float32)
        s = tl.where(j < vocab, s, float("-inf"))  # the padding columns hold anything
        above = s > m_k
        if ACCURACY:  # strictly above: a lane keeps the first index of its highest score
            i_k = tl.where(above, j, i_k)
        top = tl.maximum(m_k, s)
        # exp(min − max) of the two, 0 where both are −inf (a lane without a score yet)
        d = tl.exp(tl.minimum(m_k, s) - tl.where(top == float("-inf"), 0.0, top))
        z_k = tl.where(above, z_k * d + 1.0, z_k + d)
        t_k += tl.where(j < vocab, s, 0.0)
        m_k = top
    m = tl.max(m_k, 0)
    log_z = m + tl.log(tl.sum(z_k * tl.exp(m_k - m), 0))
    nll = log_z - s_y
    loss = on_target * nll + eps_i * (vocab * log_z - tl.sum(t_k, 0))
    tl.store(row_loss + row, tl.where(keep, loss, 0.0))
    tl.store(row_nll + row, tl.where(keep, nll, 0.0))
    if ACCURACY:  # the first index of the highest score, as argmax takes it
        best = tl.min(tl.where(m_k == m, i_k, vocab), 0)
        tl.store(row_correct + row, (keep & (best == y)).to(tl.int32))
    if GRADIENT:
        for start in range(0, stride, BLOCK):
            j = start + cols
            s = tl.load(s_row + j, mask=j < stride, other=0.0).to(tl.float32)
            g = tl.exp(s - log_z) - eps_i - tl.where(j == y, on_target, 0.0)
            # where, not ×0: a padding row's or column's NaN too; the padding columns get 0
            g = tl.where(keep & (j < vocab), g * grad_scale, 0.0)
            tl.store(s_row + j, g.to(scores.dtype.element_ty), mask=j < stride)


# --------------------------------------------------------------------------- the products


def _addmm_mixed(out: Tensor, a: Tensor, b: Tensor, beta: float, alpha: float) -> None:
    """In place, half operands on the tensor cores, fp32 sums into the fp32 ``out``."""
    torch.addmm(out, a, b, out_dtype=torch.float32, beta=beta, alpha=alpha, out=out)


def _addmm_temporary(out: Tensor, a: Tensor, b: Tensor, beta: float, alpha: float) -> None:
    """One fp32 product, then added: for ∂/∂W_out a V×D temporary a chunk."""
    product = torch.mm(a, b, out_dtype=torch.float32).mul_(alpha)
    if beta:
        out.mul_(beta).add_(product)
    else:
        out.copy_(product)


def _addmm_widened(out: Tensor, a: Tensor, b: Tensor, beta: float, alpha: float) -> None:
    """fp32 copies of the operands (a CPU has no half product with fp32 sums)."""
    torch.addmm(out, a.float(), b.float(), beta=beta, alpha=alpha, out=out)


# out = beta·out + alpha·a·b for half a and b, fp32 sums: the first that ``_probe`` finds right
PRODUCTS = {"addmm out_dtype": _addmm_mixed, "mm out_dtype, added": _addmm_temporary,
            "fp32 operands": _addmm_widened}
_probed: dict[tuple[str, torch.dtype], dict] = {}


def product_path(device: torch.device, dtype: torch.dtype) -> str:
    """The name (in ``PRODUCTS``) of the half products' implementation on ``device``, chosen
    by ``_probe`` on the first call and kept: an error in a later product (out of memory) is
    raised, not taken for a missing operator."""
    key = (str(device), dtype)
    if key not in _probed:
        _probed[key] = _probe(device, dtype)
    return _probed[key]["path"]


def probes() -> dict[str, dict]:
    """What each probe chose and why the paths before it were refused, by "device dtype"."""
    return {f"{device} {str(dtype).removeprefix('torch.')}": dict(found)
            for (device, dtype), found in _probed.items()}


def _probe(device: torch.device, dtype: torch.dtype) -> dict:
    """The first of ``PRODUCTS`` that computes both of ``chunks``' products on small operands of
    their layouts (a row stride padded past the columns, one of them transposed; beta = 0 over
    NaN, then beta = 1) within fp32 rounding of the fp64 result."""
    g = torch.Generator().manual_seed(0)
    padded = torch.randn(8, 32, generator=g).to(device, dtype)[:, :20]  # an R×V chunk
    rhs = {False: torch.randn(20, 16, generator=g).to(device, dtype),  # W_out: G·W_out
           True: torch.randn(8, 16, generator=g).to(device, dtype)}  # h: Gᵀ·h
    refused = []
    with torch.autocast(device.type, enabled=False):
        for path, product in PRODUCTS.items():
            try:
                right = all(_right(product, padded.t() if t else padded, b) for t, b in rhs.items())
            except (RuntimeError, TypeError) as error:  # a torch or device without the operator
                refused.append(f"{path}: {type(error).__name__}: {str(error).splitlines()[0]}")
                continue
            if right:
                return {"path": path, "refused": refused}
            refused.append(f"{path}: a wrong result")
    raise RuntimeError(f"no half product with fp32 sums is right on {device}: {refused}")


def _right(product, a: Tensor, b: Tensor) -> bool:
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device=a.device)
    product(out, a, b, 0.0, 0.5)
    product(out, a, b, 1.0, 2.0)
    want = 2.5 * (a.double() @ b.double())
    return out.dtype == torch.float32 and torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5)


def _addmm32(out: Tensor, a: Tensor, b: Tensor, beta: float, alpha: float) -> None:
    """out = beta·out + alpha·a·b with fp32 sums into the fp32 ``out`` (beta = 0: ``out``'s
    contents ignored); half ``a`` and ``b`` by ``product_path``'s implementation."""
    if a.dtype == torch.float32:
        torch.addmm(out, a, b, beta=beta, alpha=alpha, out=out)
    else:
        PRODUCTS[product_path(a.device, a.dtype)](out, a, b, beta, alpha)


def _scores(out: Tensor, h: Tensor, w_out: Tensor, bias: Tensor | None) -> Tensor:
    """S = h·W_outᵀ + b into ``out``, rounded to the model's dtype as F.linear's are."""
    if bias is None:
        return torch.mm(h, w_out.t(), out=out)
    return torch.addmm(bias, h, w_out.t(), out=out)


# ------------------------------------------------------------------------------ the driver


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype of the products: under autocast on ``x``'s device an fp32 ``x``'s is
    autocast's, as F.linear's would be (``out=`` products bypass autocast: ``chunks`` casts
    its inputs itself); else ``x``'s."""
    device = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def padded_width(vocab: int) -> int:
    """The scores buffer's row stride: V rounded up to a multiple of 16 entries (32 bytes in a
    half dtype), so that a row starts aligned and the kernel's loads and stores are vectors."""
    return -(-vocab // 16) * 16


def chunks(hidden: Tensor, w_out: Tensor, bias: Tensor | None, target: Tensor, epsilon: float,
           ignore_index: int, rows: int, grads: tuple[bool, bool, bool], accuracy: bool,
           mark: Callable[[str], None] | None = None):
    """``chunked._chunks``: (loss, nll, n_correct, (∂/∂h, ∂/∂W_out, ∂/∂b)) in fp32, a gradient
    None where its ``grads`` flag is False, n_correct None without ``accuracy``. Under autocast
    the inputs are cast to ``compute_dtype`` first, the products then run without it. ``mark``
    (a timer's) is called with each phase's name once its work is queued: "setup", then per
    chunk "scores", "kernel", "grad_h", "grad_w", "grad_b" (those computed)."""
    dtype = compute_dtype(hidden)
    hidden, w_out = hidden.to(dtype), w_out.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        return _chunks(hidden, w_out, bias, target, epsilon, ignore_index, rows, grads, accuracy,
                       mark or _no_mark)


def _no_mark(phase: str) -> None:
    del phase


def _chunks(hidden: Tensor, w_out: Tensor, bias: Tensor | None, target: Tensor, epsilon: float,
            ignore_index: int, rows: int, grads: tuple[bool, bool, bool], accuracy: bool,
            mark: Callable[[str], None]):
    n, vocab = hidden.shape[0], w_out.shape[0]
    if hidden.dtype != torch.float32 and any(grads):
        product_path(hidden.device, hidden.dtype)  # probed before the first chunk
    fp32 = {"dtype": torch.float32, "device": hidden.device}
    grad_h = torch.empty(n, hidden.shape[1], **fp32) if grads[0] else None
    # the first chunk writes ∂/∂W_out (beta = 0), the others add to it: no zero-fill pass
    grad_w = (torch.empty if n else torch.zeros)(w_out.shape, **fp32) if grads[1] else None
    grad_b = torch.zeros(vocab, **fp32) if grads[2] and bias is not None else None
    row_loss, row_nll = torch.empty(n, **fp32), torch.empty(n, **fp32)
    row_correct = torch.empty(n, dtype=torch.int32, device=hidden.device) if accuracy else None
    buffer = torch.empty(min(rows, n), padded_width(vocab), dtype=hidden.dtype,
                         device=hidden.device)
    scale = 1.0 if hidden.dtype == torch.float32 else HALF_SCALE
    target = target.contiguous()
    mark("setup")
    for start in range(0, n, rows):
        end = min(start + rows, n)
        s = _scores(buffer[:end - start, :vocab], hidden[start:end], w_out, bias)
        mark("scores")
        _launch(s, target[start:end], row_loss[start:], row_nll[start:],
                None if row_correct is None else row_correct[start:], epsilon, ignore_index,
                scale, any(grads))
        mark("kernel")
        if grad_h is not None:
            _addmm32(grad_h[start:end], s, w_out, 0.0, 1 / scale)
            mark("grad_h")
        if grad_w is not None:
            _addmm32(grad_w, s.t(), hidden[start:end], 1.0 if start else 0.0, 1 / scale)
            mark("grad_w")
        if grad_b is not None:
            grad_b.add_(s.sum(0, dtype=torch.float32), alpha=1 / scale)
            mark("grad_b")
    n_correct = row_correct.sum() if accuracy else None
    return row_loss.sum(), row_nll.sum(), n_correct, (grad_h, grad_w, grad_b)


def _launch(s: Tensor, target: Tensor, row_loss: Tensor, row_nll: Tensor,
            row_correct: Tensor | None, epsilon: float, ignore_index: int, scale: float,
            gradient: bool) -> None:
    """``_loss_rows`` over the rows of the chunk ``s`` (R×V, a view of rows padded to
    ``s.stride(0)``, a multiple of 16)."""
    vocab, stride = s.shape[1], s.stride(0)
    eps_i = epsilon / (vocab - 1)
    block = min(BLOCK, triton.next_power_of_2(stride))
    _kernel(_interpreted())[(s.shape[0],)](
        s, stride, target, row_loss, row_nll,
        row_loss if row_correct is None else row_correct,  # unused without ACCURACY
        vocab, ignore_index, 1.0 - epsilon - eps_i, eps_i, scale,
        BLOCK=block, ACCURACY=row_correct is not None, GRADIENT=gradient,
        num_warps=8 if block >= 2048 else 4)
