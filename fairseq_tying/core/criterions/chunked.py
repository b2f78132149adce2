"""The output layer and the loss in one chunked pass (``--chunked-loss``).

Every output layer scores s = t(a), a = ĥ·W_outᵀ + b (core/layer_contract.py). fairseq's
label-smoothed cross-entropy (``label_smoothed_nll_loss`` over ``log_softmax(s)``) with the
z-loss λ·(log Z)² (``--z-loss``, PaLM's) is, per target y,

    nll    = log Z − s_y                        log Z = log Σ_j exp s_j
    smooth = −Σ_j log p_j = V·log Z − Σ_j s_j    p_j = exp(s_j − log Z)
    loss   = (1 − ε − ε_i)·nll + ε_i·smooth + λ·(log Z)²      ε_i = ε/(V − 1)

summed over the targets that are not padding (ε = 0: the plain cross-entropy). Since
(1 − ε − ε_i) + V·ε_i = 1 and ∂(log Z)²/∂s_j = 2·log Z·p_j, its gradient with respect to the
affine scores a of a row is

    G_j = ∂loss/∂a_j = (p_j·(1 + 2λ·log Z) − (1 − ε − ε_i)·[j = y] − ε_i)·t′(a_j)
                                                                (0 on a padding row; t′ = 1
                                                                 for an affine layer)

and ∂loss/∂ĥ = G·W_out, ∂loss/∂W_out = Gᵀ·ĥ, ∂loss/∂b = Σ_rows G.

``linear_label_smoothed_nll_loss`` computes all of it in one pass over chunks of rows: a chunk's
scores are computed once (one matrix product), log Z in fp32, and the scores are turned into G in
place, so the N×V scores, their log-softmax and their gradient never exist whole. The chunk's
rows follow from a memory budget (``rows_per_chunk``). The loss and the three gradients are summed
in fp32 during the forward; the backward only multiplies them by the loss's gradient (fairseq's
loss scale under ``--fp16``), so a small G·W of a half model cannot flush to zero before the scale
is applied. W_out and b may be functions of the parameters (``unit_rows(W)``, −½‖w‖²): their
gradients flow on through autograd. On CUDA with Triton each chunk of an affine layer without
z-loss runs fused.py's path instead (cuBLAS products and one kernel between them, the same
sums; ``FAIRSEQ_TYING_FUSED_LOSS``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import field

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.logging import metrics
from torch import Tensor

from . import fused  # relative: scripts/gpu_fused_loss.py loads this file outside the package

# Scores per chunk: 64 MiB of fp32 scores is 524 rows at V = 32,000, 131 at V = 128,000 (a
# half model's 6 bytes a score: 349 and 87; rows_per_chunk). On the CPU (one thread, D = 512,
# 4k tokens) 32 to 256 MiB took about the same time at V = 8k to 128k (256 MiB 7 % less at
# 128k), 16 MiB 15 % more at 64k (each chunk adds Gᵀ·h into the whole V×D gradient); 64 MiB
# keeps the loss's memory under 1/4 of the built-in's from V = 32k.
DEFAULT_MB = 64.0
# |G| ≤ 1, so G·2¹⁵ fits fp16 (max 65504) and keeps entries down to ~1e-12 that fp16 flushes to 0
HALF_SCALE = 2.0**15
# (t, t′) of a layer's element-wise transform, its settings bound; None: affine scores
Transform = tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]


def chunked_loss_field():
    return field(default=False, metadata={
        "help": "compute the loss from the decoder's features and the output layer's (W_out, b) "
                "in chunks of rows, without the N x V scores (the plugin's models only)"})


def no_chunked_loss_field():
    return field(default=False, metadata={
        "help": "compute the loss from the N x V scores as fairseq does, where --chunked-loss "
                "would be the default"})


def z_loss_field():
    return field(default=0.0, metadata={
        "help": "weight λ of the z-loss λ·(log Z)² per target token, Z the softmax's "
                "normalizer (PaLM's λ = 1e-4; default 0: none), logged as z_loss"})


def chunked_loss_mb_field():
    return field(default=DEFAULT_MB, metadata={
        "help": f"--chunked-loss: MiB of scores per chunk of rows (default {DEFAULT_MB:g})"})


def rows_per_chunk(vocab: int, dtype: torch.dtype, budget_mb: float) -> int:
    """Rows whose scores fit ``budget_mb``: 4 bytes a score in fp32, and for a half model its
    scores before the cast or the rounded G besides."""
    per_score = 4 if dtype == torch.float32 else 4 + torch.finfo(dtype).bits // 8
    return max(1, int(budget_mb * 2**20) // (vocab * per_score))


def _mm32(a: Tensor, b: Tensor) -> Tensor:
    """a·b summed and returned in fp32, for half a and b."""
    if a.is_cuda:  # the half tensor cores, fp32 sums
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()  # the CPU's half products are emulated, slower than fp32


def _score_gradient(p: Tensor, z: Tensor, y: Tensor, keep: Tensor, on_target: float,
                    eps_i: float, z_scale: Tensor | None) -> Tensor:
    """G = p·(1 + 2λ·log Z) − (1 − ε − ε_i)·[j = y] − ε_i, 0 on padding rows, in place of
    p = exp(s − max); ``z_scale``: 1 + 2λ·log Z per row (None without z-loss)."""
    row = torch.where(keep, z.reciprocal(), 0.0)
    g = p.mul_((row if z_scale is None else row * z_scale)[:, None])
    g.scatter_add_(1, y[:, None], (-on_target * keep)[:, None].float())
    if eps_i:
        g.sub_((eps_i * keep)[:, None])
    return g


def _add_products(g: Tensor, h: Tensor, w_out: Tensor, grad_h_rows: Tensor | None,
                  grad_w: Tensor | None, grad_b: Tensor | None) -> None:
    """Writes the chunk's rows of ∂/∂h = G·W_out and adds Gᵀ·h to ∂/∂W_out and Σ G to ∂/∂b."""
    if grad_b is not None:
        grad_b += g.sum(0)
    if h.dtype == torch.float32:
        if grad_h_rows is not None:
            torch.mm(g, w_out, out=grad_h_rows)
        if grad_w is not None:
            grad_w.addmm_(g.t(), h)
        return
    g = g.mul_(HALF_SCALE).to(h.dtype)  # a half product's operand: scaled, rounded
    if grad_h_rows is not None:
        grad_h_rows.copy_(_mm32(g, w_out).div_(HALF_SCALE))
    if grad_w is not None:
        grad_w.add_(_mm32(g.t(), h), alpha=1 / HALF_SCALE)


