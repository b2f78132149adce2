"""Label-smoothed cross-entropy + Press & Wolf's projection regularization λ‖P‖² (+ the z-loss
of ``--z-loss``), with statistics of the tied matrix's row norms (and the output layer's learned
parameters by name, a vector's mean: fixnorm's gain g, ngpt's sz) logged every update;
``--chunked-loss`` computes the cross-entropy without the N×V scores (``chunked.py``)."""


from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics

from fairseq_tying.core import output_layers
from fairseq_tying.core.criterions.chunked import (
    DEFAULT_MB,
    ChunkedLoss,
    chunked_loss_field,
    chunked_loss_mb_field,
    no_chunked_loss_field,
    z_loss_field,
)

NORM_STATS = ("wnorm_mean", "wnorm_std", "wnorm_min", "wnorm_max")


@dataclass
class ProjectionRegConfig(LabelSmoothedCrossEntropyCriterionConfig):
    projection_reg: float = field(
        default=0.15,
        metadata={"help": "weight λ of the penalty λ‖P‖² on the --tied-projection matrix P"},
    )
    chunked_loss: bool = chunked_loss_field()
    no_chunked_loss: bool = no_chunked_loss_field()
    chunked_loss_mb: float = chunked_loss_mb_field()
    z_loss: float = z_loss_field()


def row_norm_stats(weight: torch.Tensor, padding_idx: int | None) -> dict[str, float]:
    """Mean, std, min and max of ‖w_i‖ over the rows (the padding row excluded)."""
    with torch.no_grad():
        norms = weight.float().norm(dim=-1)
        if padding_idx is not None:
            norms = torch.cat([norms[:padding_idx], norms[padding_idx + 1:]])
        stats = torch.stack([norms.mean(), norms.std(), norms.min(), norms.max()]).tolist()
    return dict(zip(NORM_STATS, stats, strict=True))


@register_criterion("label_smoothed_cross_entropy_pr", dataclass=ProjectionRegConfig)
class LabelSmoothedCrossEntropyPR(ChunkedLoss, LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0,
                 report_accuracy=False, projection_reg=0.15, chunked_loss=False,
                 no_chunked_loss=False, chunked_loss_mb=DEFAULT_MB, z_loss=0.0):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.projection_reg = projection_reg
        self.init_chunked(chunked_loss, no_chunked_loss, chunked_loss_mb, z_loss)

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce)
        scorer = getattr(model.decoder, "scorer", None)
        if scorer is None:
            return loss, sample_size, logging_output
        if scorer.projection is not None and model.training and self.projection_reg > 0:
            # fairseq divides the summed loss by sample_size: scale so the mean gets λ‖P‖².
            penalty = self.projection_reg * scorer.projection.weight.float().pow(2).sum()
            loss = loss + penalty * sample_size
            logging_output["loss"] = loss.data
            logging_output["proj_reg"] = penalty.item()
        padding = model.decoder.embed_tokens.padding_idx
        logging_output.update(row_norm_stats(scorer.weight, padding))
        logging_output.update(scorer.parameter_means())
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        logs = [log for log in logging_outputs if "wnorm_mean" in log]
        if not logs:
            return
        for key, combine in (("wnorm_mean", _mean), ("wnorm_std", _mean),
                             ("wnorm_min", min), ("wnorm_max", max), ("proj_reg", _mean),
                             *((name, _mean) for name in output_layers.parameter_names())):
            values = [log[key] for log in logs if key in log]
            if values:
                metrics.log_scalar(key, combine(values), round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False  # min/max/means are not sums


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
