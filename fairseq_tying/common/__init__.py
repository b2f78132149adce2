"""What several of the tools use (and nothing only one of them does): atomic file writes,
generated blocks in Markdown reports, pinned CPU kernels, Moses tokenization, the checkpoint
reader, Markdown tables, a run's evaluation options, the plugin's location and the names of the
files in a run folder."""

from pathlib import Path

# The folder to pass as fairseq's --user-dir.
PLUGIN_DIR = str(Path(__file__).resolve().parents[1])

# fairseq's --task of the language models (the translation models': "translation")
LM_TASK = "language_modeling"

# A test set's documents, beside its references (REFS + this): one name per test sentence, from
# which the answer gives each claim's Δ on each document alone.
DOCS_SUFFIX = ".docs"

# Files of a run folder that several tools read or write.
RUN_JSON = "run.json"  # the launcher's settings of the run (name, method, seed, data_dir, ...)
VALID_HISTORY = "valid_history.json"  # per-epoch validations under the plateau rule
TRAIN_DONE = "train.done"  # written when training ends: the result and why it stopped
CONTINUED_FROM = "continued_from.json"  # the run of another sweep its first epochs come from
RANKS = "ranks"  # ranks/rank{N}.json: what each training process last wrote of its machine
EVAL_JSON = "eval.json"  # the evaluation of the test set; its presence marks the run evaluated