def fused_computes(transform: Transform | None, z_loss: float) -> bool:
    """Whether fused.py's kernel computes this loss: affine scores (no t), no z-loss."""
    return transform is None and not z_loss


def _fused(hidden: Tensor, transform: Transform | None, z_loss: float) -> bool:
    # the others take the eager path, whatever FAIRSEQ_TYING_FUSED_LOSS says
    return fused_computes(transform, z_loss) and fused.wanted(hidden)


def _chunks(hidden: Tensor, w_out: Tensor, bias: Tensor | None, target: Tensor, epsilon: float,
            ignore_index: int, rows: int, grads: tuple[bool, bool, bool], accuracy: bool,
            transform: Transform | None = None, z_loss: float = 0.0):
    """(loss, nll, Σ λ·(log Z)², n_correct, (∂/∂h, ∂/∂W_out, ∂/∂b)) in fp32; a gradient is None
    where its ``grads`` flag is False, n_correct None without ``accuracy``."""
    if _fused(hidden, transform, z_loss):
        loss, nll, n_correct, found = fused.chunks(hidden, w_out, bias, target, epsilon,
                                                   ignore_index, rows, grads, accuracy)
        return loss, nll, torch.zeros_like(loss), n_correct, found
    n, vocab = hidden.shape[0], w_out.shape[0]
    eps_i = epsilon / (vocab - 1)
    on_target = 1.0 - epsilon - eps_i
    keep = target.ne(ignore_index)
    target = torch.where(keep, target, 0)
    fp32 = {"dtype": torch.float32, "device": hidden.device}
    loss, nll, z_sum = (torch.zeros((), **fp32) for _ in range(3))
    n_correct = torch.zeros((), dtype=torch.long, device=hidden.device) if accuracy else None
    grad_h = torch.empty(n, hidden.shape[1], **fp32) if grads[0] else None
    grad_w = torch.zeros(w_out.shape, **fp32) if grads[1] else None
    grad_b = torch.zeros(vocab, **fp32) if grads[2] and bias is not None else None
    for start in range(0, n, rows):
        h, y, k = hidden[start:start + rows], target[start:start + rows], keep[start:start + rows]
        s = F.linear(h, w_out, bias).float()  # a half model's scores rounded as fairseq's are
        slope = None
        if transform is not None:  # t′ at the affine scores, then s = t(a)
            slope, s = transform[1](s), transform[0](s)
        top, pred = s.max(-1) if accuracy else (s.amax(-1), None)
        s_y = s.gather(1, y[:, None]).squeeze(1)
        total = s.sum(-1) if epsilon else None
        p = s.sub_(top[:, None]).exp_()  # exp(s − max), in place
        z = p.sum(-1)
        log_z = top + z.log()
        row_nll = log_z - s_y
        row_loss = on_target * row_nll + eps_i * (vocab * log_z - total) if epsilon else row_nll
        nll += torch.where(k, row_nll, 0.0).sum()
        if z_loss:
            row_z = z_loss * log_z.square()
            z_sum += torch.where(k, row_z, 0.0).sum()
            row_loss = row_loss + row_z
        loss += torch.where(k, row_loss, 0.0).sum()
        if accuracy:
            n_correct += (pred.eq(y) & k).sum()
        if any(grads):
            # |G| < 2, as a half model's HALF_SCALE needs, while |2λ·log Z| < 1 and t′ ≤ 1
            g = _score_gradient(p, z, y, k, on_target, eps_i,
                                1 + 2 * z_loss * log_z if z_loss else None)
            if slope is not None:
                g.mul_(slope)
            _add_products(g, h, w_out, None if grad_h is None else grad_h[start:start + rows],
                          grad_w, grad_b)
    return loss, nll, z_sum, n_correct, (grad_h, grad_w, grad_b)


