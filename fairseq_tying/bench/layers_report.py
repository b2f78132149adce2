"""The table and the plot of the output layers' costs (:mod:`.layers`): ratios to fairseq's
built-in tied Transformer against the vocabulary size."""

from __future__ import annotations

from pathlib import Path

from fairseq_tying.common import atomic
from fairseq_tying.common.extras import pyplot
from fairseq_tying.core import output_layers

PLOT_FOR = "the figure of python -m fairseq_tying.bench (bench.png)"
BUILTIN = "builtin"
TARGETS = {"train": {output_layers.BASELINE: 1.01, "*": 1.02}, "generate": {"*": 1.005}}


def model_names() -> tuple[str, ...]:
    """What the benchmark compares: fairseq's built-in model, then every registered layer."""
    return (BUILTIN, *output_layers.names())


def table(results: dict) -> str:
    head = (f"{'V':>6} {'output layer':<12} {'train ratio [q1-q3]':>24} "
            f"{'generate ratio [q1-q3]':>24} {'train mem +VxD':>15} {'gen mem +VxD':>13}")
    lines = [head, "-" * len(head)]
    for vocab, res in results.items():
        estimate = ", ".join(f"{n} {r:.3f}" for n, r in res["train_isolated_estimate"].items())
        lines.append(f"{vocab:>6} isolated extra training work, estimated ratio: {estimate}")
        # a file measured before a layer existed has no row for it
        for name in (m for m in model_names() if m in res["train"]):
            cells = []
            for kind in ("train", "generate"):
                r = res[kind][name]["ratio"]
                cells.append(f"{r['median']:.3f} [{r['q1']:.3f}-{r['q3']:.3f}]")
            mem = res.get("memory", {}).get(name)
            mems = [f"{mem[p]['extra_VxD_buffers']:+.2f}" if mem else "-"
                    for p in ("train", "generate")]
            lines.append(f"{vocab:>6} {name:<12} {cells[0]:>24} {cells[1]:>24} "
                         f"{mems[0]:>15} {mems[1]:>13}")
    return "\n".join(lines)


def plot(results: dict, path: Path, title: str) -> None:
    plt = pyplot(PLOT_FOR)

    kinds = ["train", "generate"] + (["memory"] if all("memory" in r for r in results.values())
                                     else [])
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    vocabs = sorted(int(v) for v in results)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for i, name in enumerate(output_layers.names()):
            if name not in results[str(vocabs[0])]["train"]:
                continue
            color = f"C{i}"
            if kind == "memory":
                for phase, style in (("train", "-"), ("generate", ":")):
                    ys = [results[str(v)]["memory"][name][phase]["extra_VxD_buffers"]
                          for v in vocabs]
                    ax.plot(vocabs, ys, style, color=color, marker="o", label=f"{name} ({phase})")
                continue
            if kind == "train":
                est = [results[str(v)]["train_isolated_estimate"][name] for v in vocabs]
                ax.plot(vocabs, est, "x--", color=color, lw=0.8)
            rs = [results[str(v)][kind][name]["ratio"] for v in vocabs]
            med = [r["median"] for r in rs]
            err = [[m - r["q1"] for m, r in zip(med, rs, strict=True)],
                   [r["q3"] - m for m, r in zip(med, rs, strict=True)]]
            ax.errorbar(vocabs, med, yerr=err, marker="o", capsize=3, color=color, label=name)
        if kind == "memory":
            ax.axhline(1.0, color="k", ls="--", lw=0.8, label="target: 1 extra V×D")
            ax.set_ylabel("extra V×D buffers over built-in (peak)")
        else:
            ax.axhline(1.0, color="k", lw=0.8)
            ax.axhline(TARGETS[kind]["*"], color="r", ls="--", lw=0.8, label="target")
            ax.set_ylabel(f"{kind} time / built-in (median, IQR)"
                          + ("; x: isolated estimate" if kind == "train" else ""))
        ax.set_xscale("log", base=2)
        ax.set_xticks(vocabs, [f"{v // 1000}k" for v in vocabs])
        ax.set_xlabel("vocabulary size V")
        ax.set_title(kind)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    atomic.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)
