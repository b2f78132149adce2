"""fairseq_tying: input-output embedding tying and normalized output layers for fairseq.

Use it as a fairseq user directory: ``fairseq-train DATA --user-dir fairseq_tying ...``.
Importing the package registers the models and criterions and lets ``torch.load`` read
fairseq checkpoints with ``weights_only=True``.
"""

from fairseq_tying import checkpoint_compat

checkpoint_compat.allow_fairseq_checkpoints()

from fairseq_tying import criterions, models  # noqa: E402,F401  (registration)
