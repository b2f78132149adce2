"""The fairseq plugin: the output layers (output_layers.py, written in scoring.py's row
arithmetic), the modules that apply them, models and criterions.

Importing it registers the architectures, the criterions and the output layers (those of
``FAIRSEQ_TYING_LAYERS`` too) with fairseq and lets ``torch.load`` read fairseq checkpoints with
``weights_only=True``. It imports nothing from the tools (``fairseq_tying.data``,
``evaluation``, ``launch``, ``bench``, ``export``, ...).
"""

from fairseq_tying.core import checkpoint_compat, output_layers

checkpoint_compat.allow_fairseq_checkpoints()
# before fairseq reads --output-layer: the layers of other files are its choices too
output_layers.load_plugins()

from fairseq_tying.core import criterions, models  # noqa: E402,F401  (registration)
