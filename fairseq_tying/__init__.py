"""fairseq_tying: input-output embedding tying and normalized output layers for fairseq.

Use it as a fairseq user directory: ``fairseq-train DATA --user-dir fairseq_tying ...``.
Importing the package imports the plugin (``fairseq_tying.core``), which registers the models
and criterions; the tools beside it (data, evaluation, launch, bench, export, ...) are imported
only when used.
"""

from fairseq_tying import core  # noqa: F401  (registration)
