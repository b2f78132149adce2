"""``norms CKPT... --out PNG``: the tied matrix's row norms from checkpoints, and their
histograms."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fairseq_tying.common import checkpoints
from fairseq_tying.common.atomic import atomic_write
from fairseq_tying.common.extras import pyplot
from fairseq_tying.common.tables import markdown_table
from fairseq_tying.core import names

# The output matrix first (it is the tied matrix under any tying), then the embeddings.
CANDIDATE_KEYS = (names.SCORER_WEIGHT, names.OUTPUT_PROJECTION, names.EMBED_OUT,
                  names.DECODER_EMBED, names.ENCODER_EMBED)
N_SPECIAL = 4  # fairseq dictionaries start with <s>, <pad>, </s>, <unk>
NORMS_PLOT = "the histogram of row norms (python -m fairseq_tying.evaluation norms)"


def find_matrix(model: dict, key: str | None, source: str) -> tuple[str, np.ndarray]:
    if key is not None:
        if key not in model:
            matrices = [k for k, v in model.items() if v.dim() == 2 and "embed" in k]
            raise KeyError(f"--key {key} not in {source}; embedding-like matrices: {matrices}")
        return key, model[key].float().numpy()
    for k in CANDIDATE_KEYS:
        if k in model:
            return k, model[k].float().numpy()
    raise KeyError(f"{source} has none of {CANDIDATE_KEYS}; pass --key")


def row_norms(
    path: str | os.PathLike, key: str | None = None, keep_special: bool = False
) -> tuple[str, np.ndarray]:
    state = checkpoints.load(path)
    found, matrix = find_matrix(state["model"], key, str(path))
    norms = np.linalg.norm(matrix.astype(np.float64), axis=1)
    return found, norms if keep_special else norms[N_SPECIAL:]


def default_label(path: str | os.PathLike) -> str:
    p = Path(path).resolve()
    return f"{p.parent.name}/{p.name}"


def norms_report(
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    labels: Sequence[str] | None = None,
    key: str | None = None,
    keep_special: bool = False,
    bins: int = 50,
) -> str:
    """Write the histogram PNG; return a Markdown table of the norm statistics."""
    pyplot(NORMS_PLOT)  # the histogram needs matplotlib: fail before reading the checkpoints
    if labels and len(labels) != len(paths):
        raise ValueError(f"--labels has {len(labels)} entries for {len(paths)} checkpoints")
    labels = list(labels) if labels else [default_label(p) for p in paths]
    all_norms, rows = [], []
    for path, label in zip(paths, labels, strict=True):
        found, norms = row_norms(path, key, keep_special)
        all_norms.append(norms)
        rows.append([label, found, len(norms), f"{norms.mean():.3f}", f"{norms.std():.3f}",
                     f"{norms.min():.3f}", f"{norms.max():.3f}"])
    plot_norm_histograms(all_norms, labels, out, bins=bins)
    return markdown_table(["checkpoint", "matrix", "rows", "mean", "std", "min", "max"], rows)


def plot_norm_histograms(
    norms: Sequence[np.ndarray], labels: Sequence[str], out: str | os.PathLike, bins: int = 50,
    title: str = "Row norms of the tied embedding matrix",
) -> None:
    """Overlaid histograms of row norms, one per checkpoint."""
    plt = pyplot(NORMS_PLOT)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    lo = min(float(n.min()) for n in norms)
    hi = max(float(n.max()) for n in norms)
    edges = np.linspace(lo, hi if hi > lo else lo + 1e-6, bins + 1)
    for n, label in zip(norms, labels, strict=True):
        ax.hist(n, bins=edges, alpha=0.5, label=f"{label} (mean {n.mean():.2f})",
                histtype="stepfilled", edgecolor="black", linewidth=0.5)
    ax.set_xlabel("L2 norm of embedding row")
    ax.set_ylabel("number of words")
    ax.set_title(title)
    ax.legend()
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    plt.close(fig)
