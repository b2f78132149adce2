"""Criterions registered with fairseq."""

from fairseq_tying.core.criterions import (  # noqa: F401
    cross_entropy_tying,
    label_smoothed_cross_entropy_pr,
)