class _LinearLabelSmoothedNLL(torch.autograd.Function):
    """The summed loss, its nll, its z-loss term and the correct predictions (not
    differentiable) of ``_chunks``; the gradients computed in the forward, scaled in the
    backward."""

    @staticmethod
    def forward(ctx, hidden, w_out, bias, target, epsilon, ignore_index, rows, accuracy,
                transform, z_loss):
        loss, nll, z_sum, n_correct, grads = _chunks(
            hidden, w_out, bias, target, epsilon, ignore_index, rows, ctx.needs_input_grad[:3],
            accuracy, transform, z_loss)
        ctx.save_for_backward(*grads)
        ctx.dtypes = (hidden.dtype, w_out.dtype, None if bias is None else bias.dtype)
        ctx.done = False
        if n_correct is None:
            n_correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        ctx.mark_non_differentiable(nll, z_sum, n_correct)
        return loss, nll, z_sum, n_correct

    @staticmethod
    def backward(ctx, grad_loss, *_):
        if ctx.done:  # the saved gradients were scaled in place
            raise RuntimeError("the chunked loss supports one backward pass (no retain_graph)")
        ctx.done = True
        return (*(None if g is None else g.mul_(grad_loss).to(dtype)
                  for g, dtype in zip(ctx.saved_tensors, ctx.dtypes, strict=True)),
                None, None, None, None, None, None, None)


def linear_label_smoothed_nll_loss(hidden: Tensor, w_out: Tensor, bias: Tensor | None,
                                   target: Tensor, epsilon: float, ignore_index: int,
                                   reduce: bool = True, budget_mb: float = DEFAULT_MB,
                                   accuracy: bool = False
                                   ) -> tuple[Tensor, Tensor, Tensor | None]:
    """fairseq's ``label_smoothed_nll_loss(log_softmax(hidden @ w_out.T + bias), target, ...)``
    (loss, nll_loss) in fp32 for ``hidden`` (N, D) and ``target`` (N,), and with ``accuracy``
    the number of non-padding rows whose highest score is the target's (``linear_loss_terms``
    of an affine layer without z-loss)."""
    loss, nll, _, n_correct = linear_loss_terms(hidden, w_out, bias, target, epsilon,
                                                ignore_index, reduce, budget_mb, accuracy)
    return loss, nll, n_correct


