"""Models and architectures registered with fairseq."""

from fairseq_tying.core.models import dynamicconv_tying, transformer_tying  # noqa: F401
