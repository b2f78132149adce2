"""PNG plots of the across-run views: a metric per method with seed error bars, curves and
bands over training, seed lines (the norm histograms are ``evaluation.norms``'s)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairseq_tying.common.atomic import atomic_write
from fairseq_tying.common.extras import pyplot, require
from fairseq_tying.studies import FOR_WHAT
from fairseq_tying.studies.statistics.cells import Stat

plt = pyplot(FOR_WHAT)
MaxNLocator = require("matplotlib.ticker", "analysis", FOR_WHAT).MaxNLocator


@dataclass
class MethodPoints:
    method: str
    seed_values: list[float]  # the metric of each seed
    mean: float
    ci: float  # NaN for one seed
    baseline: bool = False


def _save(fig, out: str | os.PathLike) -> None:
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    plt.close(fig)


def plot_methods(groups: dict[str, list[MethodPoints]], out: str | os.PathLike,
                 metric: str = "BLEU (sacrebleu)") -> None:
    """One panel per test set: each seed as a dot, the mean with its 95% CI as an error bar."""
    fig, axes = plt.subplots(
        1, len(groups), figsize=(max(4.0, 1.6 * max(len(m) for m in groups.values()) + 2) *
                                 len(groups), 4.2), squeeze=False
    )
    for ax, (title, methods) in zip(axes[0], groups.items(), strict=True):
        x = np.arange(len(methods))
        for i, m in enumerate(methods):
            color = "tab:gray" if m.baseline else "tab:blue"
            jitter = np.linspace(-0.12, 0.12, len(m.seed_values)) if len(m.seed_values) > 1 else [0]
            ax.scatter(i + np.asarray(jitter), m.seed_values, s=14, color=color, alpha=0.5,
                       zorder=2)
            err = None if np.isnan(m.ci) else m.ci
            ax.errorbar(i, m.mean, yerr=err, fmt="o", color=color, capsize=6, markersize=7,
                        zorder=3)
        ax.set_xticks(x, [m.method + (" (baseline)" if m.baseline else "") for m in methods],
                      rotation=20, ha="right")
        ax.set_xlim(-0.5, len(methods) - 0.5)
        ax.set_ylabel(metric)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    name = metric.split(" (")[0]
    fig.suptitle(f"{name[:1].upper()}{name[1:]} per method: seeds (dots), mean ± 95% CI")
    _save(fig, out)


def _panels(panels: dict[str, dict[str, tuple]], out: str | os.PathLike, xlabel: str,
            ylabel: str, title: str, draw: Callable[[Any, int, str, tuple], None],
            integer_x: bool = False, zero_line: bool = False, sharey: bool = True) -> None:
    """One panel per key of ``panels``, sharing the y axis unless not ``sharey``, each with
    its legend; ``draw(ax, k, label, data)`` draws a line in colour ``k``, one colour per label
    in every panel (a panel may lack some labels); ``zero_line``: a line at y = 0."""
    colours = {label: k for k, label in enumerate(
        dict.fromkeys(label for lines in panels.values() for label in lines))}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False,
                             sharey=sharey, layout="constrained")
    for ax, (name, lines) in zip(axes[0], panels.items(), strict=True):
        if zero_line:
            ax.axhline(0.0, color="black", linewidth=0.8)
        for label, data in lines.items():
            draw(ax, colours[label], label, data)
        if integer_x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    _save(fig, out)


def plot_curves(panels: dict[str, dict[str, tuple[Sequence[float], Sequence[float]]]],
                out: str | os.PathLike, xlabel: str, ylabel: str, title: str) -> None:
    """One panel per key, one line per label: ``panels[panel][label] = (x, y)``."""

    def draw(ax, k: int, label: str, data: tuple) -> None:
        ax.plot(*data, marker="o", markersize=3, color=f"C{k}", label=label)

    _panels(panels, out, xlabel, ylabel, title, draw)


def plot_bands(panels: dict[str, dict[str, tuple[Sequence[float], ...]]],
               out: str | os.PathLike, xlabel: str, ylabel: str, title: str,
               zero_line: bool = False, sharey: bool = True) -> None:
    """Like :func:`plot_curves` with a shaded band: ``panels[panel][label] = (x, y, lo, hi)``;
    differences get a ``zero_line``, and panels of different ranges not ``sharey``."""

    def draw(ax, k: int, label: str, data: tuple) -> None:
        x, y, lo, hi = data
        ax.plot(x, y, marker="o", markersize=2, color=f"C{k}", label=label)
        ax.fill_between(x, lo, hi, color=f"C{k}", alpha=0.2, linewidth=0)

    _panels(panels, out, xlabel, ylabel, title, draw, integer_x=True, zero_line=zero_line,
            sharey=sharey)


def plot_bleu_grid(series: dict[str, list[MethodPoints]], out: str | os.PathLike) -> None:
    """One panel: output layers on the x axis, one colour per series (e.g. tying mode); each
    seed as a dot, the mean with its 95% CI as an error bar."""
    layers = list(dict.fromkeys(m.method for points in series.values() for m in points))
    fig, ax = plt.subplots(figsize=(1.5 * len(layers) + 3.5, 4.4))
    width = 0.8 / max(1, len(series))
    for k, (name, points) in enumerate(series.items()):
        color = f"C{k}"
        offset = (k - (len(series) - 1) / 2) * width
        for m in points:
            x = layers.index(m.method) + offset
            ax.scatter([x] * len(m.seed_values), m.seed_values, s=12, color=color, alpha=0.45,
                       zorder=2)
            ax.errorbar(x, m.mean, yerr=None if np.isnan(m.ci) else m.ci, fmt="o", color=color,
                        capsize=4, markersize=6, zorder=3,
                        label=name if m is points[0] else None)
    ax.set_xticks(np.arange(len(layers)), layers)
    ax.set_xlim(-0.5, len(layers) - 0.5)
    ax.set_xlabel("output layer")
    ax.set_ylabel("BLEU (sacrebleu)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="tying", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("BLEU per output layer and tying: seeds (dots), mean ± 95% CI")
    _save(fig, out)


def plot_seed_lines(lines: dict[str, list[tuple[float, float]]], out: str | os.PathLike,
                    xlabel: str, ylabel: str, title: str) -> None:
    """One panel, one colour per label: each ``(x, y)`` point is a seed, joined in x order, so
    that the seeds of one cell read as a slope."""
    fig, ax = plt.subplots(figsize=(7.2, 4.4))
    for k, (label, xy) in enumerate(lines.items()):
        xs, ys = zip(*sorted(xy), strict=True)
        ax.plot(xs, ys, marker="o", markersize=6, linewidth=1, color=f"C{k}", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title)
    _save(fig, out)


def points(label: str, s: Stat, baseline: bool = False) -> MethodPoints:
    """A Stat as the markers of the per-method plots (seeds, mean ± CI)."""
    return MethodPoints(label, list(s.values), s.mean, np.nan if s.ci95 is None else s.ci95,
                        baseline=baseline)
