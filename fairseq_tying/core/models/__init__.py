"""Models and architectures registered with fairseq."""

from fairseq_tying.core.models import (  # noqa: F401
    dynamicconv_tying,
    transformer_lm_tying,
    transformer_tying,
)
