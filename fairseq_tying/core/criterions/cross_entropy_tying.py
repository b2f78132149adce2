"""fairseq's ``cross_entropy`` (the language models' criterion; loss logged in base 2) with
``--chunked-loss``: the same loss without the N×V scores (``chunked.py``, ε = 0), and the z-loss
of ``--z-loss``. With the z-loss, the loss optimized and logged as ``loss`` is the cross-entropy
plus λ·(log Z)²; ``nll_loss``, and ``ppl`` from it, are the cross-entropy alone, and ``z_loss``
the term, as ``label_smoothed_cross_entropy_pr`` logs them (fairseq's ``cross_entropy`` derives
``nll_loss`` and ``ppl`` from ``loss``)."""

from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

from fairseq_tying.core.criterions.chunked import (
    DEFAULT_MB,
    ChunkedLoss,
    chunked_loss_field,
    chunked_loss_mb_field,
    log_z_loss,
    no_chunked_loss_field,
    z_loss_field,
)


@dataclass
class CrossEntropyTyingConfig(CrossEntropyCriterionConfig):
    chunked_loss: bool = chunked_loss_field()
    no_chunked_loss: bool = no_chunked_loss_field()
    chunked_loss_mb: float = chunked_loss_mb_field()
    z_loss: float = z_loss_field()


@register_criterion("cross_entropy_tying", dataclass=CrossEntropyTyingConfig)
class CrossEntropyTying(ChunkedLoss, CrossEntropyCriterion):
    logs_nll_loss = False

    def __init__(self, task, sentence_avg, chunked_loss=False, no_chunked_loss=False,
                 chunked_loss_mb=DEFAULT_MB, z_loss=0.0):
        super().__init__(task, sentence_avg)
        self.init_chunked(chunked_loss, no_chunked_loss, chunked_loss_mb, z_loss)

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        if not any("nll_loss" in log for log in logging_outputs):  # no z-loss: fairseq's logs
            super().reduce_metrics(logging_outputs)
            return
        # loss holds λ·(log Z)²: nll_loss and ppl from the nll logged apart, as the label-smoothed
        # criterion logs them (its accuracy needs "total", which these logs lack)
        LabelSmoothedCrossEntropyCriterion.reduce_metrics(logging_outputs)
        log_z_loss(logging_outputs)
