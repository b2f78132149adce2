"""The fairseq plugin: the output layers (scoring.py), the modules that apply them, models
and criterions.

Importing it registers the architectures and the criterion with fairseq and lets ``torch.load``
read fairseq checkpoints with ``weights_only=True``. It imports nothing from the tools
(``fairseq_tying.data``, ``evaluation``, ``launch``, ``bench``, ``export``, ...).
"""

from fairseq_tying.core import checkpoint_compat

checkpoint_compat.allow_fairseq_checkpoints()

from fairseq_tying.core import criterions, models  # noqa: E402,F401  (registration)
