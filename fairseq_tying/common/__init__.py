"""What the tools share: atomic file writes, pinned CPU kernels, Moses tokenization, and the
plugin's location."""

from pathlib import Path

# The folder to pass as fairseq's --user-dir.
PLUGIN_DIR = str(Path(__file__).resolve().parents[1])
