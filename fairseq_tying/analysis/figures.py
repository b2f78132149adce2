"""The figures of ``python -m fairseq_tying.analysis``: row norm against token frequency per
matrix, and word-similarity ρ per role and model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fairseq_tying.analysis.measures import BENCHMARKS, ROLES, ModelReport, seen_rows, side_of
from fairseq_tying.common.atomic import atomic_write
from fairseq_tying.common.extras import pyplot


def plot(reports: Sequence[ModelReport], states: dict[str, dict], dicts: dict[str, dict],
         out: Path) -> None:
    plt = pyplot("python -m fairseq_tying.analysis")

    panels = [(r, m) for r in reports for m in r.matrices]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (r, m) in zip(axes.flat, panels, strict=False):
        side = side_of(m.roles, dicts[r.checkpoint])
        matrix = states[r.checkpoint]["model"][m.key].float().numpy()
        keep = seen_rows(matrix, side)
        ax.scatter(side.counts[keep], np.linalg.norm(matrix[keep], axis=1), s=3, alpha=0.4)
        ax.set_xscale("log")
        ax.set_title(f"{r.label}\n{' = '.join(m.roles)}", fontsize=8)
        ax.set_xlabel(f"token frequency in training ({side.label})")
        ax.set_ylabel("row norm ‖w‖")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    _save(fig, out / "norms_vs_frequency.png")

    roles = [role for role, _ in ROLES.values()
             if any(role in m.roles for r in reports for m in r.matrices)]
    fig, axes = plt.subplots(1, len(BENCHMARKS), figsize=(max(6, 1.6 * len(reports)) * 2, 3.8),
                             squeeze=False)
    width = 0.8 / len(roles)
    for ax, name in zip(axes.flat, BENCHMARKS, strict=True):
        for j, role in enumerate(roles):
            values = [next((m.similarity[name]["spearman"] or 0.0 for m in r.matrices
                            if role in m.roles), np.nan) for r in reports]
            offset = (j - (len(roles) - 1) / 2) * width
            ax.bar(np.arange(len(reports)) + offset, values, width, label=role)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xticks(np.arange(len(reports)), [r.label for r in reports], rotation=30,
                      ha="right", fontsize=8)
        ax.set_ylabel(f"{name} Spearman ρ")
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, out / "similarity.png")
    plt.close("all")


def _save(fig, path: Path) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
