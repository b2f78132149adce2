"""The options of one run's evaluation (``python -m fairseq_tying.evaluation evaluate`` and
``evaluate-lm`` without RUN_DIR, parsed by ``evaluation.cli``): what a sweep's
``evaluation.args`` become when the sweep is read, passed to the evaluation job as they are.
Here, not in ``evaluation``, so that reading a sweep file loads no evaluation code."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class EvalOptions:
    """How one run is evaluated (the flags but RUN_DIR): ``data`` and the keyword arguments
    of the evaluation function; what every evaluation of a run takes."""

    data: str | None = None  # None: the data_dir in RUN_DIR/run.json
    subset: str = "test"
    checkpoint: str | None = None
    average_last: int | None = None
    cpu: bool = False
    user_dir: str | None = None
    tag: str | None = None

    def keywords(self) -> dict[str, Any]:
        """The keyword arguments of the evaluation function (all but ``data``)."""
        return {k: v for k, v in asdict(self).items() if k != "data"}


@dataclass(frozen=True)
class TranslationEvalOptions(EvalOptions):
    """``evaluate``'s options: those of ``evaluate_run``."""

    preset: str = "auto"
    beam: int | None = None
    lenpen: float | None = None
    batch_size: int | None = 64
    max_tokens: int | None = None


@dataclass(frozen=True)
class LMEvalOptions(EvalOptions):
    """``evaluate-lm``'s options: those of ``evaluate_lm_run``."""

    max_tokens: int = 4096
