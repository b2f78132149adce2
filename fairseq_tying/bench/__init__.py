"""What the output layers cost: ``python -m fairseq_tying.bench [--mode MODE] ...``.

- ``layers`` (default, ``layers.py``): training step, beam search and memory of every output
  layer against fairseq's built-in tied Transformer, in one process, as ratios.
- ``serve`` (``serve.py``): a trained checkpoint decoded by fairseq-generate and by CTranslate2
  (float32, int8): speed, agreement and BLEU; a language model scored as fairseq-eval-lm
  scores it and by CTranslate2: speed and perplexity.
- ``loss`` (``loss.py``): peak training memory and step time of fairseq's loss against
  ``--chunked-loss``, by vocabulary size, and the largest batch within a memory budget.
- ``gpu-check`` (``gpu_check.py``): the acceptance run on one CUDA GPU (fp16 training,
  fairseq-generate, CTranslate2 float16, ``layers`` on CUDA); ``make gpu-check``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# imported once chosen: serve needs the serve extra (CTranslate2), gpu-check too unless
# --no-ctranslate2
MODES = {"layers": "layers", "serve": "serve", "loss": "loss", "gpu-check": "gpu_check"}


def main(argv: list[str] | None = None):
    """Dispatch on ``--mode``: the chosen mode's parser reads the remaining arguments and its
    ``run`` takes the parsed options."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--mode", choices=MODES, default="layers")
    known, rest = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    mode = importlib.import_module(f"fairseq_tying.bench.{MODES[known.mode]}")
    return mode.run(mode.parse_args(rest))
