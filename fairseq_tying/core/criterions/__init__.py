"""Criterions registered with fairseq."""

from fairseq_tying.core.criterions import label_smoothed_cross_entropy_pr  # noqa: F401
