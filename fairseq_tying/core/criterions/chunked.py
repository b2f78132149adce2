"""The output layer and the loss in one chunked pass (``--chunked-loss``).

Every output layer scores s = h·W_outᵀ + b (core/scoring.py). fairseq's label-smoothed
cross-entropy (``label_smoothed_nll_loss`` over ``log_softmax(s)``) is, per target y,

    nll    = log Z − s_y                       log Z = log Σ_j exp s_j
    smooth = −Σ_j log p_j = V·(log Z − s̄)      s̄ = (1/V)·Σ_j s_j = h·w̄ + b̄
    loss   = (1 − ε − ε_i)·nll + ε_i·smooth    ε_i = ε/(V − 1)

summed over the targets that are not padding (ε = 0: the plain cross-entropy). torch's
``F.linear_cross_entropy`` computes nll over chunks of rows, log Z accumulated in fp32, and never
holds the N×V scores, their log-softmax or their gradients; with log Z = nll + s_y, the smoothing
term needs only s_y and the mean row w̄ and bias b̄: N·D work beside it.
"""

from __future__ import annotations

from dataclasses import field

import torch
import torch.nn.functional as F
from fairseq import utils
from torch import Tensor

OPTIONS = torch.nn.LinearCrossEntropyOptions()  # torch's per-device chunk sizes and accumulation
HALF = (torch.float16, torch.bfloat16)


def chunked_loss_field():
    return field(default=False, metadata={
        "help": "compute the loss from the decoder's features and the output layer's (W_out, b) "
                "in chunks of rows, without the N x V scores (the plugin's models only)"})


def linear_label_smoothed_nll_loss(hidden: Tensor, w_out: Tensor, bias: Tensor | None,
                                   target: Tensor, epsilon: float, ignore_index: int,
                                   reduce: bool = True) -> tuple[Tensor, Tensor]:
    """fairseq's ``label_smoothed_nll_loss(log_softmax(hidden @ w_out.T + bias), target, ...)``
    (loss, nll_loss) in fp32, for ``hidden`` (N, D) and ``target`` (N,)."""
    # The op returns its result in the input's dtype: a half sum over thousands of tokens would
    # be rounded to tens, so half inputs give per-token values (as fairseq's half scores are
    # rounded per token), summed in fp32.
    per_token = not reduce or hidden.dtype in HALF
    nll = F.linear_cross_entropy(hidden, w_out, target, linear_bias=bias,
                                 ignore_index=ignore_index, options=OPTIONS,
                                 reduction="none" if per_token else "sum").float()
    smooth = nll.new_zeros(())
    if epsilon:
        h = hidden.float()
        gap = (h * w_out[target].float()).sum(-1) - h @ w_out.mean(0, dtype=torch.float32)
        if bias is not None:
            gap = gap + bias[target].float() - bias.mean(dtype=torch.float32)
        gap = gap.masked_fill(target.eq(ignore_index), 0.0)  # s_y − s̄ = log Z − s̄ − nll
        smooth = w_out.shape[0] * (nll + (gap if per_token else gap.sum()))
    if reduce and per_token:
        nll, smooth = nll.sum(), smooth.sum()
    eps_i = epsilon / (w_out.shape[0] - 1)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return (loss, nll) if reduce else (loss.unsqueeze(-1), nll.unsqueeze(-1))


def predictions(hidden: Tensor, w_out: Tensor, bias: Tensor | None) -> Tensor:
    """argmax_j s_j per row, in chunks of rows holding no more scores than ``hidden`` numbers."""
    rows = max(1, hidden.numel() // w_out.shape[0])
    with torch.no_grad():
        return torch.cat([F.linear(h, w_out, bias).argmax(-1) for h in hidden.split(rows)])


class ChunkedLoss:
    """``forward`` of a fairseq cross-entropy criterion that, with ``chunked_loss``, scores the
    decoder's features with its ``OutputScorer`` inside ``linear_label_smoothed_nll_loss``
    (fairseq's ``ignore_prefix_size``, ``sentence_avg``, padding and logs kept)."""

    chunked_loss = False
    logs_nll_loss = True  # fairseq's cross_entropy logs its loss only
    eps = 0.0
    ignore_prefix_size = 0
    report_accuracy = False

    def forward(self, model, sample, reduce=True):
        if not self.chunked_loss:
            return super().forward(model, sample, reduce)
        features, _ = model(**sample["net_input"], features_only=True)
        loss, nll_loss, n_correct, total = self.loss_from_features(model, features, sample, reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"],
                          "nsentences": sample["target"].size(0), "sample_size": sample_size}
        if self.logs_nll_loss:
            logging_output["nll_loss"] = nll_loss.data
        if self.report_accuracy:
            logging_output["n_correct"], logging_output["total"] = n_correct, total
        return loss, sample_size, logging_output

    def loss_from_features(self, model, features: Tensor, sample: dict, reduce: bool = True):
        """(loss, nll_loss, n_correct, total) of the decoder output ``features`` (B, T, H); the
        counts are None without ``report_accuracy``."""
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
        loss, nll_loss = linear_label_smoothed_nll_loss(hidden, w_out, bias, target, self.eps,
                                                        self.padding_idx, reduce)
        if not self.report_accuracy:
            return loss, nll_loss, None, None
        mask = target.ne(self.padding_idx)
        n_correct = predictions(hidden[mask], w_out, bias).eq(target[mask]).sum()
        return loss, nll_loss, utils.item(n_correct), utils.item(mask.sum())
