"""fairseq_tying: input-output embedding tying and normalized output layers for fairseq.

Use it as a fairseq user directory: ``fairseq-train DATA --user-dir fairseq_tying ...``.
Importing the package imports the plugin (``fairseq_tying.core``), which registers the models
and criterions; the tools beside it (data, evaluation, launch, bench, export, ...) are imported
only when used.
"""

import logging

# Importing fairseq.models and fairseq.tasks runs modules that configure logging when imported
# (wav2vec2_classification.py: logging.basicConfig(level=DEBUG), every library's DEBUG records
# on stderr). A handler on the root logger while the plugin imports fairseq makes those calls do
# nothing, and is removed after: importing the package leaves logging as it found it, to the
# host (fairseq's CLIs, an application) or to our commands' entry points (run_main).
_quiet = logging.NullHandler()
logging.root.addHandler(_quiet)
try:
    from fairseq_tying import core  # noqa: F401  (registration)
finally:
    logging.root.removeHandler(_quiet)