def linear_loss_terms(hidden: Tensor, w_out: Tensor, bias: Tensor | None, target: Tensor,
                      epsilon: float, ignore_index: int, reduce: bool = True,
                      budget_mb: float = DEFAULT_MB, accuracy: bool = False,
                      transform: Transform | None = None, z_loss: float = 0.0
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """fairseq's ``label_smoothed_nll_loss(log_softmax(t(hidden @ w_out.T + bias)), target,
    ...)`` (loss, nll_loss) plus the z-loss λ·(log Z)², in fp32, for ``hidden`` (N, D) and
    ``target`` (N,); the z-loss term apart (0 without ``z_loss``); with ``accuracy`` the number
    of non-padding rows whose highest score is the target's. ``reduce=False`` (per-token
    losses, which no training step asks for) takes fairseq's own formula over the N×V
    scores."""
    if not reduce:
        scores = F.linear(hidden, w_out, bias).float()
        scores = scores if transform is None else transform[0](scores)
        lprobs = F.log_softmax(scores, dim=-1)
        loss, nll = label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index, reduce=False)
        z_term = z_loss_terms(scores, target, ignore_index, z_loss)
        correct = lprobs.argmax(-1).eq(target) & target.ne(ignore_index) if accuracy else None
        return (loss + z_term.view_as(loss), nll, z_term,
                None if correct is None else correct.sum())
    if _fused(hidden, transform, z_loss):
        rows = fused.rows_per_chunk(w_out.shape[0], fused.compute_dtype(hidden), budget_mb,
                                    hidden.shape[1])
    else:
        # a transform keeps t′ and t(a) beside a chunk's scores: three R×V tensors in the budget
        rows = rows_per_chunk(w_out.shape[0], hidden.dtype, budget_mb / (3 if transform else 1))
    inputs = (hidden, w_out, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
        loss, nll, z_sum, n_correct = _LinearLabelSmoothedNLL.apply(
            *inputs, target, epsilon, ignore_index, rows, accuracy, transform, z_loss)
    else:
        loss, nll, z_sum, n_correct, _ = _chunks(*inputs, target, epsilon, ignore_index, rows,
                                                 (False,) * 3, accuracy, transform, z_loss)
    return loss, nll, z_sum, n_correct if accuracy else None


def z_loss_terms(scores: Tensor, target: Tensor, ignore_index: int, z_loss: float) -> Tensor:
    """λ·(log Z)² of each row of ``scores`` (N, V), in fp32; 0 on padding rows."""
    if not z_loss:
        return scores.new_zeros(target.shape, dtype=torch.float32)
    log_z = torch.logsumexp(scores.float(), dim=-1)
    return torch.where(target.ne(ignore_index), z_loss * log_z.square(), 0.0)


# Where the criterions take the chunked loss without --chunked-loss: device type → the smallest
# V (None: never). CPU from 8k: there it took less CPU time than fairseq's loss at every V timed
# (8k to 128k, fp32, 4k tokens); smaller V untimed. CUDA: off, the step 1.1-3.5x fairseq's wall
# time on an H200 (fp16 and bf16, 8k to 250k). docs/performance.md has the tables.
CHUNKED_BY_DEFAULT: dict[str, int | None] = {"cpu": 8000, "cuda": None}


def chunked_by_default(device: torch.device, vocab: int) -> bool:
    """Whether a plugin criterion computes the chunked loss when neither --chunked-loss nor
    --no-chunked-loss is given."""
    smallest = CHUNKED_BY_DEFAULT.get(device.type)
    return smallest is not None and vocab >= smallest


def log_z_loss(logging_outputs: list[dict]) -> None:
    """Logs z_loss, where the steps had one, in the loss's unit (base 2, per sample_size):
    loss − z_loss is the cross-entropy."""
    if any("z_loss" in log for log in logging_outputs):
        total = sum(float(log.get("z_loss", 0)) for log in logging_outputs)
        size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("z_loss", total / size / math.log(2), size, round=3)


class ChunkedLoss:
    """``forward`` of a fairseq cross-entropy criterion that, chunked (``--chunked-loss``, or by
    default where ``chunked_by_default`` says so), scores the decoder's features with its
    ``OutputScorer`` inside ``linear_label_smoothed_nll_loss`` (fairseq's
    ``ignore_prefix_size``, ``sentence_avg``, padding and logs kept)."""

    chunked_loss: bool | None = None  # None: chunked_by_default
    chunked_loss_mb = DEFAULT_MB
    z_loss = 0.0
    # whether fairseq's criterion logs nll_loss: cross_entropy logs its loss only, and with the
    # z-loss the plugin's logs nll_loss there too, the cross-entropy without λ·(log Z)²
    logs_nll_loss = True
    eps = 0.0
    ignore_prefix_size = 0
    report_accuracy = False

    def init_chunked(self, chunked_loss: bool, no_chunked_loss: bool,
                     chunked_loss_mb: float, z_loss: float = 0.0) -> None:
        if not z_loss >= 0:
            raise ValueError(f"--z-loss {z_loss}: give a weight λ ≥ 0 (PaLM's is 1e-4)")
        self.z_loss = z_loss
        if chunked_loss and no_chunked_loss:
            raise ValueError("--chunked-loss and --no-chunked-loss contradict each other: "
                             "give one of them")
        if not chunked_loss_mb > 0:
            raise ValueError(f"--chunked-loss-mb {chunked_loss_mb}: give a positive number of "
                             f"MiB (default {DEFAULT_MB:g})")
        self.chunked_loss = True if chunked_loss else False if no_chunked_loss else None
        self.chunked_loss_mb = chunked_loss_mb

    def chunked(self, model) -> bool:
        """Whether this step takes the chunked loss."""
        if self.chunked_loss is not None:
            return self.chunked_loss
        scorer = getattr(getattr(model, "decoder", None), "scorer", None)
        return scorer is not None and chunked_by_default(scorer.weight.device,
                                                         scorer.weight.shape[0])

    def forward(self, model, sample, reduce=True):
        if not self.chunked(model):
            self._z_term = self._nll = None
            loss, sample_size, logging_output = super().forward(model, sample, reduce)
            if self.z_loss:  # kept by compute_loss, which fairseq's forward calls
                logging_output.update(z_loss=self._z_term, nll_loss=self._nll)
            return loss, sample_size, logging_output
        features, _ = model(**sample["net_input"], features_only=True)
        loss, nll_loss, z_term, n_correct, total = self.loss_from_features(model, features,
                                                                           sample, reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"],
                          "nsentences": sample["target"].size(0), "sample_size": sample_size}
        if self.logs_nll_loss or self.z_loss:
            logging_output["nll_loss"] = nll_loss.data
        if self.z_loss:
            logging_output["z_loss"] = z_term.data.sum()
        if self.report_accuracy:
            logging_output["n_correct"], logging_output["total"] = n_correct, total
        return loss, sample_size, logging_output

    def compute_loss(self, model, net_output, sample, reduce=True):
        """fairseq's loss over the N×V scores, plus the z-loss."""
        loss, nll_loss = super().compute_loss(model, net_output, sample, reduce=reduce)
        if not self.z_loss:
            return loss, nll_loss
        scores = net_output[0][:, self.ignore_prefix_size:]
        target = sample["target"][:, self.ignore_prefix_size:].reshape(-1)
        terms = z_loss_terms(scores.reshape(-1, scores.shape[-1]), target, self.padding_idx,
                             self.z_loss)
        self._z_term, self._nll = terms.data.sum(), nll_loss.data
        return loss + (terms.sum() if reduce else terms.view_as(loss)), nll_loss

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        log_z_loss(logging_outputs)

    def transform(self, scorer) -> Transform | None:
        """(t, t′) of the scorer's layer with its settings; None for an affine layer."""
        layer = scorer.layer
        if not layer.transforms:
            return None
        return (functools.partial(layer.transform, **scorer.settings),
                functools.partial(layer.derivative, **scorer.settings))

    def loss_from_features(self, model, features: Tensor, sample: dict, reduce: bool = True):
        """(loss, nll_loss, z-loss term, n_correct, total) of the decoder output ``features``
        (B, T, H); the counts are None without ``report_accuracy``."""
        scorer = getattr(model.decoder, "scorer", None)
        if scorer is None:
            raise ValueError(
                f"--chunked-loss scores the decoder's features with the plugin's output layer, "
                f"and {type(model.decoder).__name__} has none: use the plugin's --arch "
                "(*_dwt*, *_twwt*, transformer_lm_tied*) or train without --chunked-loss")
        target = sample["target"][:, self.ignore_prefix_size:].reshape(-1)
        hidden = scorer.project(features[:, self.ignore_prefix_size:])
        hidden = hidden.reshape(-1, hidden.shape[-1])
        w_out, bias = scorer.output_matrix_and_bias()
        loss, nll_loss, z_term, n_correct = linear_loss_terms(
            hidden, w_out, bias, target, self.eps, self.padding_idx, reduce,
            self.chunked_loss_mb, self.report_accuracy, self.transform(scorer), self.z_loss)
        if not self.report_accuracy:
            return loss, nll_loss, z_term, None, None
        return (loss, nll_loss, z_term, utils.item(n_correct),
                utils.item(target.ne(self.padding_idx).sum()))
