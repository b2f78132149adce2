"""fairseq_tying: input-output embedding tying and normalized output layers for fairseq.

Use it as a fairseq user directory: ``fairseq-train DATA --user-dir fairseq_tying ...``.
Importing the package imports the plugin (``fairseq_tying.core``), which registers the models
and criterions; the tools beside it (data, evaluation, launch, bench, export, ...) are imported
only when used.
"""

import logging
import os
import sys

# Importing fairseq.models runs fairseq/models/wav2vec/wav2vec2_classification.py, which calls
# logging.basicConfig(level=DEBUG): every library's DEBUG records (matplotlib's, ...) would then
# reach stderr. Configure the root logger first, as fairseq's own CLIs do (same format, LOGLEVEL,
# default INFO), so that call does nothing. A no-op when a CLI (fairseq-train loading this
# package as --user-dir) or the application has configured logging already.
logging.basicConfig(
    format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S",
    level=os.environ.get("LOGLEVEL", "INFO").upper(),
    stream=sys.stderr,
)

from fairseq_tying import core  # noqa: E402,F401  (registration, after the logging set-up)
